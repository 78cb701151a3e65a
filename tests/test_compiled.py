"""Potentials under ``torch.compile`` on padded graphs (engine/_compiled.py) against the
same potentials run eagerly: the same energies and pair forces, through exchanges (the
exchange strategy on owned rows, the widened shell), in float32, in a pipeline, with a
graph compiled once for every graph that fits its capacities. MACE's own paths compiled:
tests/test_compiled_mace.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _compiling import (
    ExchangeComm,
    OwnerComm,
    assert_compiled_equals_eager,
    assert_same,
    evaluate_on,
    mace,
    one_rank,
)
from _systems import decompose, decompose_shell, fcc_argon_222, fewer_atoms, triclinic_ar_ne

from nvalchemi_lammps import LocalGraph, MessagePassing, ModelSpec, Pipeline, Potential
from nvalchemi_lammps.contract import NoOpComm
from nvalchemi_lammps.engine import CompiledPotential, compile_potential
from nvalchemi_lammps.reference import evaluate_reference

# every test compiles (seconds to minutes of CPU each): make check leaves them out
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Compiled code is cached per function across instances: each test starts empty, so
    that it counts its own compilations."""
    torch._dynamo.reset()


@pytest.fixture
def aot_eager(monkeypatch):
    """The compiled potential's backend: torch's tracing of the forward and backward
    (AOTAutograd, whose graphs inductor takes) run as traced, without inductor's code
    generation (most of a compilation's CPU), counted as the compiled potential counts:
    for tests of when a graph compiles, not of the code inductor makes of it."""
    backend = torch._dynamo.lookup_backend("aot_eager")

    def counted(self, graph_module, inputs):
        compiled = backend(graph_module, inputs)
        self.compilations += 1
        return compiled

    monkeypatch.setattr(CompiledPotential, "_backend", counted)


def dftd3():
    from nvalchemi_lammps.potentials.dftd3 import DFTD3

    return DFTD3(["Ar", "Ne"], cutoff=6.0, cn_cutoff=5.0)


POTENTIALS = {
    "message_passing": lambda: MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3),
    "mace": mace,
    "dftd3": dftd3,
}


#: the potentials that no other test here compiles through inductor and compares with eager
#: on fcc argon's rank (a compilation each saved): message passing in test_float32 (and with
#: the exchange strategy), Lennard-Jones as the first term of
#: test_pipeline_compiles_term_by_term, MACE in tests/test_compiled_mace.py (and with the
#: exchange strategy)
EAGER_CASES = ["dftd3"]


@pytest.mark.parametrize("name", EAGER_CASES)
def test_compiled_equals_eager(name):
    assert_compiled_equals_eager(POTENTIALS[name]())


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
    assert_same(evaluate_on(compiled, graph, comm), evaluate_on(potential, graph, comm))
    assert comm.calls == 4 * (potential.spec.layers - 1)  # both ran the exchanges

    graph2 = decompose(fewer_atoms(2, seed=2), potential.spec.cutoff, 1)[0]
    assert graph2.nlocal != graph.nlocal and graph2.ntotal != graph.ntotal
    comm2 = ExchangeComm(graph2.owner, graph2.nlocal)
    assert_same(evaluate_on(compiled, graph2, comm2), evaluate_on(potential, graph2, comm2))
    assert compiled.compilations == 1


def test_shell_strategy():
    """Under the widened shell the exchanges are the identity and ghosts compute their
    own features: the compiled model on such a graph equals the eager one."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3)
    graph = decompose_shell(fcc_argon_222(), 5.0, 3, 1)[0]
    want = evaluate_on(potential, graph, NoOpComm())
    assert_same(evaluate_on(CompiledPotential(potential), graph, NoOpComm()), want)


def test_float32():
    """A float32 model compiled: equal to the eager float32 model to float32 rounding
    (fused kernels sum in another order); 1e-5 is 6x the measured 1.8e-6."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3, dtype="float32")
    graph, comm = one_rank(fcc_argon_222(), 5.0)
    want = evaluate_on(potential, graph, comm)
    got = evaluate_on(CompiledPotential(potential), graph, comm)
    diff = float((got.pair_forces - want.pair_forces).abs().max())
    print(f"float32 compiled vs eager: {diff / float(want.pair_forces.abs().max()):.2e}")
    assert_same(got, want, rtol=1e-5)


def test_graphs_within_capacity_do_not_recompile(aot_eager):
    """Message passing compiled: graphs within the capacities reuse the compiled graph, one
    past them compiles another; each equal to eager, the exchanges inside the compiled
    forward and backward. When a graph compiles is settled by the compiled potential's
    capacities and torch's guards on shapes, before the backend: without inductor's code
    generation (message passing through inductor: test_float32, the exchange strategy's
    test, the pipeline's)."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    compiled = CompiledPotential(potential, headroom=0.5)
    graph, comm = one_rank(fcc_argon_222(), 5.0)
    assert_same(evaluate_on(compiled, graph, comm), evaluate_on(potential, graph, comm))
    assert comm.calls == 4 * (potential.spec.layers - 1)  # eager's and the compiled's
    assert compiled.compilations == 1
    capacities = (compiled.atom_capacity, compiled.pair_capacity)
    assert capacities[0] > graph.ntotal and capacities[1] > len(graph.pair_i)

    # fewer atoms and pairs, another nlocal: the same compiled graph
    graph2, comm2 = one_rank(fewer_atoms(3, seed=1), 5.0)
    assert graph2.nlocal != graph.nlocal and len(graph2.pair_i) < len(graph.pair_i)
    assert_same(evaluate_on(compiled, graph2, comm2), evaluate_on(potential, graph2, comm2))
    assert compiled.compilations == 1
    assert (compiled.atom_capacity, compiled.pair_capacity) == capacities

    # a graph past the pair capacity: capacities grow, one more graph compiles
    big, comm3 = one_rank(triclinic_ar_ne(), 5.0)
    dense = decompose(fcc_argon_222().strained(np.eye(3) * -0.2), 5.0, 1)[0]
    assert len(dense.pair_i) > capacities[1]
    assert_same(
        evaluate_on(compiled, dense, OwnerComm(dense.owner, dense.nlocal)),
        evaluate_on(potential, dense, OwnerComm(dense.owner, dense.nlocal)),
    )
    assert compiled.compilations == 2
    assert compiled.pair_capacity > len(dense.pair_i)
    assert_same(evaluate_on(compiled, big, comm3), evaluate_on(potential, big, comm3))
    assert compiled.compilations == 2


def test_padding_rows_are_inert():
    """What the compiled graph sees: padding atoms of species -1 and padding pairs longer
    than the cutoff change neither energies nor the real pairs' gradients."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    graph, comm = one_rank(fcc_argon_222(), 5.0)
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
