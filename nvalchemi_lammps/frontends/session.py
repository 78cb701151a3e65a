"""One model loaded for one LAMMPS pair style on one rank: the session every front door
uses (``pair_style nvalchemi`` and ``nvalchemi/kk`` through cpp_bridge/, ``mliap unified``).

A :class:`Session` loads the model file, resolves the strategy, sets the system state, the
compile mode and the device, runs the checks LAMMPS asks for at setup, keeps the timing hook
and the copies between LAMMPS's host arrays and the model's device. A front door reads
LAMMPS's arrays into a :class:`~nvalchemi_lammps.contract.LocalGraph`, evaluates it with
:func:`~nvalchemi_lammps.engine.evaluate` on :attr:`Session.potential` and writes back
through :mod:`._write_back`; no door imports another.

Public hooks for tools that drive LAMMPS in this interpreter: :func:`opened_sessions` and
:attr:`Session.timings`.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
import weakref
from dataclasses import replace
from pathlib import Path

import torch

from .._elements import map_elements
from .._model_file import LoadedModel, ModelFileWarning, open_model
from .._torch_blas import blas_library
from ..contract import REPORT_ENV, Potential, resolve_strategy
from ..engine import (
    CapturedPotential,
    CompiledPotential,
    Readback,
    capture_potential,
    compile_potential,
    potential_device,
    takes_half_pairs,
)

__all__ = ["Phases", "Session", "Staging", "open_on", "opened_sessions", "select_device"]


class Session:
    """One loaded model inside one LAMMPS pair style instance on one rank.

    :param path: the model file (``nvalchemi-lammps export``)
    :param num_threads: LAMMPS's thread count per rank (torch's intra-op threads)
    :param device: ``cpu``, ``cuda`` (one GPU per rank by ``local_rank``) or ``cuda:N``
    :param local_rank: this rank's number among the ranks of its node
    """

    def __init__(
        self, path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
    ) -> None:
        target = select_device(device, local_rank)
        started = time.perf_counter()
        loaded = open_on(path, target)
        #: seconds the file took to open on its device (read, the network built, its weights
        #: moved and converted there; 0 for the file opened last, unchanged: the same model)
        self.open_seconds = time.perf_counter() - started
        self._hold(loaded.potential, str(path), target)
        # what the ranks compare at init: the same model everywhere
        self.digest, self.digest_verified = loaded.digest, loaded.verified
        # LAMMPS's own thread count per rank (OMP_NUM_THREADS / -pk omp); torch's default
        # of one thread per core oversubscribes the cores shared by several ranks.
        torch.set_num_threads(max(1, num_threads))

    @classmethod
    def from_potential(cls, potential: Potential) -> Session:
        """A session for a potential already in hand (``pair_style mliap unified``: LAMMPS
        unpickled it), on the potential's device; torch's thread count and the device are
        left to whoever made it (ML-IAP)."""
        session = cls.__new__(cls)
        session.open_seconds = 0.0
        session._hold(potential, "", potential_device(potential))
        session.digest, session.digest_verified = None, False  # no file read
        return session

    def _hold(self, potential: Potential, path: str, device: torch.device) -> None:
        """What every session holds: ``potential`` on ``device``, its strategy (``auto``
        until the pair style asks), no system state, no timings; registered."""
        self.path = path
        self.potential = potential
        self.device = device
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
        self.stage = Staging(self.device)
        #: a step of ``nvalchemi/kk`` whose energy and finiteness were left for the next
        #: step to read (LAMMPS read nothing of it): its readback and LAMMPS's step
        self.unread: tuple[Readback, int] | None = None
        #: Seconds per phase of a step (``topology``, ``positions``, ``filter``, ``model``,
        #: ``forces``; CUDA-synchronized at each mark) and inside collectives
        #: (``collectives``, part of ``model``), added up while a benchmark sets a dict here:
        #: the public timing hook (:func:`opened_sessions` finds the session).
        self.timings: dict[str, float] | None = None
        _OPENED.append(weakref.ref(self))

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host tensor of ``shape`` reused under ``name`` (pinned for a GPU), for the
        exchange plan's transfers between ranks."""
        return self.stage.buffer(name, shape, dtype)

    def describe(self) -> str:
        spec = self.potential.spec
        return (
            f"{self.potential.name} model: elements {' '.join(spec.elements)}, "
            f"cutoff {spec.cutoff:g}, units {spec.units}, {spec.dtype}, on {self.device}, "
            f"opened in {self.open_seconds:.2f} s, BLAS of {_blas_name()}"
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

    def set_capture(self, mode: str) -> str:
        """Capture the model's forward and backward as CUDA graphs on graphs padded to
        capacities, replayed every step (``pair_style ... capture yes|no``; ``auto``, the
        default: on a GPU, unless ``compile`` is given). Returns what runs captured, for
        LAMMPS's log ("" when nothing is worth saying: ``auto`` on the CPU).

        ``yes`` on the CPU runs the same padded buffers without graphs (what the tests of
        the capture logic run).

        :raises ValueError: an unknown mode; ``yes`` with ``compile`` (whose
            ``reduce-overhead`` captures graphs of its own) or for a model that cannot run
            on padded graphs
        """
        if mode not in ("auto", "yes", "no"):
            raise ValueError(f"capture must be yes, no or auto; got '{mode}'")
        compiling = bool(self._compiled())
        if mode == "yes" and compiling:
            raise ValueError(
                "capture yes and compile exclude each other: compile reduce-overhead captures "
                "CUDA graphs of its own"
            )
        gpu = self.device.type == "cuda"
        if mode == "no" or compiling or (mode == "auto" and not gpu):
            return "CUDA graphs: off (capture no)" if mode == "no" and gpu else ""
        try:
            self.potential = capture_potential(self.potential)
        except ValueError as cannot:
            if mode == "yes":
                raise ValueError(f"capture yes: {cannot}") from cannot
            return f"CUDA graphs: off, {cannot}"
        captured = ", ".join(_captured_name(m) for m in self._captured())
        eager = [t.name for t in self.potential.parts() if not isinstance(t, CapturedPotential)]
        how = "CUDA graphs" if gpu else "capture on the CPU (padded buffers, no graphs)"
        return f"{how}: {captured}, padded to capacities that grow by 25% when outgrown" + (
            f"; eager: {', '.join(eager)}" if eager else ""
        )

    def compile_status(self) -> tuple[int, int, int, float]:
        """Graphs compiled (``torch.compile``) or captured (CUDA graphs) so far, -1 when
        neither; the atom capacity graphs are padded to and the pair capacity (summed over a
        pipeline's terms); the seconds the captures took (0 for ``torch.compile``, which
        compiles inside the steps)."""
        padded = self._compiled() or self._captured()
        if not padded:
            return -1, 0, 0, 0.0
        return (
            sum(getattr(m, "compilations", 0) + getattr(m, "captures", 0) for m in padded),
            max(m.atom_capacity for m in padded),
            sum(m.pair_capacity for m in padded),
            sum(getattr(m, "capture_seconds", 0.0) for m in padded),
        )

    def eager_after_all(self) -> str:
        """Why captured terms run eagerly after all (decided at their first capture), ""
        when none does."""
        return "; ".join(m.note() for m in self._captured() if m.eager_reason is not None)

    def capture_notes(self) -> str:
        """For the log at the end of a run, what the counts of captures do not say: why
        captured terms run eagerly after all, how many collectives between ranks run
        between the graphs of the others; "" when nothing."""
        return "; ".join(note for m in self._captured() if (note := m.note()))

    def _compiled(self) -> list[CompiledPotential]:
        return [m for m in self.potential.modules() if isinstance(m, CompiledPotential)]

    def _captured(self) -> list[CapturedPotential]:
        return [m for m in self.potential.modules() if isinstance(m, CapturedPotential)]

    @property
    def half_pairs(self) -> bool:
        """The pair style may hand each pair once (a half neighbor list, as ``lj/cut``
        uses): a one-layer model whose pair terms are symmetric
        (:func:`~nvalchemi_lammps.engine.takes_half_pairs`). Read at each ``init_style``,
        after ``strategy`` and ``compile`` are set."""
        return self.layers == 1 and takes_half_pairs(self.potential)

    def map_types(self, names: list[str]) -> list[int]:
        return map_elements(names, self.potential.spec.elements)

    def model_name(self) -> str:
        """The model as messages name it: ``the NAME model (PATH)``."""
        return f"the {self.potential.name} model ({self.path})"


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


class Phases:
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


class Staging:
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


def select_device(device: str, local_rank: int) -> torch.device:
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


_OPENED: list[weakref.ref[Session]] = []

#: the model file opened last in this process, on its device, by what tells the file on
#: disk apart: a pair style made again on the same unchanged file (a script's second
#: ``pair_style``, the benchmark's turns) takes the same potential, and with it what torch
#: compiled for it (MACE's ``compile_blocks``: tens of seconds each time)
_LAST_OPENED: dict[tuple, LoadedModel] = {}


def open_on(path: str, device: torch.device) -> LoadedModel:
    """The model file ``path`` opened, its potential on ``device``: the one opened last if
    that was this file, unchanged, on this device (also for the benchmark's bare model,
    which then runs what the pair style compiled)."""
    try:
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, str(device))
    except OSError:  # open_model says what is wrong with it
        key = None
    if key is not None and key in _LAST_OPENED:
        return _LAST_OPENED[key]
    with warnings.catch_warnings():
        # a file without digest: the pair style says so once, on rank 0
        warnings.simplefilter("ignore", ModelFileWarning)
        loaded = open_model(path)
    loaded = replace(loaded, potential=loaded.potential.to(device))
    _LAST_OPENED.clear()
    if key is not None:
        _LAST_OPENED[key] = loaded
    return loaded


def opened_sessions() -> list[Session]:
    """The sessions opened in this process and still held, oldest first: for tools that
    drive LAMMPS in this interpreter and read a session's :attr:`~Session.timings` or
    :meth:`~Session.compile_status`."""
    return [s for s in (ref() for ref in _OPENED) if s is not None]


def _captured_name(captured: CapturedPotential) -> str:
    """The captured potential's name, and what of it is compiled inside the capture."""
    part = captured.inner.compiled_in_capture
    return f"{captured.name} ({part} under torch.compile)" if part else captured.name
