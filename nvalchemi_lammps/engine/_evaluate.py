from __future__ import annotations

import dataclasses
import itertools
import math
import weakref

import torch

from ..contract import LocalGraph, NoOpComm, Potential
from ._captured import CapturedPotential, PairSink
from ._evaluation import Evaluation, Readback, check_energies, virial_voigt
from ._padding import Seen, seen, unchanged

#: TorchScript's optimizing executor on for a potential's scripted modules: see
#: :func:`optimize_torchscript`
_torchscript_optimized = False


def optimize_torchscript(on: bool) -> None:
    """Run a potential's TorchScript modules (e3nn's inside MACE) with TorchScript's
    optimizing executor, or without it (the default), in every :func:`evaluate` of this
    process from now on.

    Off by default: the executor profiles a scripted graph and specializes it for its input
    shapes, and a rank's pair count changes every step, so the first steps of a run cost 3x
    the later ones on an H200 (measured 2026-12-04). On, later steps of MACE run
    12 fewer torch ops per call (82 before its tensor products split their
    inputs once: most of what the executor's own differentiation saved). Off, the scripted
    modules run their operations as written, differentiated by torch's autograd. Set it
    before the first step: a process that ran a scripted graph optimized keeps running it
    optimized.
    """
    global _torchscript_optimized
    _torchscript_optimized = bool(on)


def _sums(owned: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    """The energy and one sum per gradient, on the energies' device: read back together
    (:class:`~._evaluation.Readback`), they say whether every value is finite in the one
    host sync the energy needs anyway."""
    return torch.stack([owned.sum(), *(g.sum().to(owned.device, owned.dtype) for g in grads)])


def _check_pair_vectors(graph: LocalGraph) -> None:
    """Name the first pair whose vector is not finite (NaN or infinite positions), if any;
    one sum sees any NaN or infinity (pair vectors cannot overflow it)."""
    rij = graph.rij
    if bool(torch.isfinite(rij.sum())) or bool(torch.isfinite(rij).all()):
        return
    bad = int((~torch.isfinite(rij).all(dim=1)).nonzero()[0, 0])
    raise ValueError(
        f"non-finite pair vector between atoms {int(graph.pair_i[bad])} and "
        f"{int(graph.pair_j[bad])} (NaN or infinite positions)"
    )


def _finite_inputs(graph: LocalGraph) -> bool:
    """Whether the pair vectors and the positions (if given) are finite, in one host sync."""
    total = graph.rij.sum()
    if graph.positions is not None:
        total = total + graph.positions.sum().to(total.device)
    return bool(torch.isfinite(total))


def _readback(sums: torch.Tensor | float, graph: LocalGraph, scale: float = 1.0) -> Readback:
    """The energy and finiteness of ``sums``, which include ``graph``'s pair vectors: if
    those are not finite, reading them says which pair."""
    return Readback(sums, scale, lambda: _check_pair_vectors(graph))


def _without_ghosts(graph: LocalGraph, species: torch.Tensor, pair_j: torch.Tensor) -> dict:
    """``graph``'s ``species`` and ``pair_j`` (on the potential's device) with each pair's
    neighbor named by its owner's row and no ghost rows, and the identity for its ``comm``,
    where every ghost is an image of an atom this rank owns (one rank, the exchange
    strategy: :meth:`Comm.local_owners <nvalchemi_lammps.contract.Comm.local_owners>`): the
    periodic system as it is, whose ghost features a potential would only copy from their
    owners. The same energy as a function of the same pair vectors, so the same owned
    energies and pair forces, without ghost rows to compute, exchange, pad or capture.
    Else ``species`` and ``pair_j`` as they are."""
    owners = graph.comm.local_owners(pair_j.device) if graph.comm.exchange else None
    if owners is None:
        return {"species": species, "pair_j": pair_j}
    species, pair_j = _folded.topology(species, pair_j, owners, graph.nlocal)
    return {"species": species, "pair_j": pair_j, "comm": NoOpComm()}


class _Fold:
    """The last folded topology, handed out again while the same tensors, unchanged, come
    (a caller handing the topology again): a captured potential then sees the tensors it
    wrote last time and writes nothing. Kept only while the tensors it was folded from live
    (a front door's, freed after its step, take it along)."""

    def __init__(self) -> None:
        self._given: list[Seen | None] = []
        self._nlocal = -1
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None

    def topology(
        self, species: torch.Tensor, pair_j: torch.Tensor, owners: torch.Tensor, nlocal: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        given = (species, pair_j, owners)
        if (
            self._value is not None
            and nlocal == self._nlocal
            and all(map(unchanged, self._given, given))
        ):
            return self._value
        value = (species[:nlocal], owners.index_select(0, pair_j))
        marks = [seen(t, self._forget) for t in given]
        # inference tensors do not count their writes: folded every time
        kept = None not in marks
        self._given, self._nlocal, self._value = marks, nlocal, value if kept else None
        return value

    def _forget(self, _: weakref.ref) -> None:
        self._given, self._value = [], None


_folded = _Fold()


def potential_device(potential: Potential) -> torch.device:
    """Where the potential's weights live (the CPU for one without any)."""
    # the first weight found is kept (a module's .to() moves it in place): finding it walks
    # the modules, ~30 us per step for MACE
    known = _first_weight.get(potential)
    tensor = None if known is None else known()
    if tensor is None:
        tensor = next(itertools.chain(potential.parameters(), potential.buffers()), None)
        if tensor is None:
            return torch.device("cpu")
        _first_weight[potential] = weakref.ref(tensor)
    return tensor.device


_first_weight: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pair_sink(potential: Potential) -> PairSink | None:
    """Where a front door may write the next step's pairs, folded into owned rows, for
    ``evaluate(..., in_place=sink.generation)``: the buffers of a captured potential whose
    last step had no ghost rows (:class:`~._captured.PairSink`), else ``None``."""
    if not isinstance(potential, CapturedPotential) or potential.eager_reason is not None:
        return None
    return potential.sink()


def takes_half_pairs(potential: Potential) -> bool:
    """A front door may hand ``potential`` each pair once (``evaluate(..., half_pairs=
    True)``): its pair terms are symmetric and the engine uses them."""
    return potential.symmetric_pair_terms and not potential.spec.needs_positions


def evaluate(
    potential: Potential,
    graph: LocalGraph,
    *,
    pair_scalars: bool = False,
    half_pairs: bool = False,
    atom_energies: bool = True,
    in_place: int | None = None,
) -> Evaluation:
    """Run ``potential`` on one rank's graph and differentiate its owned energy.

    The front door fills ``graph`` as LAMMPS stores it: ``rij`` (and ``positions``,
    ``cell``) in float64, on any device. They are moved to the potential's device and cast
    to its dtype here and nowhere else, so gradients come back in float64 whatever the
    potential computes in. Every rank runs the same forward and backward, also with zero
    atoms or pairs, because a potential may issue collectives (``graph.comm``) in both.

    A potential whose spec ``needs_positions`` also gets ``positions`` (owned and ghost
    rows), ``cell``, ``pbc`` and ``charges`` (if any); it is differentiated with respect to
    positions and cell too. Any other potential sees none of them, but ``positions`` given
    for it count in :attr:`Evaluation.finite` (an atom at a NaN position drops out of every
    pair, so only its position shows it), read back with the energy. ``total_charge``,
    ``spin`` and ``task`` describe the whole system (the same on every rank).

    With ``pair_scalars`` the caller takes a pair potential's forces as one scalar per pair
    (:attr:`Evaluation.pair_scalars`, ``fij = s * rij``) when the potential has a closed
    form; any other potential still returns ``pair_forces``.

    With ``half_pairs`` the graph holds each pair once (a half neighbor list with LAMMPS's
    newton rule: ``pair_j`` may be a ghost, and a pair between ranks is on one of them
    only), for a potential that :func:`takes_half_pairs`: each pair is counted for both
    atoms, and the energies come back for every row (:attr:`Evaluation.atom_energies`).

    Without ``atom_energies`` (LAMMPS asks for them on few steps) a closed form gives the
    energy alone, without scattering the pairs' shares onto atoms.

    With ``in_place`` the front door also wrote the graph's pairs, folded (each neighbor as
    its owned row, one rank), and its owned rows' elements into a captured potential's
    buffers (:func:`pair_sink`, the generation it gave): when they are still its buffers
    and hold the graph, the step evaluates them without copying; else it runs as without.
    """
    if half_pairs and not takes_half_pairs(potential):
        raise ValueError(
            f"potential '{potential.name}' needs every directed pair: its pair terms are not "
            "declared symmetric (Potential.symmetric_pair_terms), so no half pair list"
        )
    rij, pair_i, pair_j, nlocal = graph.rij, graph.pair_i, graph.pair_j, graph.nlocal
    if rij.dtype != torch.float64:
        raise TypeError(f"pair vectors must be float64, got {rij.dtype}")
    spec = potential.spec
    if spec.needs_positions and not _finite_inputs(graph):
        # positions may index grids or cells: stop before the potential reads them (else the
        # pair vectors' sum is read back with the energy, see _readback). Non-finite
        # positions come back as a non-finite evaluation: the front door names the atoms.
        _check_pair_vectors(graph)
        return Evaluation(Readback(math.nan), atom_energies=None, pair_forces=None)
    device = potential_device(potential)
    system = {"positions": None, "cell": None, "pbc": None, "charges": None}
    if spec.needs_positions:
        if graph.positions is None or graph.cell is None or graph.pbc is None:
            raise ValueError(
                f"potential '{potential.name}' needs positions, cell and periodicity, which "
                "this front door does not provide"
            )
        system = {
            "positions": graph.positions.detach().to(device, torch.float64),
            "cell": graph.cell.detach().to(device, torch.float64),
            "pbc": tuple(bool(p) for p in graph.pbc),
            "charges": None
            if graph.charges is None
            else graph.charges.detach().to(device, torch.float64),
        }
    given = graph
    # what else must be finite, read back with the energy
    checked = [] if given.positions is None else [given.positions.detach()]
    # the graph on the potential's device, in float64 as the front door gave it
    topology = {
        "species": graph.species.to(device, non_blocking=True),
        "pair_j": pair_j.to(device, non_blocking=True),
    }
    sink = None if in_place is None else pair_sink(potential)
    if (
        sink is not None
        and (sink.generation, sink.nlocal) == (in_place, nlocal)
        and graph.npairs <= sink.capacity
    ):
        n = graph.npairs  # the pairs the door wrote there, as _without_ghosts folds them
        pair_i, rij = sink.pair_i[:n], sink.rij[:n]
        topology = {"species": sink.species[:nlocal], "pair_j": sink.pair_j[:n], "comm": NoOpComm()}
    elif not (spec.needs_positions or half_pairs):
        topology = _without_ghosts(graph, **topology)
    graph = dataclasses.replace(
        graph,
        pair_i=pair_i.to(device, non_blocking=True),
        rij=rij.detach().to(device, non_blocking=True),
        total_charge=float(graph.total_charge),
        **topology,
        **system,
    )
    if isinstance(potential, CapturedPotential) and potential.eager_reason is None:
        # the whole evaluation as one replay (None: it runs eagerly after all)
        with torch.jit.optimized_execution(_torchscript_optimized):
            result = potential.evaluation(graph, checked, lambda sums: _readback(sums, given))
        if result is not None:
            return result
    dtype = spec.torch_dtype
    leaf = graph.rij.requires_grad_(True)
    leaves = [leaf]
    if spec.needs_positions:
        position_leaf = graph.positions.requires_grad_(True)
        cell_leaf = graph.cell.requires_grad_(True)
        leaves += [position_leaf, cell_leaf]
        system = {
            "positions": position_leaf.to(dtype),
            "cell": cell_leaf.to(dtype),
            "charges": None if graph.charges is None else graph.charges.to(dtype),
        }
    graph = dataclasses.replace(graph, rij=leaf.to(dtype), **system)
    if not spec.needs_positions:
        with torch.no_grad():
            terms = potential.pair_terms(graph)
        if terms is not None:
            return _from_pair_terms(
                graph,
                leaf.detach(),
                *terms,
                pair_scalars,
                half_pairs,
                atom_energies,
                checked,
                given,
            )
        if half_pairs:
            raise ValueError(
                f"potential '{potential.name}' declares symmetric pair terms but gave none"
            )
    # the calling thread's setting (optimize_torchscript), restored after
    with torch.jit.optimized_execution(_torchscript_optimized):
        energies = potential(graph)
        check_energies(potential, energies, graph.ntotal)
        owned = energies[:nlocal]
        total = owned.sum()
        grads = [None] * len(leaves)
        if total.requires_grad:  # energies that do not depend on any input have no graph
            # on the calling thread, not torch's per-GPU autograd thread: a potential's
            # exchanges call MPI in the backward (LAMMPS's MPI is not initialized for threads),
            # and a graph released by that thread after LAMMPS has finalized its embedded Python
            # aborts the process at exit (seen on the H200 with KOKKOS ML-IAP at 2 ranks)
            with torch.autograd.set_multithreading_enabled(False):
                grads = list(torch.autograd.grad(total, leaves, allow_unused=True))
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    owned = owned.detach().to(torch.float64)
    readback = _readback(_sums(owned, [*grads, leaf.detach(), *checked]), given)
    if not spec.needs_positions:
        return Evaluation(readback, atom_energies=owned, pair_forces=grads[0])
    return Evaluation(
        readback,
        atom_energies=owned,
        pair_forces=grads[0],
        atom_forces=-grads[1],
        virial=virial_voigt(leaves[2], grads[2]),
    )


def _from_pair_terms(
    graph: LocalGraph,
    rij: torch.Tensor,
    pair_energy: torch.Tensor,
    derivative: torch.Tensor,
    scalars: bool,
    half: bool,
    per_atom: bool,
    checked: list[torch.Tensor],
    given: LocalGraph,
) -> Evaluation:
    """The evaluation of a pair potential from its closed form (``Potential.pair_terms``).
    Receivers are owned atoms (the contract), so every pair's share is owned energy; on a
    half list each pair also stands for its reverse, which gives the sender the same share
    and doubles the force (exactly: a power of two). With ``scalars`` the forces stay one
    scalar per pair; a finite scalar times a finite ``rij`` (checked before) is a finite
    force, so the scalars' sum is the finiteness check. Without ``per_atom`` the energy is
    the shares' sum (twice it on a half list)."""
    f64 = torch.float64
    pair_energy = pair_energy.to(f64)
    derivative = derivative.to(f64)
    if half:
        derivative = derivative * 2.0
    rows = None
    if per_atom:
        energies = torch.zeros(graph.ntotal, dtype=f64, device=rij.device)
        energies.index_add_(0, graph.pair_i, pair_energy)
        if half:
            energies.index_add_(0, graph.pair_j, pair_energy)
        rows = energies if half else energies[: graph.nlocal]
    pair_forces = None if scalars else derivative.unsqueeze(1) * rij
    summed = pair_energy if rows is None else rows
    sums = _sums(summed, [derivative if scalars else pair_forces, rij, *checked])
    # each share stands for both atoms' (exact: a power of two)
    scale = 2.0 if rows is None and half else 1.0
    return Evaluation(
        _readback(sums, given, scale),
        atom_energies=rows,
        pair_forces=pair_forces,
        pair_scalars=derivative if scalars else None,
    )
