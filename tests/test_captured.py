"""Potentials captured on padded graphs (engine/_captured.py) against the same potentials
run eagerly, on the CPU: the static buffers, the padding, the capacities and when they
capture again, the exchanges on one rank inside the captured step, the collectives between
ranks between its graphs (never while capturing), and what runs eagerly after all. (No CUDA
here: the buffers are "replayed" by running the potential on them, the collectives where it
calls them; tests/gpu captures real CUDA graphs, cut at the collectives.)"""

from __future__ import annotations

import dataclasses
import gc
import types

import numpy as np
import pytest
import torch
from _systems import (
    OneRankComm,
    RemoteComm,
    decompose,
    decompose_shell,
    fcc_argon_222,
    fewer_atoms,
    lennard_jones,
)
from torch.utils._python_dispatch import TorchDispatchMode

from nvalchemi_lammps import MessagePassing, ModelSpec, Pipeline, Potential, evaluate
from nvalchemi_lammps.contract import NoOpComm
from nvalchemi_lammps.engine import CapturedPotential, capture_potential, pair_sink
from nvalchemi_lammps.engine._captured import _Step
from nvalchemi_lammps.engine._evaluate import _folded
from nvalchemi_lammps.frontends.session import Session


def _mace():
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(random_mace(), dtype="float64")


def _dftd3():
    from nvalchemi_lammps.potentials.dftd3 import DFTD3

    return DFTD3(["Ar", "Ne"], cutoff=6.0, cn_cutoff=5.0)


POTENTIALS = {
    "message_passing": lambda: MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3),
    "mace": _mace,
    "dftd3": _dftd3,
}


def _graph(system, cutoff, comm_type=OneRankComm, exchange=True):
    rank = decompose(system, cutoff, 1)[0]
    assert rank.ntotal > rank.nlocal  # ghosts, so exchanges copy something
    return rank.local_graph(comm_type(rank.owner, exchange))


def _assert_same(got, want, rtol=1e-12):
    scale = float(want.pair_forces.abs().max())
    assert scale > 0.0
    assert float((got.pair_forces - want.pair_forces).abs().max()) <= rtol * scale
    assert got.energy == pytest.approx(want.energy, rel=rtol)
    energies = float(want.atom_energies.abs().max())
    assert float((got.atom_energies - want.atom_energies).abs().max()) <= rtol * energies


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(make, marks=pytest.mark.slow) if name == "mace" else make
        for name, make in POTENTIALS.items()
    ],
    ids=POTENTIALS.keys(),
)
def test_captured_equals_eager(make):
    """Every potential that runs on padded graphs, captured, on one rank: equal to eager,
    and both equal to the ghost features exchanged eagerly (as between ranks): on one rank
    the engine hands a potential the periodic system without ghost rows, each pair's
    neighbor named by its owner, so the capture holds the owned rows only. Captured with
    the ghosts as if from other ranks too (the exchanges between the graphs): equal, the
    same collectives as eager."""
    potential = make()
    captured = CapturedPotential(potential)
    graph = _graph(fcc_argon_222(), potential.spec.cutoff)
    want = evaluate(potential, graph)
    remote = _graph(fcc_argon_222(), potential.spec.cutoff, RemoteComm)
    _assert_same(want, evaluate(potential, remote))
    eager_calls = remote.comm.taken()
    for _ in range(2):  # the capture, then a replay
        _assert_same(evaluate(captured, graph), want)
    assert captured.captures == 1 and captured.eager_reason is None
    assert graph.nlocal < captured.atom_capacity < graph.ntotal
    assert captured.pair_capacity > graph.npairs

    several = CapturedPotential(potential)
    for _ in range(2):
        _assert_same(evaluate(several, remote), want)
        assert remote.comm.taken() == eager_calls
    assert several.captures == 1 and several.eager_reason is None
    assert several.atom_capacity > remote.ntotal  # the ghost rows padded too


def test_capture_again_only_when_outgrown():
    """Graphs within the capacities (other owned, ghost and pair counts) replay the same
    capture; a graph past one grows the capacities geometrically and captures again."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    captured = CapturedPotential(potential, headroom=0.5)
    graph = _graph(fcc_argon_222(), 5.0)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    capacities = (captured.atom_capacity, captured.pair_capacity)

    fewer = _graph(fewer_atoms(3, seed=1), 5.0)
    assert fewer.nlocal != graph.nlocal and fewer.npairs < graph.npairs
    _assert_same(evaluate(captured, fewer), evaluate(potential, fewer))
    assert captured.captures == 1
    assert (captured.atom_capacity, captured.pair_capacity) == capacities

    dense = _graph(fcc_argon_222().strained(np.eye(3) * -0.2), 5.0)
    assert dense.npairs > capacities[1]
    _assert_same(evaluate(captured, dense), evaluate(potential, dense))
    assert captured.captures == 2
    assert captured.pair_capacity >= 1.5 * dense.npairs
    # and back to the first graph: the larger capture holds it
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 2


def test_padding_is_inert_in_the_static_buffers():
    """A replay after a larger graph: the padding rows and pairs left in the static
    buffers by the larger graph are overwritten, not summed."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    captured = CapturedPotential(potential, headroom=0.0)
    dense = _graph(fcc_argon_222().strained(np.eye(3) * -0.1), 5.0)
    evaluate(captured, dense)
    graph = _graph(fewer_atoms(5, seed=3), 5.0)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 1


def test_topology_written_only_when_it_changes():
    """A step writes the static buffers' topology (species, pairs) and padding only
    when they change: not at all for the same tensors, unchanged; for the same counts and
    other pairs, for species changed in place (torch counts its writes), for fewer pairs
    (those dropped become padding) and back, each equal to eager, without a capture."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    captured = CapturedPotential(potential)
    graph = _graph(fcc_argon_222(), 5.0)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    buffers = captured._padded
    topology = (buffers.species, buffers.pair_i, buffers.pair_j)
    written = [t._version for t in topology]
    moved = dataclasses.replace(graph, rij=graph.rij * 1.01)
    _assert_same(evaluate(captured, moved), evaluate(potential, moved))
    assert [t._version for t in topology] == written

    order = torch.randperm(graph.npairs, generator=torch.Generator().manual_seed(0))
    shuffled = dataclasses.replace(
        graph, pair_i=graph.pair_i[order], pair_j=graph.pair_j[order], rij=graph.rij[order]
    )
    fewer = dataclasses.replace(
        graph, pair_i=graph.pair_i[:-9], pair_j=graph.pair_j[:-9], rij=graph.rij[:-9]
    )
    for step in (shuffled, fewer, graph):
        _assert_same(evaluate(captured, step), evaluate(potential, step))
    graph.species[:5] = 1 - graph.species[:5]  # the same tensor, written in place
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 1


def test_folded_topology_goes_with_its_tensors():
    """The engine keeps one rank's folded topology (each pair's neighbor named by its owned
    atom) while the tensors it came from live, so that a captured potential handed them
    again writes nothing (above); a front door's tensors, freed after its step, take it
    along: nothing of a finished run stays on the device."""
    graph = _graph(fcc_argon_222(), 5.0)
    evaluate(MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3), graph)
    assert _folded._value is not None
    del graph
    gc.collect()
    assert _folded._value is None


def test_shell_strategy_captured():
    """Under the widened shell nothing is exchanged: captured equals eager."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3)
    rank = decompose_shell(fcc_argon_222(), 5.0, 3, 1)[0]
    graph = rank.local_graph(NoOpComm())
    captured = CapturedPotential(potential)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 1


def _differentiated(potential, graph):
    """The potential's forward differentiated by autograd, as a pipeline differentiates its
    terms: what :func:`_assert_same` compares."""
    rij = graph.rij.clone().requires_grad_(True)
    energies = potential(dataclasses.replace(graph, rij=rij))[: graph.nlocal]
    (forces,) = torch.autograd.grad(energies.sum(), rij)
    return types.SimpleNamespace(
        pair_forces=forces, energy=float(energies.detach().sum()), atom_energies=energies.detach()
    )


@pytest.mark.parametrize("step", [True, False], ids=["whole-step", "forward-backward"])
def test_exchanges_between_ranks_between_the_graphs(step):
    """Ghost features from other ranks go through MPI every layer, which no graph can hold:
    each exchange runs between two graphs, on the step's own communication and the padded
    graph's real rows. Equal to eager, also on other counts within the capacities; the
    same collectives as eager, none while capturing (a rank may capture alone); counted
    for the log. Both kinds of capture: a front door's whole step, and a pipeline term's
    forward and backward (an autograd function)."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3)
    captured = CapturedPotential(potential)
    run = evaluate if step else _differentiated
    for system in (fcc_argon_222(), fewer_atoms(3, seed=1)):
        graph = _graph(system, 5.0, RemoteComm)
        want = run(potential, graph)
        eager_calls = graph.comm.taken()
        _assert_same(run(captured, graph), want)
        assert graph.comm.taken() == eager_calls
    assert eager_calls == {"forward": 2, "reverse": 2, "sum": 0}
    assert captured.captures == 1 and captured.eager_reason is None
    assert captured.collectives == 4
    assert captured.note() == (
        "message_passing: 4 exchange(s) or sum(s) between ranks per step, each between two graphs"
    )


class _Summing(Potential):
    """Pair energies scaled by a sum over ranks: a potential with a collective mid-step."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "summing"
        self.spec = ModelSpec(cutoff=5.0, elements=("Ar", "Ne"), units="metal")

    def forward(self, graph):
        r = torch.linalg.norm(graph.rij, dim=1)
        pair = torch.where(r < self.spec.cutoff, (self.spec.cutoff - r) ** 2, 0.0)
        scale = graph.comm.allreduce(torch.ones(1, dtype=r.dtype))
        energies = torch.zeros(graph.ntotal, dtype=r.dtype).index_add(0, graph.pair_i, pair)
        return energies * scale

    def prepare_compile(self):
        return self


def test_sums_over_ranks():
    """A sum over ranks is the identity inside a capture on one rank; on several it calls
    MPI between two graphs: at every replay, never while capturing."""
    one = CapturedPotential(_Summing())
    graph = _graph(fcc_argon_222(), 5.0, exchange=False)
    _assert_same(evaluate(one, graph), evaluate(_Summing(), graph))
    assert one.captures == 1 and one.collectives == 0 and one.note() == ""

    several = CapturedPotential(_Summing())
    remote = _graph(fcc_argon_222(), 5.0, RemoteComm, exchange=False)
    want = evaluate(_Summing(), remote)
    assert remote.comm.taken() == {
        "forward": 0,
        "reverse": 0,
        "sum": 1,
    }  # a constant's: no backward
    for _ in range(2):
        _assert_same(evaluate(several, remote), want)
        assert remote.comm.taken() == {"forward": 0, "reverse": 0, "sum": 1}
    assert several.captures == 1 and several.collectives == 1


def test_closed_forms_stay_eager():
    """A pair potential's closed form runs a few kernels on a half list, eagerly: not
    captured, saying why."""
    with pytest.raises(ValueError, match="closed form"):
        CapturedPotential(lennard_jones(fcc_argon_222(), cutoff=6.0))


def test_pipeline_captures_its_parts():
    """A pipeline's terms that run on padded graphs are captured one by one; a closed form
    stays eager."""
    pipeline = Pipeline(
        [
            MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3),
            lennard_jones(fcc_argon_222(), cutoff=6.0),
        ]
    )
    captured = capture_potential(pipeline)
    assert sum(isinstance(m, CapturedPotential) for m in captured.modules()) == 1
    graph = _graph(fcc_argon_222(), 6.0)
    _assert_same(evaluate(captured, graph), evaluate(pipeline, graph))


class _Launches(TorchDispatchMode):
    """The operations that launch work (views and detaches do not), outside the replays of
    a captured step."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.replays = 0
        self.replaying = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.replaying and not func.is_view and func is not torch.ops.aten.detach.default:
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def test_step_is_one_replay(monkeypatch):
    """A front door's step of a captured potential is one replay of one graph (forward,
    backward and the sums read back), and outside it, with the topology handed again, only
    the pair vectors' write, the positions' sum (their finiteness) and the one read of the
    sums: the evaluation's tensors are views of the static buffers, equal to eager."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    captured = CapturedPotential(potential)
    graph = _graph(fcc_argon_222(), 5.0)
    graph = dataclasses.replace(graph, positions=torch.zeros(graph.ntotal, 3, dtype=torch.float64))
    evaluate(captured, graph)
    took = captured.capture_seconds
    assert took > 0.0
    launches = _Launches()
    replay = _Step.replay

    def counted(step):
        launches.replays += 1
        launches.replaying = True
        try:
            replay(step)
        finally:
            launches.replaying = False

    monkeypatch.setattr(_Step, "replay", counted)
    moved = dataclasses.replace(graph, rij=graph.rij * 1.01)
    with launches:
        got = evaluate(captured, moved)
    assert launches.replays == 1 and isinstance(captured._graphs, _Step)
    assert sorted(launches.ops) == ["cat", "copy_", "sum"]
    _assert_same(got, evaluate(potential, moved))
    assert got.pair_forces.untyped_storage().data_ptr() == (
        captured._graphs.grads[0].untyped_storage().data_ptr()
    )
    assert captured.captures == 1 and captured.capture_seconds == took


def test_part_and_step_captured_apart():
    """A captured potential differentiated as a part of a larger computation (its forward)
    and evaluated as a front door's step: each is captured on its own buffers (the step's
    in float64, the forward's in the potential's dtype), equal to eager either way."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3)
    captured = CapturedPotential(potential)
    graph = _graph(fcc_argon_222(), 5.0)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    rij = graph.rij.clone().requires_grad_(True)
    energies = captured(dataclasses.replace(graph, rij=rij))
    (forces,) = torch.autograd.grad(energies[: graph.nlocal].sum(), rij)
    want = evaluate(potential, graph)
    assert torch.allclose(forces, want.pair_forces, rtol=1e-12, atol=0.0)
    _assert_same(evaluate(captured, graph), want)
    assert captured.captures == 3


def test_nonfinite_inputs_of_a_captured_step():
    """A NaN position counts in the step's finiteness (read back with the energy); a NaN
    pair vector is named by its atoms, as for an eager potential."""
    captured = CapturedPotential(MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3))
    graph = _graph(fcc_argon_222(), 5.0)
    positions = torch.zeros(graph.ntotal, 3, dtype=torch.float64)
    assert evaluate(captured, dataclasses.replace(graph, positions=positions)).finite
    positions[3, 1] = float("nan")
    assert not evaluate(captured, dataclasses.replace(graph, positions=positions)).finite
    rij = graph.rij.clone()
    rij[5, 0] = float("nan")
    pair = f"between atoms {int(graph.pair_i[5])} and {int(graph.pair_j[5])}"
    result = evaluate(captured, dataclasses.replace(graph, rij=rij))
    with pytest.raises(ValueError, match=pair):
        _ = result.energy


@pytest.fixture
def model_file(tmp_path):
    from nvalchemi_lammps import save_model

    return save_model(MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3), tmp_path / "m.pt")


def test_session_capture_keyword(model_file):
    """``capture``: ``auto`` (the default) captures on a GPU only and says nothing on the
    CPU; ``yes`` on the CPU runs the padded buffers and says so; ``no`` leaves it eager;
    ``yes`` with ``compile`` and unknown modes are refused."""
    session = Session(str(model_file), 1)
    assert session.set_capture("auto") == ""
    assert session.compile_status() == (-1, 0, 0, 0.0)
    assert session.set_capture("no") == ""
    line = session.set_capture("yes")
    assert line.startswith("capture on the CPU (padded buffers, no graphs): message_passing")
    assert session.compile_status()[::3] == (0, 0.0)  # nothing captured before the first step
    with pytest.raises(ValueError, match="capture must be yes, no or auto"):
        session.set_capture("maybe")

    compiled = Session(str(model_file), 1)
    compiled.set_compile("default")
    assert compiled.set_capture("auto") == ""
    with pytest.raises(ValueError, match="exclude each other"):
        compiled.set_capture("yes")


def test_backward_follows_its_own_forward():
    """The graphs' activations are shared between replays: differentiating an earlier
    forward after a later one would silently use the later one's, so it is refused."""
    captured = CapturedPotential(MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, seed=3))
    graph = _graph(fcc_argon_222(), 5.0)
    rij = graph.rij.clone().requires_grad_(True)
    first = captured(dataclasses.replace(graph, rij=rij))
    captured(dataclasses.replace(graph, rij=rij * 1.01))
    with pytest.raises(RuntimeError, match="must follow its own forward"):
        torch.autograd.grad(first[: graph.nlocal].sum(), rij)


def test_pairs_written_in_place():
    """A front door that writes a step's pairs, folded into owned rows, straight into the
    captured buffers (``pair_sink``, as nvalchemi/kk's kernels do) gets the evaluation of its
    own arrays, and the step copies none of them; told another generation, it evaluates its
    own arrays as always."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3)
    captured = CapturedPotential(potential)
    system = fcc_argon_222()
    evaluate(captured, _graph(system, 5.0))
    sink = pair_sink(captured)
    assert sink is not None and sink.capacity >= 1
    moved = np.random.default_rng(5).normal(scale=1e-3, size=system.positions.shape)
    graph = _graph(dataclasses.replace(system, positions=system.positions + moved), 5.0)
    n, nlocal = graph.npairs, graph.nlocal
    assert sink.nlocal == nlocal and n <= sink.capacity
    owners = graph.comm.local_owners(torch.device("cpu"))
    with torch.no_grad():  # as the door's kernels write: outside autograd
        sink.pair_i[:n] = graph.pair_i
        sink.pair_j[:n] = owners[graph.pair_j]
        sink.rij[:n] = graph.rij
        sink.species[:nlocal] = graph.species[:nlocal]
    versions = [t._version for t in (sink.pair_i, sink.rij, sink.species)]
    want = evaluate(potential, graph)
    _assert_same(evaluate(captured, graph, in_place=sink.generation), want)
    assert [t._version for t in (sink.pair_i, sink.rij, sink.species)] == versions
    assert pair_sink(captured) == sink and captured.captures == 1
    _assert_same(evaluate(captured, graph, in_place=sink.generation + 1), want)
