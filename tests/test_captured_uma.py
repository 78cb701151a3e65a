"""UMA captured on padded graphs (engine/_captured.py) against the same potential run
eagerly, on the CPU (the static buffers "replayed" by running the potential on them again):
the plain eSCN-MD backbone (also with Euler-angle rotations), one with charge and spin
channel balancing, and the mixture of experts of a fairchem checkpoint with the predict
unit's normalization (an energy mean, element references, an expert head per task);
neutral, and charged with a spin; through a replay in a strained cell and a capture again
when the capacities grow. Also: replays run as inside a capture (reading what the warm-ups
made), what the forward and backward would make the host wait for on a GPU
(tests/_host_syncs.py), the roll angles (the same draws eagerly and captured), and the
max_neighbors refusal, checked before each replay. float64, one rank, ghosts exchanged by
owned row (the strategy under which a captured step runs on one GPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from _host_syncs import host_syncs, padded_graph
from _systems import OneRankComm, RemoteComm, System, decompose
from _uma_models import BACKBONE, BALANCED_BACKBONE, ELEMENTS, copper_oxide_box, random_uma

from nvalchemi_lammps import evaluate
from nvalchemi_lammps.engine import CapturedPotential, capture_potential
from nvalchemi_lammps.potentials import _capture
from nvalchemi_lammps.potentials import uma as uma_module
from nvalchemi_lammps.potentials.uma import Uma

pytestmark = pytest.mark.uma

CUTOFF = BACKBONE["cutoff"]
SYSTEM = copper_oxide_box()  # 16 atoms of H, C, O, Cu in a 7.2 x 7.2 x 3.6 Angstrom box


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One thread for these small graphs: on a loaded machine torch's pool spins (more CPU
    time with two); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _moe(workdir) -> Uma:
    from _uma_models import write_moe_checkpoint

    path = write_moe_checkpoint(workdir / "moe.pt", seed=2, head="experts", energy_mean=3.5)
    return Uma.from_checkpoint(path, "omat", elements=list(ELEMENTS), dtype="float64")


MODELS = {
    "plain": lambda _: random_uma(seed=0),
    "euler": lambda _: random_uma(seed=0, backbone={**BACKBONE, "use_quaternion_wigner": False}),
    "balanced": lambda _: random_uma(seed=1, backbone=BALANCED_BACKBONE, task="omol", spin=3),
    "moe": _moe,
}


class _Models(dict):
    """The models by name, each built when first asked for."""

    def __init__(self, workdir) -> None:
        super().__init__()
        self.workdir = workdir

    def __missing__(self, name: str) -> Uma:
        self[name] = MODELS[name](self.workdir)
        return self[name]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The plain backbone, with Euler-angle rotations, with channel balancing, and a
    mixture-of-experts checkpoint (an expert head per task, energy mean 3.5 eV, element
    references)."""
    return _Models(tmp_path_factory.mktemp("uma_capture"))


#: model, and the system state: net charge, spin (None: the model's), task (None: the
#: model's)
CASES = {
    "plain": ("plain", 0.0, None, None),
    "plain-omol-charged": ("plain", -2.0, 3, "omol"),
    "euler": ("euler", 0.0, None, None),
    "balanced-charged": ("balanced", 1.0, 2, None),
    "moe": ("moe", 0.0, None, None),
    "moe-omol-anion": ("moe", -1.0, 2, "omol"),
}


def _graph(system: System, charge: float = 0.0, spin=None, task=None, comm=OneRankComm):
    """``system`` as one rank with ghosts (its atoms' periodic images) would hand it; with
    ``comm=RemoteComm``, as if the ghosts came from other ranks."""
    rank = decompose(system, CUTOFF, 1)[0]
    comm = comm(rank.owner, exchange=True)
    return rank.local_graph(comm, total_charge=charge, spin=spin, task=task)


def _scaled(system: System, factor: np.ndarray, name: str) -> System:
    return dataclasses.replace(
        system, name=name, positions=system.positions @ factor, cell=system.cell @ factor
    )


STRAINED = _scaled(SYSTEM, np.diag([1.01, 0.995, 1.0]), "strained")
DENSE = _scaled(SYSTEM, np.eye(3) * 0.9, "dense")


def _assert_same(got, want, rtol=1e-12):
    assert got.energy == pytest.approx(want.energy, rel=rtol, abs=1e-13)
    for field in ("atom_energies", "pair_forces", "atom_forces", "virial"):
        a, b = getattr(got, field), getattr(want, field)
        if b is None:  # without positions: no atom forces, no virial
            assert a is None, field
            continue
        scale = float(b.abs().max())
        assert scale > 0.0, field
        assert float((a - b).abs().max()) <= rtol * scale, field


def _most_neighbors(graph) -> int:
    return int(torch.bincount(graph.pair_i).max())


@pytest.mark.parametrize(("model", "charge", "spin", "task"), CASES.values(), ids=CASES.keys())
def test_captured_equals_eager(models, model, charge, spin, task):
    """Captured (by default: capture_potential) equals eager in energy, per-atom energies,
    pair and atom forces and virial: at the capture, at a replay in a cell strained by 1 %
    (no count outgrows its capacity), and captured again for the box compressed by 10 %,
    where the atoms have more neighbors: the pair capacity grows."""
    potential = models[model]
    captured = capture_potential(potential)
    assert isinstance(captured, CapturedPotential)
    state = (charge, spin, task)
    first = _graph(SYSTEM, *state)
    _assert_same(evaluate(captured, first), evaluate(potential, first))
    assert captured.captures == 1 and captured.eager_reason is None
    pairs = captured.pair_capacity
    graph = _graph(STRAINED, *state)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 1
    graph = _graph(DENSE, *state)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 2 and captured.pair_capacity > pairs


@pytest.mark.parametrize("case", ["balanced-charged", "moe-omol-anion"])
def test_captured_between_ranks(models, case):
    """Ghosts as if from other ranks: the exchanges, the composition summed over ranks for
    the experts and the channel balancing's sums run between the graphs, at every replay
    (the same collectives as eager), and the evaluation equals eager, also captured again
    for more pairs."""
    model, charge, spin, task = CASES[case]
    potential = models[model]
    captured = capture_potential(potential)
    for system in (SYSTEM, STRAINED, DENSE):
        graph = _graph(system, charge, spin, task, comm=RemoteComm)
        want = evaluate(potential, graph)
        eager_calls = graph.comm.taken()
        _assert_same(evaluate(captured, graph), want)
        assert graph.comm.taken() == eager_calls
    assert eager_calls["sum"] > 0 and eager_calls["forward"] > 0
    assert captured.captures == 2 and captured.eager_reason is None
    assert captured.collectives == sum(eager_calls.values())


@pytest.mark.parametrize("model", ["balanced", "moe"])
def test_replays_as_inside_a_capture(models, model, monkeypatch):
    """Replays as a GPU replays them: the forward run as inside a capture (``capturing()``
    true) reads the charge, spin and embedding of the system and the roll angles that the
    capture's warm-up made, and draws or copies nothing; equal to eager, also in another
    cell. A system state the warm-up did not see, or more edges than its roll angles, stop
    such a run (on a GPU the engine captures again first: the state and the capacities are
    what a capture is specialized to)."""
    potential = models[model]
    graphs = [_graph(system, -1.0, 2) for system in (SYSTEM, STRAINED)]
    wants = [evaluate(potential, graph) for graph in graphs]
    captured = CapturedPotential(potential)
    evaluate(captured, graphs[0])  # the capture, with its warm-up
    monkeypatch.setattr(_capture, "capturing", lambda: True)
    for graph, want in zip(graphs, wants, strict=True):
        _assert_same(evaluate(captured, graph), want)
    assert captured.captures == 1
    inner = captured.inner
    layout = captured._padded.graph(captured._padded._graph.comm)
    with pytest.raises(RuntimeError, match="UMA's system was not made before the capture"):
        inner(dataclasses.replace(layout, total_charge=1.0))
    edges = captured.pair_capacity
    inner._rolls = {k: v[: edges - 1] for k, v in inner._rolls.items()}
    with pytest.raises(RuntimeError, match=f"roll angles of {edges} edges were not drawn"):
        inner(layout)


@pytest.mark.parametrize(
    ("model", "charge", "spin"),
    [("plain", 0.0, None), ("euler", 0.0, None), ("balanced", 1.0, 2), ("moe", -1.0, 2)],
    ids=["plain", "euler", "balanced-charged", "moe-anion"],
)
def test_no_host_synchronization_when_captured(models, model, charge, spin):
    """Run on a padded graph as inside a capture, after a warm-up (as the engine warms up
    before it captures), forward and backward: nothing would make the host wait for the GPU
    (no value read back, no shape from values, no host data copied to the device), and the
    energies are eager's."""
    potential = models[model]
    graph = _graph(SYSTEM, charge, spin)
    prepared = potential.prepare_capture()
    prepared(padded_graph(graph, CUTOFF)[0])  # the warm-up, outside the capture
    found, energies = host_syncs(prepared, graph)
    assert found == []
    want = evaluate(potential, graph).atom_energies
    assert float((energies[: graph.nlocal] - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_eager_forward_reads_values_back(models):
    """The check sees what the warm-up runs outside the capture: the neighbor count, the
    system's embedding (fairchem's spin embedding finds its zeros with ``nonzero``, its
    dataset embedding copies an index to the device)."""
    graph = _graph(SYSTEM, 0.0, 0)
    found, _ = host_syncs(models["plain"].prepare_capture(), graph, capturing=False)
    where = " ".join(found)
    for what in ("uma.py", "embedding.py", "nonzero", "host data"):
        assert what in where, (what, found)


def test_prepared_copy(models):
    """prepare_capture gives a copy sharing the modules, with what it makes outside the
    captures its own (a captured graph reads it: an eager run of the potential does not
    replace it); prepared already, it is its own preparation."""
    potential = models["plain"]
    prepared = potential.prepare_capture()
    assert prepared is not potential and prepared.prepare_capture() is prepared
    assert prepared.backbone is potential.backbone
    assert prepared.state_dict().keys() == potential.state_dict().keys()
    prepared(_graph(SYSTEM))
    rolls, system = dict(prepared._rolls), prepared._remembered["system"]
    evaluate(potential, _graph(DENSE, -1.0))
    assert prepared._rolls.keys() == rolls.keys()
    assert all(prepared._rolls[k] is v for k, v in rolls.items())
    assert prepared._remembered["system"] is system


@pytest.mark.parametrize("model", ["plain", "euler"])
def test_roll_angles(models, model):
    """Edge k turns by the k-th draw of the CPU generator seeded with ROLL_SEED: the Wigner
    matrices equal fairchem's own construction (which draws them from torch's generator
    after ``torch.manual_seed(ROLL_SEED)``) bit for bit, by quaternions and by Euler angles;
    the table of draws, grown for more edges, keeps the first ones."""
    potential = Uma.from_config(models[model].config())
    potential.load_state_dict(models[model].state_dict())
    graph = _graph(SYSTEM)
    vectors, n = graph.rij, graph.npairs
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(uma_module.ROLL_SEED)
        theirs = potential.backbone._get_rotmat_and_wigner(vectors)
    short = potential._roll_fractions(n - 5, torch.float64, vectors.device, capturing=False)
    fractions = potential._roll_fractions(n, torch.float64, vectors.device, capturing=False)
    assert len(potential._rolls[(torch.float64, vectors.device)]) >= 1.25 * (n - 5)
    assert torch.equal(fractions[: n - 5], short)
    ours = uma_module._rotations(potential.backbone, vectors, fractions)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_too_many_neighbors_refused_captured(models, monkeypatch):
    """The max_neighbors refusal holds captured: at the capture, and before each replay
    (outside the graphs: at a GPU replay the forward does not run, which the run as inside
    a capture stands in for here). Padding pairs, beyond the cutoff, are not counted, also
    where a padding row receives more of them than max_neighbors."""
    potential = models["plain"]
    graph = _graph(SYSTEM)
    most = _most_neighbors(graph)
    config = {**potential.config(), "backbone": {**BACKBONE, "max_neighbors": most - 1}}
    capped = Uma.from_config(config)
    capped.load_state_dict(potential.state_dict())
    message = rf"an atom has {most} neighbors within the UMA cutoff"
    with pytest.raises(ValueError, match=message):
        evaluate(CapturedPotential(capped), graph)

    capped.backbone.max_neighbors = most
    padded = padded_graph(graph, CUTOFF, owned_padding=1, pair_padding=most + 5)[0]
    assert _most_neighbors(padded) == most + 5
    capped.check_graph(padded)
    captured = CapturedPotential(capped)
    evaluate(captured, graph)
    monkeypatch.setattr(_capture, "capturing", lambda: True)
    evaluate(captured, graph)
    capped.backbone.max_neighbors = most - 1
    with pytest.raises(ValueError, match=message):
        evaluate(captured, _graph(STRAINED))
    assert captured.captures == 1
