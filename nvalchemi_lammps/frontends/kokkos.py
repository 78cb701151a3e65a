"""Python side of ``pair_style nvalchemi/kk`` (cpp_bridge/pair_nvalchemi_kokkos.cpp).

The KOKKOS variant of the plugin's pair style loads its model through the same
:class:`~nvalchemi_lammps.frontends.session.Session` (keywords, strategy, checks), and
each step calls :func:`compute` with one :class:`KokkosStepRecord`: DLPack capsules over
arrays in the KOKKOS execution space's memory (host memory for Kokkos's Serial or OpenMP
spaces, GPU memory for CUDA), wrapped by ``torch.from_dlpack`` without a copy. The pair
style's Kokkos kernels take the pairs within the cutoff from KOKKOS's full neighbor list
(cutoff plus skin) each step, with their ``rij`` and each atom's element; the forces (and
per-atom energies and virials, when LAMMPS asks) are added into LAMMPS's own arrays in
place. Nothing per atom or per pair goes through the host, except what LAMMPS's own host
path for pair communication stages (docs/gpus.md). The ghost-feature exchanges go by
the pair style's exchange plan on one rank (a gather by owned row: every ghost is an image
of an owned atom) and on several where KOKKOS would stage them through the host (the
remote atoms' rows once each); through KOKKOS's pair communication otherwise
(:class:`KokkosComm`).

The views are LAMMPS's memory: valid during the call only, never kept.

Synchronization with Kokkos on a GPU: Kokkos's kernels (LAMMPS's before this call, the
exchanges, LAMMPS's next ones reading the forces) run on Kokkos's default instance, a
blocking CUDA stream, which CUDA orders both ways against torch's default (legacy) stream:
on it nothing waits, and the host launches ahead of the GPU. On any other torch stream,
:func:`~._streams.fence` synchronizes the device on entry, around each exchange and before
returning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..contract import LocalGraph
from ..engine import Evaluation, evaluate, pair_sink
from ._lammps_comm import ExchangePlan, PlanComm, exchanged_into, summed_over_ranks
from ._streams import fence
from ._write_back import add_forces, nonfinite_positions, nonfinite_report, pair_virials
from .session import Session

__all__ = [
    "KokkosComm",
    "KokkosStepRecord",
    "KokkosStepResult",
    "check_device",
    "compute",
]


@dataclass(frozen=True)
class KokkosStepRecord:
    """One step on one rank, as the KOKKOS pair style hands it over. The arrays are DLPack
    capsules over LAMMPS's arrays in the execution space's memory (``None``: not given).

    :param nlocal: owned atoms
    :param ntotal: owned and ghost atoms
    :param positions: ``(ntotal, 3)`` positions
    :param tags: ``(ntotal,)`` atom IDs (for messages)
    :param species: ``(ntotal,)`` int64 model element of each atom, -1 for ``NULL`` types
    :param pair_i: ``(npairs,)`` int64 receiver row of each pair within the cutoff (owned
        atoms; with the widened-shell strategy also ghosts)
    :param pair_j: ``(npairs,)`` int64 neighbor row of each pair
    :param rij: ``(npairs, 3)`` float64 ``x_j - x_i``
    :param forces: ``(ntotal, 3)`` LAMMPS's forces, added to in place
    :param atom_energies: ``(nlocal,)``, added to in place (per-atom energies wanted)
    :param atom_virials: ``(ntotal, 6)``, added to in place (per-atom virials wanted)
    :param pair_virial: the pairs' global virial wanted back (LAMMPS does not use f.r)
    :param global_virial: any global virial wanted (f.r, or the pairs')
    :param read_later: LAMMPS reads nothing of this step on the host (no energy, virial,
        output, not the run's last step): its energy and finiteness are read at the next
        step (:func:`compute`)
    :param timestep: LAMMPS's step
    :param sink: the generation of the model's buffers (:class:`KokkosStepResult`'s
        ``sink``) the pair style also wrote this step's pairs into, folded into owned rows,
        or -1
    :param charges: ``(ntotal,)`` per-atom charges, for a model that needs positions
    :param cell: lattice vectors as rows, 9 values
    :param periodic: periodicity of each lattice direction
    :param collectives: the step's KOKKOS collectives (valid during the call only)
    :param one_rank: this is the only rank (every ghost a periodic image of an owned atom)
    :param owners: the pair style's exchange plan (strategy exchange, on one rank, or on
        several when KOKKOS stages pair communication through the host; otherwise not
        given): ``(ntotal,)`` int64, the row of ``[owned rows, received rows]`` each row
        copies (an owned row itself), kept from one neighbor-list build to the next
    :param send_rows: with ``owners`` on several ranks, ``(nsend,)`` int64: the owned rows
        other ranks receive, in the order of the collectives' ``transfer``
    :param nrecv: with ``owners``, the rows ``transfer`` brings from other ranks
    """

    nlocal: int
    ntotal: int
    positions: Any
    tags: Any
    species: Any
    pair_i: Any
    pair_j: Any
    rij: Any
    forces: Any
    atom_energies: Any
    atom_virials: Any
    pair_virial: bool
    global_virial: bool
    read_later: bool
    timestep: int
    sink: int
    charges: Any
    cell: tuple[float, ...]
    periodic: tuple[bool, bool, bool]
    collectives: Any
    one_rank: bool
    owners: Any
    send_rows: Any
    nrecv: int


@dataclass(frozen=True)
class KokkosStepResult:
    """What :func:`compute` returns to the pair style.

    :param energy: this rank's energy
    :param virial: ``xx yy zz xy xz yz`` to add to LAMMPS's global virial (the pairs' when
        ``pair_virial``, plus the part ``sum x . f`` misses for models that need positions),
        or ``None``
    :param sink: where the pair style may write the next step's pairs besides its own
        arrays (the captured model's buffers: :func:`~nvalchemi_lammps.engine.pair_sink`):
        the addresses of ``pair_i``, ``pair_j``, ``rij`` and ``species``, the most pairs
        they take, the owned rows they are laid out for and their generation; or ``None``
    """

    energy: float
    virial: tuple[float, float, float, float, float, float] | None
    sink: tuple[int, int, int, int, int, int, int] | None = None


def _view(capsule: Any) -> torch.Tensor | None:
    return None if capsule is None else torch.from_dlpack(capsule)


class KokkosComm(PlanComm):
    """Collectives of one ``pair_style nvalchemi/kk`` compute call. With the pair style's
    exchange plan (always on one rank; on several when KOKKOS stages pair communication
    through the host) the exchanges go by it (:class:`~._lammps_comm.PlanComm`): on one
    rank a gather and a sum by owned row in the tensor's own precision (one kernel, where
    KOKKOS packs and unpacks per swap), on several the remote atoms' rows once each between
    ranks. Without one, through KOKKOS's pair communication on arrays in the execution
    space's memory (passed by address, no copy to the host). Sums over ranks go through
    MPI on the host (a few values), and are the identity on one rank.

    :param collectives: the pair style's ``KokkosCollectives`` object
    :param device: where LAMMPS's KOKKOS arrays live (rows are exchanged there)
    :param exchange: ``False`` under the widened-shell strategy: the exchanges are the
        identity (the all-reduce stays real)
    :param one_rank: this is the only rank
    :param plan: the exchange plan of the pair style's last neighbor-list build, or ``None``
    :param buffer: ``buffer(name, shape, dtype)``, reusable host tensors (pinned for a GPU)
        for the plan's transfers between ranks
    """

    def __init__(
        self,
        collectives: Any,
        device: torch.device,
        exchange: bool = True,
        one_rank: bool = False,
        plan: ExchangePlan | None = None,
        buffer: Any = None,
    ) -> None:
        super().__init__(collectives, exchange, plan, buffer)
        self.device = device
        self.one_rank = one_rank

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.one_rank else super().allreduce(x)

    def _forward_all(self, src: torch.Tensor) -> torch.Tensor:
        return self._exchanged(self.collectives.forward_exchange, src)

    def _reverse_all(self, src: torch.Tensor) -> torch.Tensor:
        return self._exchanged(self.collectives.reverse_exchange, src)

    def exchange_into(self, src: torch.Tensor, dst: torch.Tensor, forward: bool) -> None:
        plan = self.plan
        if not self.exchange or (plan is not None and plan.remote):
            super().exchange_into(src, dst, forward)
            return
        if plan is not None:  # every row's source is owned here: straight into dst
            exchanged_into(src, dst, plan.gather, forward)
            return
        operation = (
            self.collectives.forward_exchange if forward else self.collectives.reverse_exchange
        )
        if dst.dtype == torch.float64 and dst.device == self.device and dst.is_contiguous():
            dst.copy_(src)  # KOKKOS exchanges dst's own memory: no staging copy
            self._in_place(operation, dst.view(dst.shape[0], math.prod(dst.shape[1:])))
        else:  # copy_ casts the exchanged float64 rows into dst: no third copy
            dst.copy_(self._staged(operation, src).view(dst.shape))

    def _exchanged(self, operation: Any, src: torch.Tensor) -> torch.Tensor:
        return self._staged(operation, src).to(device=src.device, dtype=src.dtype).view(src.shape)

    def _staged(self, operation: Any, src: torch.Tensor) -> torch.Tensor:
        """``src`` exchanged in a float64 copy of its rows, ``(nrows, width)`` in KOKKOS's
        memory (the one type KOKKOS's pair communication carries)."""
        # the width from the shape, not reshape(-1): a rank without atoms has zero rows
        rows = src.detach().reshape(src.shape[0], math.prod(src.shape[1:]))
        rows = rows.to(device=self.device, dtype=torch.float64, copy=True).contiguous()
        self._in_place(operation, rows)
        return rows

    @staticmethod
    def _in_place(operation: Any, rows: torch.Tensor) -> None:
        """KOKKOS's exchange on contiguous float64 ``(nrows, width)`` rows in its memory."""
        if rows.shape[1]:  # the same width on every rank: all call, or none
            fence(rows.device)  # Kokkos's kernels read what torch wrote, then torch theirs
            operation(rows.data_ptr(), int(rows.shape[0]), int(rows.shape[1]))
            fence(rows.device)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return summed_over_ranks(self.collectives, x)


def compute(session: Session, step: KokkosStepRecord) -> KokkosStepResult:
    """One step on one rank: LAMMPS's arrays in, forces (energies, virials) added in place.

    The step's one host sync reads its energy and finiteness, after its writes are queued.
    On a step LAMMPS reads nothing of (``read_later``) that read waits for the next step's
    call, by which time LAMMPS's own syncs have seen the GPU finish: the host goes on
    launching LAMMPS's work (integration, communication) while the model runs. A step that
    was not finite then stops the run at the next one, before anything of it was output
    (every output step is read at once)."""
    nlocal, ntotal = step.nlocal, step.ntotal
    x = _view(step.positions)
    check_device(x.device, session.device)
    fence(x.device)  # torch reads what LAMMPS's kernels wrote
    x = x[:ntotal].to(torch.float64)
    _read_unread(session, step, x)
    species, pair_i, pair_j, rij = (
        _view(a) for a in (step.species, step.pair_i, step.pair_j, step.rij)
    )
    # positions for every model: their finiteness is read back with the energy
    inputs: dict[str, Any] = {"positions": x}
    if session.needs_positions:
        charges = _view(step.charges)
        inputs = {
            "positions": x,
            "charges": None if charges is None else charges[:ntotal].to(torch.float64),
            "cell": torch.tensor(step.cell, dtype=torch.float64).view(3, 3),
            "pbc": tuple(bool(p) for p in step.periodic),
        }
    graph = LocalGraph(
        nlocal,
        species,
        pair_i,
        pair_j,
        rij,
        KokkosComm(
            step.collectives,
            x.device,
            session.uses_exchange,
            step.one_rank,
            _plan(step),
            session.buffer,
        ),
        total_charge=session.total_charge,
        spin=session.spin,
        task=session.task,
        **inputs,
    )
    result = evaluate(session.potential, graph, in_place=step.sink if step.sink >= 0 else None)
    sink = _sink(session)
    # what goes into LAMMPS's arrays is queued before the energy is read (the step's one
    # host sync): the GPU writes it while the host waits. A step that is not finite stops
    # the run, and what it wrote is never used.
    virial = None
    if result.pair_forces is not None:  # else the positions were not finite: nothing ran
        virial = _write_back(step, result, x, pair_i, pair_j, rij)
        if step.read_later:
            session.unread = (result.readback, step.timestep)
            fence(x.device)  # LAMMPS's kernels read the forces next
            return KokkosStepResult(0.0, None, sink)  # LAMMPS takes neither number
    if not result.finite:
        tags = _view(step.tags)[:ntotal]
        raise ValueError(
            nonfinite_report(session.model_name(), result, tags, pair_i, pair_j, rij, x)
        )
    fence(x.device)  # LAMMPS's kernels read the forces next
    return KokkosStepResult(
        result.energy, None if virial is None else tuple(float(v) for v in virial.cpu()), sink
    )


def _sink(session: Session) -> tuple[int, int, int, int, int, int, int] | None:
    """The captured model's buffers for the next step's pairs, as the pair style takes them
    (:attr:`KokkosStepResult.sink`)."""
    sink = pair_sink(session.potential)
    if sink is None:
        return None
    addresses = (t.data_ptr() for t in (sink.pair_i, sink.pair_j, sink.rij, sink.species))
    return (*addresses, sink.capacity, sink.nlocal, sink.generation)


def _write_back(
    step: KokkosStepRecord,
    result: Evaluation,
    x: torch.Tensor,
    pair_i: torch.Tensor,
    pair_j: torch.Tensor,
    rij: torch.Tensor,
) -> torch.Tensor | None:
    """``result``'s forces (per-atom energies and virials, when LAMMPS asks) added into
    LAMMPS's arrays; the global virial to add (``xx yy zz xy xz yz``) or ``None``."""
    nlocal, ntotal = step.nlocal, step.ntotal
    add_forces(_view(step.forces)[:ntotal], pair_i, pair_j, result)
    atom_energies = _view(step.atom_energies)
    if atom_energies is not None:
        atom_energies[:nlocal] += result.atom_energies.to(atom_energies.device)
    virial = None
    atom_virials = _view(step.atom_virials)
    if step.pair_virial or atom_virials is not None:
        per_pair = pair_virials(rij, result.pair_forces)
        if atom_virials is not None:
            half = (0.5 * per_pair).to(atom_virials.dtype)
            atom_virials[:ntotal].index_add_(0, pair_i, half)
            atom_virials[:ntotal].index_add_(0, pair_j, half)
        if step.pair_virial:
            virial = per_pair.sum(dim=0)
    # what f.r of the non-pairwise forces misses, when a global virial is wanted
    if step.global_virial and result.virial is not None:
        extra = result.virial.to(x.device, torch.float64)
        virial = extra if virial is None else virial + extra
    return virial


def _read_unread(session: Session, step: KokkosStepRecord, x: torch.Tensor) -> None:
    """Read the finiteness of the step left unread (``read_later``), if any: one that was
    not finite stops the run now, naming the atoms whose positions are not finite (NaN
    forces make NaN positions), which is all its integration left to see."""
    failed = _unread_failure(session, "the next step")
    if failed is None:
        return
    model = session.model_name()
    now = nonfinite_positions(
        model, _view(step.tags)[: step.ntotal], x, f" at step {step.timestep}"
    )
    raise ValueError(failed + ("" if now is None else f"; {now}"))


def finish(session: Session) -> None:
    """The end of a run (LAMMPS's ``Pair::finish``): read the step left unread, if any (a
    run that ``fix halt`` or ``timer timeout`` ended after a step LAMMPS read nothing of);
    one that was not finite stops LAMMPS here, before the input goes on with its results."""
    failed = _unread_failure(session, "the end of the run")
    if failed is not None:
        raise ValueError(failed)


def _unread_failure(session: Session, when: str) -> str | None:
    """Read the step left unread, if any; what to say if it was not finite (read at
    ``when``), else ``None``."""
    if session.unread is None:
        return None
    (readback, timestep), session.unread = session.unread, None
    if readback.values(name_cause=False)[1]:
        return None
    return (
        f"{session.model_name()} returned non-finite energies or forces at step {timestep} "
        f"(read at {when}: LAMMPS read nothing of step {timestep})"
    )


def _plan(step: KokkosStepRecord) -> ExchangePlan | None:
    owners = _view(step.owners)
    if owners is None:
        return None
    send = _view(step.send_rows)
    send = owners[:0] if send is None else send
    return ExchangePlan(step.nlocal, owners, send, step.nrecv, not step.one_rank)


def check_device(arrays: torch.device, model: torch.device) -> None:
    """Refuse a model on another device than LAMMPS's KOKKOS arrays (an explicit ``device``
    keyword; without one the pair style puts the model where KOKKOS runs)."""
    if arrays != model:
        raise ValueError(
            f"LAMMPS's KOKKOS arrays are on {arrays} but the model is on {model}: leave out "
            f"the keyword device of pair_style nvalchemi (the model then runs where KOKKOS "
            f"runs) or give device {arrays}"
        )
