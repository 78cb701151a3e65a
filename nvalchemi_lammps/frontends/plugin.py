"""Python side of ``pair_style nvalchemi`` (cpp_bridge/).

The C++ pair style calls :func:`open_session` once per ``pair_style`` command and then the
session's methods. Arrays arrive as writable memoryviews over buffers the pair style owns;
they are wrapped without copying and never kept past the call (what is kept between
neighbor-list builds is copied to the model's device).
"""

from __future__ import annotations

import math

import torch

from ..contract import LocalGraph
from ..engine import evaluate
from ._lammps_comm import ExchangePlan, LammpsComm
from ._step import STEP_PROTOCOL, StepRecord, StepResult
from ._write_back import add_forces, nonfinite_report
from .session import Phases, Session, opened_sessions

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


#: torch's integer type of LAMMPS's atom IDs (``tagint``) by their size in bytes
_TAG_DTYPES = {4: torch.int32, 8: torch.int64}


class PluginSession(Session):
    """The :class:`~.session.Session` of one ``pair_style nvalchemi`` instance on one rank,
    with the step that pair style calls."""

    def __init__(
        self, path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
    ) -> None:
        super().__init__(path, num_threads, device, local_rank)
        self._species: torch.Tensor | None = None
        self._plan: ExchangePlan | None = None
        self._pair_i = self._pair_j = torch.empty(0, dtype=torch.int64)

    def compute(self, step: StepRecord) -> StepResult:
        """One step on one rank: the pair style's :class:`StepRecord` in, the energy and
        what was written back out."""
        nlocal, ntotal, filtered = step.nlocal, step.ntotal, step.filtered
        pair_i_out, pair_j_out, rij_out = step.pair_i, step.pair_j, step.rij
        phase = Phases(self.device, self.timings)
        if step.species is not None:
            npairs = step.npairs
            self._species = self.stage.upload(_tensor(step.species, torch.int64, ntotal))
            self._plan = None
            if step.owner is not None:
                self._plan = ExchangePlan(
                    nlocal,
                    self.stage.upload(_tensor(step.owner, torch.int64, ntotal)),
                    self.stage.upload(_tensor(step.send_rows, torch.int64, step.nsend)),
                    step.nrecv,
                    step.remote,
                )
            if filtered:  # this step's pairs, not kept
                self._pair_i = _tensor(pair_i_out, torch.int64, npairs)
                self._pair_j = _tensor(pair_j_out, torch.int64, npairs)
            else:  # candidates until the next build, int32 when rows fit: half the memory
                index = torch.int32 if ntotal < 2**31 else torch.int64
                self._pair_i = self.stage.upload(_tensor(pair_i_out, torch.int64, npairs), index)
                self._pair_j = self.stage.upload(_tensor(pair_j_out, torch.int64, npairs), index)
        if self._species is None or self._species.shape[0] != ntotal:
            raise RuntimeError("the pair style sent positions without a topology")
        phase("topology")
        x = self.stage.upload(_tensor(step.positions, torch.float64, ntotal, 3), "positions")
        phase("positions")
        pair_i, pair_j = self._pair_i, self._pair_j
        if filtered:
            rij = _tensor(rij_out, torch.float64, pair_i.shape[0], 3)
        else:
            pair_i, pair_j, rij = _within_cutoff(x, pair_i, pair_j, self.cutoff)
        phase("filter")
        # positions for every model: their finiteness is read back with the energy
        inputs = {"positions": x}
        if step.cell is not None:
            charges = step.charges
            inputs = {
                "positions": x,
                "charges": None
                if charges is None
                else self.stage.upload(_tensor(charges, torch.float64, ntotal), "charges"),
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
        if not result.finite:
            tags = _tensor(step.tags, _TAG_DTYPES[step.tag_bytes], ntotal)
            report = nonfinite_report(
                self.model_name(), result, tags, pair_i, pair_j, rij, x, step.timestep
            )
            return StepResult(math.nan, 0, False, False, report)
        if result.atom_energies is not None:
            rows = ntotal if step.half_pairs else nlocal  # ghosts' energies on a half list
            out = _tensor(step.atom_energies, torch.float64, rows)
            self.stage.download(result.atom_energies, out)
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
                self.stage.download(result.pair_scalars, out)
            else:
                out = _tensor(step.pair_forces, torch.float64, npairs, 3)
                self.stage.download(result.pair_forces, out)
            if result.atom_forces is None:
                return StepResult(result.energy, npairs, False, as_scalars)
            atom_forces = result.atom_forces
        else:
            as_scalars = False
            # one row per atom instead of one per pair crosses back to the host
            atom_forces = torch.zeros((ntotal, 3), dtype=torch.float64, device=x.device)
            add_forces(atom_forces, pair_i, pair_j, result)
            npairs = 0
        self.stage.download(atom_forces, _tensor(step.atom_forces, torch.float64, ntotal, 3))
        phase("forces")
        return StepResult(result.energy, npairs, True, as_scalars)


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


def open_session(
    path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
) -> PluginSession:
    """The pair style's entry point: one session per ``pair_style nvalchemi`` command (also
    under ``-sf kk``: the KOKKOS variant's steps go to :func:`.kokkos.compute`)."""
    return PluginSession(path, num_threads, device, local_rank)
