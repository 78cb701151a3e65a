"""AIMNet2 captured on padded graphs (engine/_captured.py), its neighbor matrix's width a
capacity of the engine (``LocalGraph.row_pairs``), against the same potential run eagerly,
on the CPU (the static buffers "replayed" by running the potential on them again): neutral
and charged, through a replay in a strained cell and a capture again when the capacities
and the width grow; what its forward and backward would make the host wait for on a GPU
(tests/_host_syncs.py); and PME reading AIMNet2's predicted charges in a pipeline, captured
with those charges as a differentiable input. float64, one rank, ghosts exchanged by owned
row (the strategy under which a captured step runs on one GPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from _aimnet2_models import ELEMENTS, molecular_box, random_aimnet2
from _host_syncs import host_syncs
from _systems import OneRankComm, RemoteComm, System, decompose

from nvalchemi_lammps import Pipeline, evaluate
from nvalchemi_lammps.engine import CapturedPotential, capture_potential
from nvalchemi_lammps.potentials import aimnet2 as aimnet2_module
from nvalchemi_lammps.potentials.pme import Pme

CUTOFF = 5.0
SYSTEM = molecular_box()  # 31 atoms of H, C, N, O in a 6.8 Angstrom cube


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One thread for these tiny graphs: on a loaded machine torch's pool spins (twice the
    CPU time with two); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def potential():
    """aimnet's packaged AIMNet2 architecture, narrowed (fewer features and hidden units)
    for CPU time: the same modules and passes."""
    config = aimnet2_module.packaged_config()
    kwargs = config["kwargs"]
    kwargs.update(nfeature=4, hidden=[[32, 24], [32, 24], [32, 24, 24]], aim_size=16)
    kwargs["outputs"]["energy_mlp"]["kwargs"].update(n_in=16)
    kwargs["outputs"]["energy_mlp"]["kwargs"]["mlp"]["hidden"] = [16, 16]
    return random_aimnet2(seed=0, model=config)


def _graph(system: System, charge: float = 0.0, positions: bool = False, comm=OneRankComm):
    """``system`` as one rank with ghosts (its atoms' periodic images) would hand it; with
    ``positions``: every row's position and the cell (for PME), LAMMPS's charges zero; with
    ``comm=RemoteComm``, as if the ghosts came from other ranks."""
    rank = decompose(system, CUTOFF, 1)[0]
    fields = {"total_charge": charge}
    if positions:
        rows = system.positions[rank.owner].copy()
        rows[rank.pair_j] = rows[rank.pair_i] + rank.rij  # ghosts at their images
        fields.update(
            positions=torch.from_numpy(rows),
            cell=torch.from_numpy(np.asarray(system.cell, dtype=np.float64)),
            pbc=system.pbc,
            charges=torch.zeros(len(rows), dtype=torch.float64),
        )
    return rank.local_graph(comm(rank.owner, exchange=True), **fields)


def _scaled(system: System, factor: np.ndarray, name: str) -> System:
    return dataclasses.replace(
        system, name=name, positions=system.positions @ factor, cell=system.cell @ factor
    )


def _assert_same(got, want, rtol=1e-12):
    assert got.energy == pytest.approx(want.energy, rel=rtol, abs=1e-13)
    for field in ("atom_energies", "pair_forces", "atom_forces", "virial"):
        a, b = getattr(got, field), getattr(want, field)
        if b is None:
            assert a is None, field
            continue
        scale = float(b.abs().max())
        assert scale > 0.0, field
        assert float((a - b).abs().max()) <= rtol * scale, field


@pytest.mark.parametrize("charge", [0.0, -1.0], ids=["neutral", "anion"])
def test_captured_equals_eager(potential, charge):
    """Captured equals eager (energy, per-atom energies, pair forces, virial): at the
    capture, at a replay in a cell strained by 1 % (no count outgrows its capacity), and
    captured again for the box compressed by 12 %, where the atoms have more neighbors:
    the pair capacity and the neighbor matrix's width grow."""
    captured = CapturedPotential(potential)
    strained = _scaled(SYSTEM, np.diag([1.01, 0.995, 1.0]), "strained")
    dense = _scaled(SYSTEM, np.eye(3) * 0.88, "dense")
    first = _graph(SYSTEM, charge)
    _assert_same(evaluate(captured, first), evaluate(potential, first))
    assert captured.captures == 1 and captured.eager_reason is None
    width, pairs = captured.capacities.row_pairs, captured.pair_capacity
    most = int(torch.bincount(first.pair_i).max())
    assert most <= width < 1.5 * most + 8
    graph = _graph(strained, charge)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 1
    graph = _graph(dense, charge)
    _assert_same(evaluate(captured, graph), evaluate(potential, graph))
    assert captured.captures == 2
    assert captured.capacities.row_pairs > width and captured.pair_capacity > pairs


def test_captured_between_ranks(potential):
    """Ghosts as if from other ranks: the charge equilibration's sums over ranks and the
    exchanges run between the graphs, at every replay (the same collectives as eager);
    equal to eager."""
    captured = CapturedPotential(potential)
    graph = _graph(SYSTEM, -1.0, comm=RemoteComm)
    want = evaluate(potential, graph)
    eager_calls = graph.comm.taken()
    for _ in range(2):
        _assert_same(evaluate(captured, graph), want)
        assert graph.comm.taken() == eager_calls
    assert eager_calls["sum"] > 0
    assert captured.captures == 1 and captured.collectives == sum(eager_calls.values())


def test_width_counted_when_the_pairs_change(potential, monkeypatch):
    """The most pairs per row is read from the pairs (a host read on a GPU) only when the
    front door hands new ones: the same tensors again are not counted again."""
    captured = CapturedPotential(potential)
    counted = []
    count = captured._row_pairs
    monkeypatch.setattr(captured, "_row_pairs", lambda g: counted.append(1) or count(g))
    graph = _graph(SYSTEM)
    for _ in range(2):
        evaluate(captured, graph)
    assert captured.captures == 1
    assert len(counted) == 2  # the wrapper is called every step; the count is cached
    assert captured._counted is not None and captured._counted[0]() is graph.pair_i


def test_no_host_synchronization_when_captured(potential):
    """Run on a padded graph as inside a capture, forward and backward, nothing would make
    the host wait for the GPU; aimnet's reads of its neighbor mode read host tensors
    (``HOST_FLAGS``), made once. And the energies are eager's."""
    graph = _graph(SYSTEM, -1.0)
    padded = dataclasses.replace(graph, row_pairs=int(torch.bincount(graph.pair_i).max()) + 3)
    found, energies = host_syncs(potential, padded, host=aimnet2_module.HOST_FLAGS.values())
    assert found == []
    want = evaluate(potential, graph).atom_energies
    assert float((energies[: graph.nlocal] - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_host_flags_are_the_only_host_reads(potential):
    """Without the exemption, the check sees aimnet's reads of the host flags, and
    nothing else: the exemption hides no other read."""
    graph = _graph(SYSTEM)
    padded = dataclasses.replace(graph, row_pairs=int(torch.bincount(graph.pair_i).max()))
    found, _ = host_syncs(potential, padded)
    assert found and all("_local_scalar_dense" in f and "nbops.py" in f for f in found), found


def test_pipeline_captures_pme_reading_predicted_charges(potential):
    """AIMNet2 -> PME: PME reads AIMNet2's predicted charges, captured with them as a
    differentiable input (their derivative carries AIMNet2's share of PME's forces);
    AIMNet2, whose charges feed it, runs eagerly. Equal to eager in energy, per-atom
    energies, pair and atom forces and virial, also at a replay in a strained cell."""
    pme = Pme(list(ELEMENTS), cutoff=CUTOFF, alpha=0.6, mesh=10, order=5)
    pipeline = Pipeline([potential, pme], [None, 0])
    captured = capture_potential(pipeline)
    assert [type(t) for t in captured.terms] == [type(potential), CapturedPotential]
    strained = _scaled(SYSTEM, np.diag([1.01, 0.995, 1.0]), "strained")
    for system in (SYSTEM, strained):
        graph = _graph(system, positions=True)
        _assert_same(evaluate(captured, graph), evaluate(pipeline, graph))
    assert captured.terms[1].captures == 1
    # the charges' share is there to lose: without it the forces differ
    graph = _graph(SYSTEM, positions=True)
    fixed = Pipeline([potential, pme], [None, None])
    constant = dataclasses.replace(
        graph, charges=pipeline.terms[0].outputs(graph)["charges"].detach()
    )
    without = evaluate(fixed, constant).pair_forces
    assert float((without - evaluate(pipeline, graph).pair_forces).abs().max()) > 1e-6


def test_width_capacity():
    """The width is a multiple of 8 with the headroom, grown by at least the growth factor
    when outgrown, never shrunk, and given also to a rank without pairs; not asked for,
    none (the padded graph declares no ``row_pairs``)."""
    from nvalchemi_lammps.contract import LocalGraph
    from nvalchemi_lammps.engine._padding import Capacities

    none = torch.empty(0, dtype=torch.int64)
    empty = LocalGraph(0, none, none, none, torch.empty(0, 3, dtype=torch.float64))
    capacities = Capacities()
    assert capacities.fit(empty) and capacities.row_pairs == 0
    assert capacities.fit(empty, 0) and capacities.row_pairs == 8
    assert not capacities.fit(empty, 8) and capacities.row_pairs == 8
    assert capacities.fit(empty, 9) and capacities.row_pairs == 16
    assert capacities.fit(empty, 17) and capacities.row_pairs == 24
    assert not capacities.fit(empty, 3) and capacities.row_pairs == 24
