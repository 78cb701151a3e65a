"""The engine on owned + ghost graphs: a hand-made multi-rank split must reproduce the
single-process reference once ghost forces are folded into their owners."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from _systems import (
    System,
    decompose,
    fcc_argon,
    fcc_argon_222,
    gather,
    lennard_jones,
    local_graph,
    slab_argon,
    triclinic_ar_ne,
)

from nvalchemi_lammps import LocalGraph, ModelSpec, Potential, evaluate
from nvalchemi_lammps.engine import optimize_torchscript
from nvalchemi_lammps.reference import evaluate_reference


class Embedding(Potential):
    """A many-body test potential: ``E_i = -sqrt(rho_i)``, ``rho_i = sum_j w_sj exp(-r)``
    smoothly cut off. Not pairwise, so it checks that nothing in the engine assumes LJ."""

    name = "test_embedding"

    def __init__(self, cutoff: float = 6.0, dtype: str = "float64") -> None:
        super().__init__()
        self.spec = ModelSpec(elements=("Ar", "Ne"), cutoff=cutoff, units="metal", dtype=dtype)
        self.register_buffer("weight", torch.tensor([1.0, 0.6], dtype=self.spec.torch_dtype))

    def config(self) -> dict:
        return {"cutoff": self.spec.cutoff, "dtype": self.spec.dtype}

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        r = torch.linalg.vector_norm(graph.rij, dim=1)
        x = (r / self.spec.cutoff).clamp(max=1.0)
        smooth = (1.0 - x * x) ** 3
        density = self.weight[graph.species[graph.pair_j]] * torch.exp(-r) * smooth
        rho = torch.zeros(graph.ntotal, dtype=r.dtype).index_add(0, graph.pair_i, density)
        return -torch.sqrt(rho + 1e-3)


def _run_ranks(potential, system: System, nranks: int, nslabs: int | None = None):
    graphs = decompose(system, potential.spec.cutoff, nranks, nslabs)
    energies, pair_forces, partial = [], [], 0.0
    for g in graphs:
        result = evaluate(
            potential,
            g.local_graph(),
        )
        assert result.atom_energies.shape == (g.nlocal,)
        assert result.pair_forces.shape == (len(g.pair_i), 3)
        assert result.pair_forces.dtype == torch.float64
        energies.append(result.atom_energies.numpy())
        pair_forces.append(result.pair_forces.numpy())
        partial += result.energy
    gathered = gather(system, graphs, energies, pair_forces)
    assert gathered.energy == pytest.approx(partial, rel=1e-14)
    return graphs, gathered


def _close(actual, expected, rtol=1e-12):
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


SPLITS = [
    (fcc_argon(), 2, None),
    (fcc_argon_222(), 2, None),
    (fcc_argon_222(), 3, None),
    (fcc_argon_222(), 4, 3),
    (triclinic_ar_ne(), 2, None),
    (slab_argon(), 2, None),
]
SPLIT_IDS = [
    "fcc_argon-2",
    "fcc_222-2",
    "fcc_222-3",
    "fcc_222-4-one-empty",
    "triclinic-2",
    "slab-2",
]


@pytest.mark.parametrize(
    "make_potential", [lennard_jones, lambda s: Embedding()], ids=["lj", "embedding"]
)
@pytest.mark.parametrize(("system", "nranks", "nslabs"), SPLITS, ids=SPLIT_IDS)
def test_ranks_reproduce_reference(system, nranks, nslabs, make_potential):
    potential = make_potential(system)
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    graphs, got = _run_ranks(potential, system, nranks, nslabs)
    if nslabs is not None:
        assert any(g.nlocal == 0 for g in graphs)
    # Ghosts carry force before the fold: the split is a real test of ghost handling.
    assert all(g.ntotal > g.nlocal for g in graphs)
    assert got.energy == pytest.approx(ref.energy, rel=1e-12)
    _close(got.atom_energies, ref.atom_energies)
    _close(got.forces, ref.forces)
    _close(got.virial, ref.virial)
    _close(got.atom_virials, ref.atom_virials)


def test_ghost_rows_carry_forces():
    """Without the fold, owned forces alone are wrong: the ghosts' share is essential."""
    system = fcc_argon_222()
    potential = lennard_jones(system)
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    graphs = decompose(system, potential.spec.cutoff, 2)
    g = graphs[0]
    result = evaluate(
        potential,
        g.local_graph(),
    )
    fij = result.pair_forces.numpy()
    local = np.zeros((g.ntotal, 3))
    np.add.at(local, g.pair_i, fij)
    np.add.at(local, g.pair_j, -fij)
    assert np.abs(local[g.nlocal :]).max() > 1e-3 * np.abs(ref.forces).max()


def test_species_minus_one_atoms_are_left_out_by_the_reference():
    """Atoms of types mapped to NULL take part in no pair and keep zero energy and force."""
    system = triclinic_ar_ne()
    potential = lennard_jones(system)
    species = system.species.copy()
    species[[1, 4]] = -1
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, species)
    assert np.all(species[ref.pairs.pair_i] >= 0) and np.all(species[ref.pairs.pair_j] >= 0)
    assert np.all(ref.forces[[1, 4]] == 0.0) and np.all(ref.atom_energies[[1, 4]] == 0.0)
    kept = np.flatnonzero(species >= 0)
    alone = evaluate_reference(
        potential, system.positions[kept], system.cell, system.pbc, species[kept]
    )
    _close(ref.forces[kept], alone.forces)
    assert ref.energy == pytest.approx(alone.energy, rel=1e-13)


# --- edge cases ---------------------------------------------------------------------------


def _empty(n: int, *shape: int, dtype=torch.int64) -> torch.Tensor:
    return torch.zeros((n, *shape), dtype=dtype)


@pytest.mark.parametrize(
    "make_potential", [lennard_jones, lambda s: Embedding()], ids=["lj", "embedding"]
)
@pytest.mark.parametrize(
    ("nlocal", "nghost"),
    [(0, 0), (0, 3), (4, 0), (3, 2)],
    ids=["no-atoms", "ghosts-only", "owned-only", "owned-and-ghosts"],
)
def test_graph_without_pairs(make_potential, nlocal, nghost):
    potential = make_potential(triclinic_ar_ne())
    result = evaluate(
        potential,
        LocalGraph(
            nlocal,
            torch.zeros(nlocal + nghost, dtype=torch.int64),
            _empty(0),
            _empty(0),
            _empty(0, 3, dtype=torch.float64),
        ),
    )
    assert result.atom_energies.shape == (nlocal,)
    assert result.atom_energies.dtype == torch.float64
    assert result.pair_forces.shape == (0, 3) and result.pair_forces.dtype == torch.float64
    if isinstance(potential, Embedding):  # E_i = -sqrt(1e-3) for an isolated atom
        np.testing.assert_allclose(result.atom_energies.numpy(), -np.sqrt(1e-3))
    else:
        assert result.energy == 0.0 and torch.all(result.atom_energies == 0.0)


class Constant(Potential):
    """Energies that depend on no pair vector (per-element reference energies)."""

    name = "test_constant"

    def __init__(self) -> None:
        super().__init__()
        self.spec = ModelSpec(elements=("Ar",), cutoff=3.0, units="metal")

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        return torch.full((graph.ntotal,), -0.25, dtype=torch.float64)


def test_energies_independent_of_pairs_give_zero_forces():
    rij = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]], dtype=torch.float64)
    pairs = torch.tensor([0, 1])
    result = evaluate(
        Constant(), LocalGraph(2, torch.zeros(3, dtype=torch.int64), pairs, pairs.flip(0), rij)
    )
    assert result.energy == -0.5
    assert torch.equal(result.pair_forces, torch.zeros(2, 3, dtype=torch.float64))


def test_float32_potential_returns_float64():
    system = triclinic_ar_ne()
    p32, p64 = Embedding(dtype="float32"), Embedding()
    graphs = decompose(system, p64.spec.cutoff, 2)
    g = graphs[0]
    graph = local_graph(g.nlocal, g.species, g)
    r32, r64 = evaluate(p32, graph), evaluate(p64, graph)
    assert r32.pair_forces.dtype == torch.float64 and r32.atom_energies.dtype == torch.float64
    np.testing.assert_allclose(r32.pair_forces.numpy(), r64.pair_forces.numpy(), atol=1e-6)
    assert r32.energy == pytest.approx(r64.energy, rel=1e-6)


def test_input_tensors_are_not_modified():
    system = fcc_argon()
    potential = lennard_jones(system)
    g = decompose(system, potential.spec.cutoff, 2)[0]
    rij = torch.from_numpy(g.rij.copy())
    evaluate(potential, local_graph(g.nlocal, g.species, g, rij=rij))
    assert np.array_equal(rij.numpy(), g.rij) and not rij.requires_grad


class SeesExecutor(Potential):
    """Records whether TorchScript's optimizing executor is on when it runs, forward and
    backward (through a scripted function, as e3nn's modules inside MACE are)."""

    name = "test_sees_executor"

    def __init__(self) -> None:
        super().__init__()
        self.spec = ModelSpec(elements=("Ar",), cutoff=3.0, units="metal")
        self.square = torch.jit.script(_square)
        self.seen: list[bool] = []

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        self.seen.append(torch._C._get_graph_executor_optimize())
        energy = _Seen.apply(self.square(graph.rij).sum(dim=1), self.seen)
        return torch.zeros(graph.ntotal, dtype=energy.dtype).index_add(0, graph.pair_i, energy)


def _square(x: torch.Tensor) -> torch.Tensor:
    return x * x


class _Seen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seen):
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.seen.append(torch._C._get_graph_executor_optimize())
        return grad, None


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_scripted_code_runs_unoptimized_and_the_setting_is_restored():
    """A rank's pair count changes every step: TorchScript's executor would specialize and
    profile scripted code again and again."""
    potential = SeesExecutor()
    result = evaluate(potential, LocalGraph(*_pair_graph([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])))
    assert potential.seen == [False, False]  # forward, backward
    assert torch._C._get_graph_executor_optimize()
    assert torch.equal(result.pair_forces, torch.tensor([[2.0, 0, 0], [-2.0, 0, 0]]).double())


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_optimized_torchscript_when_asked():
    """``optimize_torchscript(True)`` turns the executor on for every later evaluation (the
    benchmarks' switch), and ``False`` off again."""
    potential = SeesExecutor()
    graph = LocalGraph(*_pair_graph([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]))
    try:
        optimize_torchscript(True)
        evaluate(potential, graph)
    finally:
        optimize_torchscript(False)
    evaluate(potential, graph)
    assert potential.seen == [True, True, False, False]


# --- errors ---------------------------------------------------------------------------------


def _pair_graph(rij: list[list[float]]):
    return (
        2,
        torch.zeros(2, dtype=torch.int64),
        torch.tensor([0, 1]),
        torch.tensor([1, 0]),
        torch.tensor(rij, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"]
)
def test_non_finite_pair_vector_names_the_atoms(bad):
    nlocal, species, pi, pj, rij = _pair_graph([[1.0, 0.0, 0.0], [-1.0, bad, 0.0]])
    potential = lennard_jones(fcc_argon())
    message = "non-finite pair vector between atoms 1 and 0 (NaN or infinite positions)"
    # said when the step's values are read (the one host sync), not before: a front door
    # queues its writes first
    result = evaluate(potential, LocalGraph(nlocal, species, pi, pj, rij))
    with pytest.raises(ValueError, match=re.escape(message)):
        _ = result.finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_pair_vectors_must_be_float64(dtype):
    nlocal, species, pi, pj, rij = _pair_graph([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    with pytest.raises(TypeError, match=re.escape(f"pair vectors must be float64, got {dtype}")):
        evaluate(lennard_jones(fcc_argon()), LocalGraph(nlocal, species, pi, pj, rij.to(dtype)))


class WrongShape(Potential):
    name = "test_wrong_shape"

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows
        self.spec = ModelSpec(elements=("Ar",), cutoff=3.0, units="metal")

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        return graph.rij.sum() * torch.ones(self.rows, dtype=graph.rij.dtype)


@pytest.mark.parametrize("rows", [1, 3], ids=["owned-only", "too-many"])
def test_energies_shape_is_checked(rows):
    _nlocal, species, pi, pj, rij = _pair_graph([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    message = f"potential 'test_wrong_shape' returned energies of shape ({rows},), wanted (2,)"
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate(WrongShape(rows), LocalGraph(1, species, pi, pj, rij))


class WrongReturn(WrongShape):
    name = "test_wrong_return"

    def __init__(self, returns: str) -> None:
        super().__init__(2)
        self.returns = returns

    def forward(self, graph: LocalGraph):
        energies = super().forward(graph)
        if self.returns == "int64":
            return energies.to(torch.int64)
        return energies.tolist() if self.returns == "list" else None


@pytest.mark.parametrize(
    ("returns", "what"),
    [("int64", "a tensor of dtype torch.int64"), ("list", "a list"), ("none", "None")],
    ids=["int64", "list", "none"],
)
def test_energies_type_and_dtype_are_checked(returns, what):
    """Before: int64 energies gave energy 0 and zero forces; a list or None an
    AttributeError about ``shape``."""
    _nlocal, species, pi, pj, rij = _pair_graph([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    message = (
        f"potential 'test_wrong_return' returned {what}: its forward must return a "
        "floating-point torch.Tensor of shape (2,)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate(WrongReturn(returns), LocalGraph(1, species, pi, pj, rij))


@pytest.mark.parametrize("closed_form", [True, False], ids=["pair-terms", "forward"])
def test_non_finite_positions_make_the_evaluation_not_finite(closed_form):
    """An atom at a NaN position is in no pair (LAMMPS's cutoff test drops it), so only its
    position shows it: given positions count in ``finite``. Before: finite."""
    nlocal, species, pi, pj, rij = _pair_graph([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    positions = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [float("nan"), 0.0, 0.0]])
    species = torch.zeros(3, dtype=torch.int64)
    potential = lennard_jones(fcc_argon()) if closed_form else Embedding()
    graph = LocalGraph(nlocal, species, pi, pj, rij, positions=positions.double())
    assert not evaluate(potential, graph).finite
    assert evaluate(potential, dataclasses.replace(graph, positions=positions[:2].double())).finite


def _half(graph, keep: np.ndarray):
    """``graph`` with only the pairs in ``keep``."""
    return dataclasses.replace(
        graph, pair_i=graph.pair_i[keep], pair_j=graph.pair_j[keep], rij=graph.rij[keep]
    )


def _half_list(graph) -> np.ndarray:
    """Which directed pairs of a rank's full list a half list keeps, each pair once over all
    ranks, as LAMMPS's newton rule does: the pair whose receiver has the lower atom ID (for
    an atom and its own periodic image, the image with the positive ``rij``)."""
    gi, gj = graph.owner[graph.pair_i], graph.owner[graph.pair_j]
    dx, dy, dz = graph.rij.T
    positive = (dx > 0) | ((dx == 0) & ((dy > 0) | ((dy == 0) & (dz > 0))))
    return (gi < gj) | ((gi == gj) & positive)


@pytest.mark.parametrize(("system", "nranks", "nslabs"), SPLITS, ids=SPLIT_IDS)
def test_half_pairs_reproduce_reference(system, nranks, nslabs):
    """A pair potential with symmetric pair terms on a half list (each pair once over all
    ranks, ghost senders included): the engine counts each pair for both atoms, the
    energies of ghost rows and the forces folded into their owners give the reference."""
    potential = lennard_jones(system)
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    graphs = [
        _half(g, _half_list(g)) for g in decompose(system, potential.spec.cutoff, nranks, nslabs)
    ]
    energies = np.zeros(system.natoms)
    rows, pair_forces, partial = [], [], 0.0
    for g in graphs:
        result = evaluate(potential, g.local_graph(), pair_scalars=True, half_pairs=True)
        assert result.pair_forces is None
        assert result.atom_energies.shape == (g.ntotal,)  # ghost rows too
        np.add.at(energies, g.owner, result.atom_energies.numpy())
        pair_forces.append(result.pair_scalars.numpy()[:, None] * g.rij)
        rows.append(np.zeros(g.nlocal))
        partial += result.energy
    got = gather(system, graphs, rows, pair_forces)
    assert energies.sum() == pytest.approx(partial, rel=1e-14)
    assert partial == pytest.approx(ref.energy, rel=1e-12)
    _close(energies, ref.atom_energies)
    _close(got.forces, ref.forces)
    _close(got.virial, ref.virial)
    _close(got.atom_virials, ref.atom_virials)


def test_pair_scalars_are_the_pair_forces():
    """Asked for scalars, a potential with a closed form gives ``s`` with ``fij = s * rij``
    exactly (the same product); one without (the many-body test potential) still gives
    pair forces."""
    system = triclinic_ar_ne()
    g = decompose(system, 8.5, 2)[0]
    potential = lennard_jones(system)
    vectors = evaluate(potential, g.local_graph())
    scalars = evaluate(potential, g.local_graph(), pair_scalars=True)
    assert vectors.pair_scalars is None and scalars.pair_forces is None
    assert torch.equal(
        scalars.pair_scalars.unsqueeze(1) * torch.from_numpy(g.rij), vectors.pair_forces
    )
    assert torch.equal(scalars.atom_energies, vectors.atom_energies)
    many_body = evaluate(Embedding(), g.local_graph(), pair_scalars=True)
    assert many_body.pair_scalars is None and many_body.pair_forces.shape == (len(g.pair_i), 3)


def test_half_pairs_need_symmetric_pair_terms():
    """A half list is refused for a potential that does not declare symmetric pair terms,
    and for one that declares them but gives none."""
    g = decompose(fcc_argon_222(), 6.0, 1)[0].local_graph()
    with pytest.raises(ValueError, match=re.escape("needs every directed pair")):
        evaluate(Embedding(), g, half_pairs=True)
    potential = lennard_jones(fcc_argon_222())
    potential.pair_terms = lambda graph: None
    with pytest.raises(ValueError, match=re.escape("declares symmetric pair terms but gave none")):
        evaluate(potential, g, half_pairs=True)


@pytest.mark.parametrize("half", [False, True], ids=["directed", "half"])
def test_energy_without_atom_energies(half):
    """Not asked for per-atom energies, a closed form gives the same energy (the shares'
    sum, twice it on a half list) and no per-atom energies; forces unchanged."""
    system = triclinic_ar_ne()
    g = decompose(system, 8.5, 2)[0]
    graph = (_half(g, _half_list(g)) if half else g).local_graph()
    potential = lennard_jones(system)
    full = evaluate(potential, graph, pair_scalars=True, half_pairs=half)
    bare = evaluate(potential, graph, pair_scalars=True, half_pairs=half, atom_energies=False)
    assert bare.atom_energies is None and full.atom_energies is not None
    assert bare.energy == pytest.approx(full.energy, rel=1e-14)
    assert torch.equal(bare.pair_scalars, full.pair_scalars)
