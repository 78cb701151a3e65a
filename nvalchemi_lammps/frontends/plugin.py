"""Python side of ``pair_style nvalchemi`` (cpp_bridge/).

The C++ pair style calls :func:`open_session` once per ``pair_style`` command and then the
session's methods. Arrays arrive as writable memoryviews over buffers the pair style owns;
they are wrapped without copying and never kept past the call (what is kept between
neighbor-list builds is copied to the model's device).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
import weakref
from pathlib import Path

import torch

from .._elements import map_elements
from .._model_file import ModelFileWarning, open_model
from .._torch_blas import blas_library
from ..contract import REPORT_ENV, LocalGraph, resolve_strategy
from ..engine import (
    CompiledPotential,
    Evaluation,
    compile_potential,
    evaluate,
    takes_half_pairs,
)
from ._lammps_comm import ExchangePlan, LammpsComm
from ._step import STEP_PROTOCOL, StepRecord, StepResult

# LammpsComm: the plugin's collectives, for tests that simulate ranks in one process
__all__ = [
    "STEP_PROTOCOL",
    "LammpsComm",
    "PluginSession",
    "StepRecord",
    "StepResult",
    "open_session",
    "opened_sessions",
]


def _tensor(buffer: memoryview, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """The first ``prod(shape)`` values of ``buffer``, without copying."""
    count = math.prod(shape)
    if count == 0:  # torch.frombuffer refuses empty buffers
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)


class PluginSession:
    """One loaded model inside one LAMMPS pair style instance on one rank."""

    def __init__(
        self, path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
    ) -> None:
        self.device = _select_device(device, local_rank)
        with warnings.catch_warnings():
            # a file without digest: the pair style says so once, on rank 0
            warnings.simplefilter("ignore", ModelFileWarning)
            loaded = open_model(path)
        self.potential = loaded.potential.to(self.device)
        # what the ranks compare at init: the same model everywhere
        self.digest, self.digest_verified = loaded.digest, loaded.verified
        spec = self.potential.spec
        self.units = spec.units
        self.elements = list(spec.elements)
        self.needs_positions = bool(spec.needs_positions)
        self.set_strategy("auto")  # cutoff, layers, ghost_cutoff: the decision's
        self.total_charge = 0.0
        self.spin: int | None = None
        self.task: str | None = None
        # the model's tensors on a GPU: the pair style then keeps pairs there between
        # neighbor-list builds and sends positions only
        self.on_device = self.device.type != "cpu"
        self._stage = _Staging(self.device)
        self._species: torch.Tensor | None = None
        self._plan: ExchangePlan | None = None
        self._pair_i = self._pair_j = torch.empty(0, dtype=torch.int64)
        #: Seconds per phase of :meth:`compute` (``topology``, ``positions``, ``filter``,
        #: ``model``, ``forces``; CUDA-synchronized at each mark) and inside collectives
        #: (``collectives``, part of ``model``), added up while a benchmark sets a dict here:
        #: the public timing hook (:func:`opened_sessions` finds the session).
        self.timings: dict[str, float] | None = None
        # LAMMPS's own thread count per rank (OMP_NUM_THREADS / -pk omp); torch's default
        # of one thread per core oversubscribes the cores shared by several ranks.
        torch.set_num_threads(max(1, num_threads))

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host tensor of ``shape`` reused under ``name`` (pinned for a GPU), for the
        exchange plan's transfers between ranks."""
        return self._stage.buffer(name, shape, dtype)

    def describe(self) -> str:
        spec = self.potential.spec
        return (
            f"{self.potential.name} model: elements {' '.join(spec.elements)}, "
            f"cutoff {spec.cutoff:g}, units {spec.units}, {spec.dtype}, on {self.device}, "
            f"BLAS of {_blas_name()}"
        )

    def set_strategy(self, strategy: str) -> None:
        """How ghosts reach past one cutoff (``pair_style ... strategy exchange|shell|auto``),
        decided here once (:func:`~nvalchemi_lammps.contract.resolve_strategy`): the pair
        style reads ``strategy`` back, and the decision is reported where
        :data:`~nvalchemi_lammps.contract.REPORT_ENV` says."""
        decision = resolve_strategy(self.potential.spec, strategy, self.potential.name)
        self.strategy = decision.name
        self.uses_exchange = decision.exchange
        # the cutoffs the pair style reads back, from the one record that decides them
        self.cutoff = decision.cutoff
        self.ghost_cutoff = decision.ghost_cutoff
        self.layers = decision.layers
        folder = os.environ.get(REPORT_ENV)
        if folder:
            _write_json(Path(folder) / f"strategy-{os.getpid()}.json", decision.to_dict())

    def set_system_state(self, charge: float, spin: int, task: str) -> None:
        """The whole system's net charge, spin multiplicity and task (``pair_style ...
        charge Q spin S task NAME``; spin < 0 and an empty task: not given), handed to the
        model every step. Models that predict no charges ignore the charge; a spin or task
        the model cannot take is refused here, before the run."""
        spin_given = None if spin < 0 else int(spin)
        task_given = task or None
        self.potential.check_system_state(spin=spin_given, task=task_given)
        self.total_charge, self.spin, self.task = float(charge), spin_given, task_given

    def check_box(self, periodic: tuple[bool, bool, bool]) -> None:
        """Refuse, at the run's setup on every rank, a box the model cannot run in (its
        periodicity along x, y and z; ``Potential.check_box``), rather than at its first
        step on each rank."""
        self.potential.check_box(tuple(bool(p) for p in periodic))

    def set_compile(self, mode: str) -> str:
        """Run the model under ``torch.compile`` in ``mode`` on graphs padded to fixed
        capacities (``pair_style ... compile MODE``), or eagerly (``no``). Returns what runs
        compiled, for LAMMPS's log ("" when nothing does)."""
        if mode == "no":
            return ""
        self.potential = compile_potential(self.potential, mode)
        compiled = ", ".join(m.name for m in self._compiled())
        parts = self.potential.parts()  # a pipeline's terms
        eager = [t.name for t in parts if not isinstance(t, CompiledPotential)]
        return f"torch.compile ({mode}): {compiled}" + (
            f"; eager: {', '.join(eager)}" if eager else ""
        )

    def compile_status(self) -> tuple[int, int, int]:
        """Graphs compiled so far (-1 when not compiling), the atom capacity graphs are
        padded to and the pair capacity (summed over a pipeline's compiled terms)."""
        compiled = self._compiled()
        if not compiled:
            return -1, 0, 0
        return (
            sum(m.compilations for m in compiled),
            max(m.atom_capacity for m in compiled),
            sum(m.pair_capacity for m in compiled),
        )

    def _compiled(self) -> list[CompiledPotential]:
        return [m for m in self.potential.modules() if isinstance(m, CompiledPotential)]

    @property
    def half_pairs(self) -> bool:
        """The pair style may hand each pair once (a half neighbor list, as ``lj/cut``
        uses): a one-layer model whose pair terms are symmetric
        (:func:`~nvalchemi_lammps.engine.takes_half_pairs`). Read at each ``init_style``,
        after ``strategy`` and ``compile`` are set."""
        return self.layers == 1 and takes_half_pairs(self.potential)

    def map_types(self, names: list[str]) -> list[int]:
        return map_elements(names, self.potential.spec.elements)

    def compute(self, step: StepRecord) -> StepResult:
        """One step on one rank: the pair style's :class:`StepRecord` in, the energy and
        what was written back out."""
        nlocal, ntotal, filtered = step.nlocal, step.ntotal, step.filtered
        pair_i_out, pair_j_out, rij_out = step.pair_i, step.pair_j, step.rij
        phase = _Phases(self.device, self.timings)
        if step.species is not None:
            npairs = step.npairs
            self._species = self._stage.upload(_tensor(step.species, torch.int64, ntotal))
            self._plan = None
            if step.owner is not None:
                self._plan = ExchangePlan(
                    nlocal,
                    self._stage.upload(_tensor(step.owner, torch.int64, ntotal)),
                    self._stage.upload(_tensor(step.send_rows, torch.int64, step.nsend)),
                    step.nrecv,
                    step.remote,
                )
            if filtered:  # this step's pairs, not kept
                self._pair_i = _tensor(pair_i_out, torch.int64, npairs)
                self._pair_j = _tensor(pair_j_out, torch.int64, npairs)
            else:  # candidates until the next build, int32 when rows fit: half the memory
                index = torch.int32 if ntotal < 2**31 else torch.int64
                self._pair_i = self._stage.upload(_tensor(pair_i_out, torch.int64, npairs), index)
                self._pair_j = self._stage.upload(_tensor(pair_j_out, torch.int64, npairs), index)
        if self._species is None or self._species.shape[0] != ntotal:
            raise RuntimeError("the pair style sent positions without a topology")
        phase("topology")
        x = self._stage.upload(_tensor(step.positions, torch.float64, ntotal, 3), "positions")
        phase("positions")
        pair_i, pair_j = self._pair_i, self._pair_j
        if filtered:
            rij = _tensor(rij_out, torch.float64, pair_i.shape[0], 3)
        else:
            pair_i, pair_j, rij = _within_cutoff(x, pair_i, pair_j, self.cutoff)
        phase("filter")
        inputs = {}
        if step.cell is not None:
            charges = step.charges
            inputs = {
                "positions": x,
                "charges": None
                if charges is None
                else self._stage.upload(_tensor(charges, torch.float64, ntotal), "charges"),
                "cell": _tensor(step.cell, torch.float64, 3, 3),
                "pbc": tuple(bool(p) for p in step.periodic),
            }
        graph = LocalGraph(
            nlocal,
            self._species,
            pair_i,
            pair_j,
            rij,
            LammpsComm(
                step.collectives,
                self.uses_exchange,
                plan=self._plan,
                buffer=self.buffer,
                timings=self.timings,
            ),
            total_charge=self.total_charge,
            spin=self.spin,
            task=self.task,
            **inputs,
        )
        # pairs go back: a pair potential's forces as one scalar each, which the pair
        # style multiplies by rij in its force loop (no (npairs, 3) tensor, no copy of one)
        pairs_back = filtered or step.want_pairs
        scalars = pairs_back and step.pair_scalars is not None
        result = evaluate(
            self.potential,
            graph,
            pair_scalars=scalars,
            half_pairs=step.half_pairs,
            atom_energies=step.want_atom_energies,
        )
        phase("model")
        if result.atom_energies is not None:
            rows = ntotal if step.half_pairs else nlocal  # ghosts' energies on a half list
            out = _tensor(step.atom_energies, torch.float64, rows)
            self._stage.download(result.atom_energies, out)
        if step.cell is not None:
            _tensor(step.virial, torch.float64, 6).copy_(result.virial)
        npairs = int(pair_i.shape[0])
        if pairs_back:
            if not filtered:
                _tensor(pair_i_out, torch.int64, npairs).copy_(pair_i)
                _tensor(pair_j_out, torch.int64, npairs).copy_(pair_j)
                _tensor(rij_out, torch.float64, npairs, 3).copy_(rij)
            as_scalars = result.pair_scalars is not None
            if as_scalars:
                out = _tensor(step.pair_scalars, torch.float64, npairs)
                self._stage.download(result.pair_scalars, out)
            else:
                out = _tensor(step.pair_forces, torch.float64, npairs, 3)
                self._stage.download(result.pair_forces, out)
            if result.atom_forces is None:
                return StepResult(_energy(result), npairs, False, as_scalars)
            atom_forces = result.atom_forces
        else:
            as_scalars = False
            # one row per atom instead of one per pair crosses back to the host
            atom_forces = torch.zeros((ntotal, 3), dtype=torch.float64, device=x.device)
            atom_forces.index_add_(0, pair_i, result.pair_forces)
            atom_forces.index_add_(0, pair_j, result.pair_forces, alpha=-1.0)
            if result.atom_forces is not None:
                atom_forces += result.atom_forces
            npairs = 0
        self._stage.download(atom_forces, _tensor(step.atom_forces, torch.float64, ntotal, 3))
        phase("forces")
        return StepResult(_energy(result), npairs, True, as_scalars)


def _energy(result: Evaluation) -> float:
    """The energy for the pair style, NaN when any energy or force is not finite."""
    return result.energy if result.finite else math.nan


def _write_json(path: Path, data: dict) -> None:
    """``data`` to ``path`` whole or not at all (a reader never sees half a file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def _blas_name() -> str:
    """The library torch's float64 matrix multiplies run in (libtorch_cpu.so, not
    liblammps.so: see ``_torch_blas``)."""
    try:
        return os.path.basename(blas_library())
    except (OSError, ValueError, AttributeError, IndexError):  # another platform or build
        return "unknown"


#: Candidate pairs filtered at a time when there are more: bounds the filter's temporaries
#: (about 90 bytes a candidate) to ~1.5 GiB, which at millions of atoms would otherwise take
#: several times the memory of the pairs kept
FILTER_CHUNK = 1 << 24


def _within_cutoff(
    x: torch.Tensor, pair_i: torch.Tensor, pair_j: torch.Tensor, cutoff: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The candidate pairs within ``cutoff`` as int64, and their ``rij = x_j - x_i``, as
    LAMMPS computes them on the host and in its order of operations, so bit-identical. A
    function of its own: the candidates' temporaries are freed before the model runs."""
    cutsq = cutoff * cutoff
    if pair_j.shape[0] <= FILTER_CHUNK:
        rij = x.index_select(0, pair_j) - x.index_select(0, pair_i)
        keep = _inside(rij, cutsq).nonzero()[:, 0]
        return pair_i[keep].long(), pair_j[keep].long(), rij[keep]
    inside = [
        _inside(
            x.index_select(0, pair_j[k : k + FILTER_CHUNK])
            - x.index_select(0, pair_i[k : k + FILTER_CHUNK]),
            cutsq,
        )
        for k in range(0, pair_j.shape[0], FILTER_CHUNK)
    ]
    keep = torch.cat(inside).nonzero()[:, 0]
    pair_i, pair_j = pair_i[keep].long(), pair_j[keep].long()
    return pair_i, pair_j, x.index_select(0, pair_j) - x.index_select(0, pair_i)


def _inside(rij: torch.Tensor, cutsq: float) -> torch.Tensor:
    """Which pair vectors are shorter than the cutoff, tested as LAMMPS tests them."""
    dx, dy, dz = rij.unbind(1)
    return dx * dx + dy * dy + dz * dz < cutsq


class _Phases:
    """Adds the time since the last mark to ``timings[name]`` at each mark, after a CUDA
    synchronization; does nothing without ``timings``."""

    def __init__(self, device: torch.device, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.cuda = device.type == "cuda"
        self.last = self._now() if timings is not None else 0.0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.timings is None:
            return
        now = self._now()
        self.timings[name] = self.timings.get(name, 0.0) + now - self.last
        self.last = now


class _Staging:
    """Copies between LAMMPS's host arrays and the model's device through pinned host
    buffers that grow as needed (plain copies, none at all on the CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self.buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host tensor of ``shape`` reused under ``name`` (pinned for a GPU)."""
        count = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < count:
            capacity = count + count // 4 + 1024  # headroom: lists grow a little
            buffer = torch.empty(capacity, dtype=dtype, pin_memory=self.pinned)
            self.buffers[name] = buffer
        return buffer[:count].view(shape)

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        return self.buffer(name, tuple(like.shape), like.dtype)

    def upload(self, host: torch.Tensor, name: str | torch.dtype | None = None) -> torch.Tensor:
        """``host`` on the device: a copy (in another dtype when ``name`` is one), or
        with a name, through that name's pinned buffer, reused each step (the copy out of
        it has finished before the step ends: the energy synchronizes), and on the CPU
        ``host`` itself."""
        if name is None or isinstance(name, torch.dtype):
            # kept past the call: never a view of LAMMPS's memory
            return host.to(self.device, dtype=name or host.dtype, copy=True)
        if not self.pinned:
            return host.to(self.device)
        staged = self._buffer(name, host)
        staged.copy_(host)
        return staged.to(self.device, non_blocking=True)

    def download(self, device: torch.Tensor, host: torch.Tensor) -> None:
        """Copy ``device`` into the host tensor ``host`` (LAMMPS's memory)."""
        if not self.pinned or device.device.type != "cuda":
            host.copy_(device)
            return
        staged = self._buffer("out", device)
        staged.copy_(device)
        host.copy_(staged)


def _select_device(device: str, local_rank: int) -> torch.device:
    """``cpu``, ``cuda`` (one GPU per rank: node-local rank modulo the visible GPUs, which
    works under mpirun and srun alike), or an explicit ``cuda:N``."""
    if device == "cpu":
        return torch.device("cpu")
    if not device.startswith("cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N; got '{device}'")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {device} requested but torch {torch.__version__} sees no CUDA device"
        )
    if device == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(device)


_OPENED: list[weakref.ref[PluginSession]] = []


def open_session(
    path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
) -> PluginSession:
    """The pair style's entry point: one session per ``pair_style nvalchemi`` command."""
    session = PluginSession(path, num_threads, device, local_rank)
    _OPENED.append(weakref.ref(session))
    return session


def opened_sessions() -> list[PluginSession]:
    """The sessions the pair style opened in this process and still holds, oldest first:
    for tools that drive LAMMPS in this interpreter and read a session's :attr:`timings
    <PluginSession.timings>` or :meth:`~PluginSession.compile_status`."""
    return [s for s in (ref() for ref in _OPENED) if s is not None]
