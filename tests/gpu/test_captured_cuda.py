"""Potentials captured as CUDA graphs (engine/_captured.py) on a GPU, against the same
potentials run eagerly there: one rank (whose ghosts the engine folds into their owners),
replays after the capture, a capture again when a graph outgrows the capacities; ghosts as
if from other ranks, exchanged between graph segments; DFT-D3, Ewald and PME (explicit alpha
and resolution; their ghosts gathered inside the graphs) likewise. Needs no LAMMPS."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch
from _systems import OneRankComm, RemoteComm, decompose, fcc_argon_222
from test_captured import POTENTIALS as CAPTURED_ON_CPU
from test_captured import _assert_same as _assert_same_short_range
from test_captured import _differentiated, _Summing
from test_captured_long_range import POTENTIALS as LONG_RANGE
from test_captured_long_range import _assert_same
from test_captured_long_range import _graphs as long_range_graphs

from nvalchemi_lammps import MessagePassing, evaluate
from nvalchemi_lammps.engine import CapturedPotential


def _graph(system, cutoff, comm_type=OneRankComm):
    rank = decompose(system, cutoff, 1)[0]
    graph = rank.local_graph(comm_type(rank.owner, device="cuda"))
    return type(graph)(
        graph.nlocal,
        graph.species.cuda(),
        graph.pair_i.cuda(),
        graph.pair_j.cuda(),
        graph.rij.cuda(),
        graph.comm,
    )


def _mace(dtype, **options):
    # looked for, not imported: importing mace sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD for the
    # process (_mace_models imports it with that undone)
    if importlib.util.find_spec("mace") is None:
        pytest.skip("mace-torch is not installed")
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(random_mace(), dtype=dtype, **options)


POTENTIALS = {
    "message_passing": lambda: MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, seed=3),
    "mace64": lambda: _mace("float64"),
    "mace32": lambda: _mace("float32"),
}


@pytest.mark.parametrize("name", POTENTIALS)
def test_captured_equals_eager_on_gpu(cuda, name):
    potential = POTENTIALS[name]().cuda()
    rtol = 1e-5 if potential.spec.dtype == "float32" else 1e-12
    captured = CapturedPotential(potential)
    systems = [
        fcc_argon_222(),
        fcc_argon_222().strained(np.eye(3) * 0.02),  # within the capacities: a replay
        fcc_argon_222().strained(np.eye(3) * -0.3),  # more pairs: a capture again
    ]
    for system in systems:
        graph = _graph(system, potential.spec.cutoff)
        want = evaluate(potential, graph)
        for _ in range(3):  # replays
            got = evaluate(captured, graph)
            scale = float(want.pair_forces.abs().max())
            assert float((got.pair_forces - want.pair_forces).abs().max()) <= rtol * scale
            assert got.energy == pytest.approx(want.energy, rel=rtol)
    assert captured.eager_reason is None
    assert captured.captures == 2


@pytest.mark.parametrize("step", [True, False], ids=["whole-step", "forward-backward"])
@pytest.mark.parametrize("name", ["message_passing", "mace64"])
def test_exchanges_between_ranks_between_graph_segments(cuda, name, step):
    """Ghosts as if from other ranks (exchanged by the host, between graphs): each capture
    cut at every exchange, replayed segment by segment with the exchanges between, on the
    step's own rows. Equal to eager at replays and after a capture again; the same
    collectives as eager, none while capturing. A front door's whole step, and a pipeline
    term's forward and backward (two segmented captures on one memory pool)."""
    potential = POTENTIALS[name]().cuda()
    captured = CapturedPotential(potential)
    run = evaluate if step else _differentiated
    systems = [
        fcc_argon_222(),
        fcc_argon_222().strained(np.eye(3) * 0.02),  # within the capacities: a replay
        fcc_argon_222().strained(np.eye(3) * -0.3),  # more pairs: a capture again
    ]
    for system in systems:
        graph = _graph(system, potential.spec.cutoff, RemoteComm)
        want = run(potential, graph)
        eager_calls = graph.comm.taken()
        for _ in range(3):  # replays
            _assert_same_short_range(run(captured, graph), want)
            assert graph.comm.taken() == eager_calls
    assert captured.eager_reason is None and captured.captures == 2
    exchanges = eager_calls["forward"] + eager_calls["reverse"]
    assert exchanges > 0 and captured.collectives == exchanges
    graphs = captured._graphs
    segments = [graphs.segments] if step else [graphs.forward_graph, graphs.backward_graph]
    assert sum(len(s.graphs) for s in segments) == exchanges + len(segments)


class _TwoSums(_Summing):
    """Pair energies times their total summed over ranks twice in a row: nothing runs
    between the two collectives, forward or backward (empty graphs between the cuts)."""

    def forward(self, graph):
        r = torch.linalg.norm(graph.rij, dim=1)
        pair = torch.where(r < self.spec.cutoff, (self.spec.cutoff - r) ** 2, 0.0)
        total = graph.comm.allreduce(graph.comm.allreduce(pair.sum().view(1)))
        energies = torch.zeros(graph.ntotal, dtype=r.dtype, device=r.device)
        return energies.index_add(0, graph.pair_i, pair) * total


def test_collectives_in_a_row_between_graph_segments(cuda):
    """Two sums over ranks in a row, each differentiated: the graphs between them are empty
    and replay as nothing; equal to eager, the same collectives."""
    potential = _TwoSums()
    captured = CapturedPotential(potential)
    graph = _graph(fcc_argon_222(), potential.spec.cutoff, RemoteComm)
    want = evaluate(potential, graph)
    eager_calls = graph.comm.taken()
    assert eager_calls["sum"] == 4  # two forward, two in the backward
    for _ in range(3):
        _assert_same_short_range(evaluate(captured, graph), want)
        assert graph.comm.taken() == eager_calls
    assert captured.eager_reason is None and captured.collectives == 4


def test_mace_pair_chunks_on_gpu(cuda):
    """MACE's pair work in chunks of 100 pairs (pair_chunk) on cuEquivariance's fused
    convolution, which runs on a GPU only: eager and captured, against all pairs at once."""
    from nvalchemi_lammps.potentials.mace import _kernels

    if not _kernels._cueq_kernels_available():
        pytest.skip("cuequivariance-ops-torch is not installed")
    whole = _mace("float64", kernels="cuequivariance").cuda()
    chunked = _mace("float64", kernels="cuequivariance", pair_chunk=100).cuda()
    captured = CapturedPotential(chunked)
    graph = _graph(fcc_argon_222(), whole.spec.cutoff)
    assert graph.pair_i.shape[0] > 300  # several chunks
    assert hasattr(chunked.network.interactions[0], "conv_fusion")
    want = evaluate(whole, graph)
    scale = float(want.pair_forces.abs().max())
    for got in (evaluate(chunked, graph), *(evaluate(captured, graph) for _ in range(2))):
        assert float((got.pair_forces - want.pair_forces).abs().max()) <= 1e-12 * scale
        assert got.energy == pytest.approx(want.energy, rel=1e-12)
    assert captured.eager_reason is None


def _on_cuda(graph):
    moved = {
        f.name: getattr(graph, f.name).cuda()
        for f in dataclasses.fields(graph)
        if isinstance(getattr(graph, f.name), torch.Tensor)
    }
    return dataclasses.replace(graph, **moved)


@pytest.mark.parametrize("name", ["dftd3", *LONG_RANGE])
def test_long_range_captured_equals_eager_on_gpu(cuda, name):
    """D3's coordination numbers, Ewald's k-vectors (the whole cube with a zero-weight mask)
    and PME's mesh inside CUDA graphs: the capture, a replay in a strained cell, a capture
    again for a larger system, equal to eager in float64."""
    if name == "dftd3":
        if importlib.util.find_spec("aimnet") is None:  # D3's reference data come with it
            pytest.skip("aimnet is not installed (extra: toolkit)")
        potential = CAPTURED_ON_CPU[name]().cuda()
        graphs = [fcc_argon_222(), fcc_argon_222().strained(np.eye(3) * 0.01)]
        graphs = [_graph(system, potential.spec.cutoff) for system in graphs]
    else:
        potential = LONG_RANGE[name]().cuda()
        graphs = [_on_cuda(g) for g in long_range_graphs(name, potential.spec.cutoff)]
    same = _assert_same_short_range if name == "dftd3" else _assert_same
    captured = CapturedPotential(potential)
    for graph in graphs:
        want = evaluate(potential, graph)
        for _ in range(2):
            same(evaluate(captured, graph), want)
    assert captured.eager_reason is None
    assert captured.captures == len(graphs) - 1
