"""Potentials under ``torch.compile`` on padded graphs (engine/_compiled.py) against the
same potentials run eagerly: the same energies and pair forces, through exchanges, with a
graph compiled once for every graph that fits its capacities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _systems import (
    decompose,
    decompose_shell,
    fcc_argon_222,
    fewer_atoms,
    lennard_jones,
    triclinic_ar_ne,
)

from nvalchemi_lammps import LocalGraph, MessagePassing, ModelSpec, Pipeline, Potential, evaluate
from nvalchemi_lammps.contract import Comm, NoOpComm, with_adjoint
from nvalchemi_lammps.engine import CompiledPotential, compile_potential
from nvalchemi_lammps.reference import evaluate_reference

# every test compiles (seconds to minutes of CPU each): make check leaves them out
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Compiled code is cached per function across instances: each test starts empty, so
    that it counts its own compilations."""
    torch._dynamo.reset()


class OwnerComm(Comm):
    """One rank whose ghosts are periodic images of its own atoms: an exchange copies each
    ghost row from the owned row it images, the reverse sums ghost rows into them."""

    def __init__(self, owner: np.ndarray, nlocal: int) -> None:
        self.owner = torch.from_numpy(owner)
        self.nlocal = nlocal
        self.calls = 0

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return src[self.owner]

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.zeros_like(src).index_add_(0, self.owner, src)

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return with_adjoint(src, self._forward, self._reverse)

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return with_adjoint(src, self._reverse, self._forward)

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _evaluate(potential, graph, comm):
    return evaluate(
        potential,
        graph.local_graph(comm),
    )


def _assert_same(got, want, rtol=1e-12):
    scale = float(want.pair_forces.abs().max())
    assert scale > 0.0
    assert float((got.pair_forces - want.pair_forces).abs().max()) <= rtol * scale
    assert got.energy == pytest.approx(want.energy, rel=rtol)
    energies = want.atom_energies.abs().max()
    assert float((got.atom_energies - want.atom_energies).abs().max()) <= rtol * energies


def _graph(system, cutoff):
    graph = decompose(system, cutoff, 1)[0]
    assert graph.ntotal > graph.nlocal  # ghosts, so exchanges copy something
    return graph, OwnerComm(graph.owner, graph.nlocal)


def _mace():
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(random_mace(), dtype="float64")


def _dftd3():
    from nvalchemi_lammps.potentials.dftd3 import DFTD3

    return DFTD3(["Ar", "Ne"], cutoff=6.0, cn_cutoff=5.0)


POTENTIALS = {
    "lennard_jones": lambda: lennard_jones(fcc_argon_222(), cutoff=6.0),
    "message_passing": lambda: MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3),
    "mace": _mace,
    "dftd3": _dftd3,
}


#: each a compilation less: message passing's case is the first graph of
#: test_graphs_within_capacity_do_not_recompile, Lennard-Jones's the first term of
#: test_pipeline_compiles_term_by_term
EAGER_CASES = [name for name in POTENTIALS if name not in ("message_passing", "lennard_jones")]


@pytest.mark.parametrize("name", EAGER_CASES)
def test_compiled_equals_eager(name):
    potential = POTENTIALS[name]()
    compiled = CompiledPotential(potential)
    graph, comm = _graph(fcc_argon_222(), potential.spec.cutoff)
    want = _evaluate(potential, graph, comm)
    got = _evaluate(compiled, graph, comm)
    _assert_same(got, want)
    if potential.spec.layers > 1:  # the exchanges ran inside the compiled forward and backward
        assert comm.calls == 4 * (potential.spec.layers - 1)
    assert compiled.compilations == 1
    assert compiled.atom_capacity > graph.ntotal and compiled.pair_capacity > len(graph.pair_i)


class ExchangeComm(OwnerComm):
    """The exchange strategy's collectives: ghost rows only ever hold their owners'
    features, so the potentials update owned rows only."""

    exchange = True


@pytest.mark.parametrize("name", ["message_passing", "mace"])  # the ones with layers
def test_exchange_strategy_on_owned_rows(name):
    """With the exchange strategy the compiled potential works on the owned rows, a slice
    of fixed length in the padded graph (owned padding before the ghosts): equal to eager,
    and a graph with other owned and ghost counts within the capacities does not compile
    again."""
    potential = POTENTIALS[name]()
    compiled = CompiledPotential(potential, headroom=0.5)
    graph = decompose(fcc_argon_222(), potential.spec.cutoff, 1)[0]
    comm = ExchangeComm(graph.owner, graph.nlocal)
    _assert_same(_evaluate(compiled, graph, comm), _evaluate(potential, graph, comm))
    assert comm.calls == 4 * (potential.spec.layers - 1)  # both ran the exchanges

    graph2 = decompose(fewer_atoms(2, seed=2), potential.spec.cutoff, 1)[0]
    assert graph2.nlocal != graph.nlocal and graph2.ntotal != graph.ntotal
    comm2 = ExchangeComm(graph2.owner, graph2.nlocal)
    _assert_same(_evaluate(compiled, graph2, comm2), _evaluate(potential, graph2, comm2))
    assert compiled.compilations == 1


def test_shell_strategy():
    """Under the widened shell the exchanges are the identity and ghosts compute their
    own features: the compiled model on such a graph equals the eager one."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3)
    graph = decompose_shell(fcc_argon_222(), 5.0, 3, 1)[0]
    want = _evaluate(potential, graph, NoOpComm())
    _assert_same(_evaluate(CompiledPotential(potential), graph, NoOpComm()), want)


def test_float32():
    """A float32 model compiled: equal to the eager float32 model to float32 rounding
    (fused kernels sum in another order); 1e-5 is 6x the measured 1.8e-6."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3, dtype="float32")
    graph, comm = _graph(fcc_argon_222(), 5.0)
    want = _evaluate(potential, graph, comm)
    got = _evaluate(CompiledPotential(potential), graph, comm)
    diff = float((got.pair_forces - want.pair_forces).abs().max())
    print(f"float32 compiled vs eager: {diff / float(want.pair_forces.abs().max()):.2e}")
    _assert_same(got, want, rtol=1e-5)


def test_graphs_within_capacity_do_not_recompile():
    """Message passing compiled: equal to eager, the exchanges inside the compiled forward
    and backward (test_compiled_equals_eager's checks); graphs within the capacities reuse
    the compiled graph, one past them compiles another."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    compiled = CompiledPotential(potential, headroom=0.5)
    graph, comm = _graph(fcc_argon_222(), 5.0)
    _assert_same(_evaluate(compiled, graph, comm), _evaluate(potential, graph, comm))
    assert comm.calls == 4 * (potential.spec.layers - 1)  # eager's and the compiled's
    assert compiled.compilations == 1
    capacities = (compiled.atom_capacity, compiled.pair_capacity)
    assert capacities[0] > graph.ntotal and capacities[1] > len(graph.pair_i)

    # fewer atoms and pairs, another nlocal: the same compiled graph
    graph2, comm2 = _graph(fewer_atoms(3, seed=1), 5.0)
    assert graph2.nlocal != graph.nlocal and len(graph2.pair_i) < len(graph.pair_i)
    _assert_same(_evaluate(compiled, graph2, comm2), _evaluate(potential, graph2, comm2))
    assert compiled.compilations == 1
    assert (compiled.atom_capacity, compiled.pair_capacity) == capacities

    # a graph past the pair capacity: capacities grow, one more graph compiles
    big, comm3 = _graph(triclinic_ar_ne(), 5.0)
    dense = decompose(fcc_argon_222().strained(np.eye(3) * -0.2), 5.0, 1)[0]
    assert len(dense.pair_i) > capacities[1]
    _assert_same(
        _evaluate(compiled, dense, OwnerComm(dense.owner, dense.nlocal)),
        _evaluate(potential, dense, OwnerComm(dense.owner, dense.nlocal)),
    )
    assert compiled.compilations == 2
    assert compiled.pair_capacity > len(dense.pair_i)
    _assert_same(_evaluate(compiled, big, comm3), _evaluate(potential, big, comm3))
    assert compiled.compilations == 2


def test_padding_rows_are_inert():
    """What the compiled graph sees: padding atoms of species -1 and padding pairs longer
    than the cutoff change neither energies nor the real pairs' gradients."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    graph, comm = _graph(fcc_argon_222(), 5.0)
    species = torch.from_numpy(graph.species)
    rij = torch.from_numpy(graph.rij).requires_grad_(True)
    pad_atoms, pad_pairs = 7, 11
    plain = potential(
        LocalGraph(
            graph.nlocal,
            species,
            torch.from_numpy(graph.pair_i),
            torch.from_numpy(graph.pair_j),
            rij,
            comm,
        )
    )
    (plain_grad,) = torch.autograd.grad(plain[: graph.nlocal].sum(), rij)
    index = torch.full((pad_pairs,), graph.ntotal)
    far = torch.zeros(pad_pairs, 3, dtype=torch.float64)
    far[:, 0] = 11.0
    padded_comm = OwnerComm(
        np.concatenate([graph.owner, graph.ntotal + np.arange(pad_atoms)]), graph.nlocal
    )
    padded = potential(
        LocalGraph(
            graph.nlocal,
            torch.cat([species, torch.full((pad_atoms,), -1)]),
            torch.cat([torch.from_numpy(graph.pair_i), index]),
            torch.cat([torch.from_numpy(graph.pair_j), index]),
            torch.cat([rij, far]),
            padded_comm,
        )
    )
    (padded_grad,) = torch.autograd.grad(padded[: graph.nlocal].sum(), rij)
    assert torch.equal(padded[graph.ntotal :], torch.zeros(pad_atoms, dtype=torch.float64))
    torch.testing.assert_close(padded[: graph.ntotal], plain, rtol=1e-14, atol=0)
    torch.testing.assert_close(padded_grad, plain_grad, rtol=1e-14, atol=1e-18)


class _Plain(Potential):
    name = "plain"

    def __init__(self) -> None:
        super().__init__()
        self.spec = ModelSpec(elements=("Ar",), cutoff=3.0, units="metal", dtype="float64")

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        return graph.rij.new_zeros(graph.ntotal)


def test_cuda_graphs_need_the_unsafe_tag(monkeypatch):
    """Without torch's cudagraph_unsafe tag (torch < 2.9) a CUDA graph would capture the
    exchanges: the modes with CUDA graphs are refused."""
    from nvalchemi_lammps.engine import _compiled

    monkeypatch.setattr(_compiled, "_CUDAGRAPH_UNSAFE", False)
    potential = MessagePassing(["Ar"], cutoff=5.0, layers=2)
    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(ValueError, match=f"compile mode {mode} .CUDA graphs. needs torch"):
            CompiledPotential(potential, mode=mode)
    CompiledPotential(potential, mode="max-autotune-no-cudagraphs")


def test_potential_without_compile_support_is_refused():
    with pytest.raises(ValueError, match="the plain model cannot be compiled"):
        CompiledPotential(_Plain())
    with pytest.raises(ValueError, match="compile mode must be one of"):
        CompiledPotential(MessagePassing(["Ar"], cutoff=5.0, layers=2), mode="fast")


def test_pipeline_compiles_term_by_term():
    """A pipeline's terms with compile support (Lennard-Jones, message passing) are
    compiled one by one (the pipeline picks their pairs eagerly); Ewald, without it, runs
    eagerly between them. The whole equals the eager pipeline on the full periodic system:
    energies, per-atom energies and forces."""
    from test_pipeline import system, terms

    pipeline = Pipeline(terms())
    compiled = compile_potential(pipeline)
    assert [type(t).__name__ for t in compiled.terms] == [
        "CompiledPotential",
        "CompiledPotential",
        "Ewald",
    ]
    positions, cell, species = system(seed=2)
    want = evaluate_reference(pipeline, positions, cell, (True, True, True), species)
    got = evaluate_reference(compiled, positions, cell, (True, True, True), species)
    assert got.energy == pytest.approx(want.energy, rel=1e-12)
    energies = np.abs(want.atom_energies).max()
    assert np.abs(got.atom_energies - want.atom_energies).max() <= 1e-12 * energies
    scale = np.abs(want.forces).max()
    assert np.abs(got.forces - want.forces).max() <= 1e-12 * scale
    assert [t.compilations for t in compiled.terms[:2]] == [1, 1]


def test_pipeline_without_compilable_terms_is_refused():
    from test_pipeline import ewald

    with pytest.raises(ValueError, match="no term of this pipeline can be compiled .ewald."):
        compile_potential(Pipeline([ewald()]))
    with pytest.raises(ValueError, match="compile mode must be one of"):
        compile_potential(Pipeline([ewald()]), mode="fast")


def test_mace_compiled_exchanges_inside_its_blocks(monkeypatch):
    """Compiled, MACE runs its blocks as it does eagerly (test_exchange_strategy_on_owned_rows
    compares the two): exchanging at mace-torch's own hook point after each interaction's
    ``linear_up``, owned rows only, not the whole layers' features in between. (A separate
    compilation: the recording is state the compiled code guards on.) On torch 2.11 the
    comparison of test_exchange_strategy_on_owned_rows fails if the hook goes through
    mace-torch's ``LAMMPS_MP`` (zero gradients into the exchange; mace._handle_lammps_traced).
    What is traced is settled when torch's tracer runs the Python code, before the backend
    sees the graph: the graph runs as traced, without inductor's code generation (most of a
    compilation's CPU, and the rest of this module has it)."""
    from nvalchemi_lammps.potentials.mace import _forward as mace

    def traced_only(self, graph_module, inputs):
        self.compilations += 1
        return graph_module.forward

    monkeypatch.setattr(CompiledPotential, "_backend", traced_only)

    potential = _mace()  # before the recording: its check against mace-torch runs one rank
    paths = []

    def recording(name, run):
        def recorded(*args):
            paths.append(name)  # once, when the compiler traces it
            return run(*args)

        return recorded

    for name in ("_owned_features", "_row_features"):
        monkeypatch.setattr(mace, name, recording(name, getattr(mace, name)))
    graph = decompose(fcc_argon_222(), potential.spec.cutoff, 1)[0]
    compiled = CompiledPotential(potential)
    _evaluate(compiled, graph, ExchangeComm(graph.owner, graph.nlocal))
    assert compiled.compilations == 1
    assert paths == ["_owned_features"]


class CountingComm(Comm):
    """Exchanges as the identity, counted: what a rank of a decomposition calls."""

    exchange = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        self.calls.append("forward")
        return src.clone()

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        self.calls.append("reverse")
        return src.clone()

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_rank_without_pairs_calls_every_exchange():
    """A rank without atoms or pairs (a processors grid with empty ranks) exchanges as often
    compiled as eagerly, as the other ranks do: MACE's exchanged rows feed pairs only, and
    the compiler must not drop an exchange that its graph does not read (it did: the other
    ranks waited for ever)."""
    potential = _mace()
    empty = decompose(fcc_argon_222(), potential.spec.cutoff, 4, nslabs=2)[3]
    assert empty.nlocal == 0 and len(empty.pair_i) == 0 and empty.ntotal > 0
    calls = []
    for run in (potential, CompiledPotential(potential)):
        comm = CountingComm()
        evaluate(run, empty.local_graph(comm))
        calls.append(comm.calls)
    assert calls[0] == calls[1] == ["forward", "reverse"], calls
