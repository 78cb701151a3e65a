"""MACE under ``torch.compile`` on padded graphs (engine/_compiled.py), its own paths: every
row's features (no exchange strategy: the interaction blocks on all rows, the layers'
features exchanged in between) equal to eager; with the exchange strategy, exchanges inside
its blocks at mace-torch's hook point, and on a rank without pairs as many as eagerly.
(MACE on owned rows with the exchange strategy, equal to eager: tests/test_compiled.py.)
And MACE's blocks compiled inside a capture (``compile_blocks``), equal to eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _compiling import ExchangeComm, assert_compiled_equals_eager, evaluate_on, mace
from _systems import decompose, fcc_argon_222

from nvalchemi_lammps import evaluate
from nvalchemi_lammps.contract import Comm
from nvalchemi_lammps.engine import CapturedPotential, CompiledPotential

# every test compiles (minutes of CPU each): make check leaves them out
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Compiled code is cached per function across instances: each test starts empty, so
    that it counts its own compilations."""
    torch._dynamo.reset()


def test_compiled_on_every_row_equals_eager():
    """MACE without the exchange strategy: every row's features, exchanged between the
    layers, compiled equal to eager (_compiling.assert_compiled_equals_eager)."""
    assert_compiled_equals_eager(mace())


def test_mace_compiled_exchanges_inside_its_blocks(monkeypatch):
    """Compiled, MACE runs its blocks as it does eagerly (tests/test_compiled.py's
    test_exchange_strategy_on_owned_rows compares the two): exchanging at mace-torch's own hook point after each interaction's
    ``linear_up``, owned rows only, not the whole layers' features in between. (A separate
    compilation: the recording is state the compiled code guards on.) On torch 2.11 the
    comparison of test_exchange_strategy_on_owned_rows fails if the hook goes through
    mace-torch's ``LAMMPS_MP`` (zero gradients into the exchange; mace._handle_lammps_traced).
    What is traced is settled when torch's tracer runs the Python code, before the backend
    sees the graph: the graph runs as traced, without inductor's code generation (most of a
    compilation's CPU, and the rest of these tests have it)."""
    from nvalchemi_lammps.potentials.mace import _forward as mace_forward

    def traced_only(self, graph_module, inputs):
        self.compilations += 1
        return graph_module.forward

    monkeypatch.setattr(CompiledPotential, "_backend", traced_only)

    potential = mace()  # before the recording: its check against mace-torch runs one rank
    paths = []

    def recording(name, run):
        def recorded(*args):
            paths.append(name)  # once, when the compiler traces it
            return run(*args)

        return recorded

    for name in ("_owned_features", "_row_features"):
        monkeypatch.setattr(mace_forward, name, recording(name, getattr(mace_forward, name)))
    graph = decompose(fcc_argon_222(), potential.spec.cutoff, 1)[0]
    compiled = CompiledPotential(potential)
    evaluate_on(compiled, graph, ExchangeComm(graph.owner, graph.nlocal))
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
    ranks waited for ever). Through inductor, whose dead code elimination dropped it."""
    potential = mace()
    empty = decompose(fcc_argon_222(), potential.spec.cutoff, 4, nslabs=2)[3]
    assert empty.nlocal == 0 and len(empty.pair_i) == 0 and empty.ntotal > 0
    calls = []
    for run in (potential, CompiledPotential(potential)):
        comm = CountingComm()
        evaluate(run, empty.local_graph(comm))
        calls.append(comm.calls)
    assert calls[0] == calls[1] == ["forward", "reverse"], calls


def test_mace_blocks_captured_again_compile_nothing():
    """A pair style made again on the same file takes the same potential (the session keeps
    the last one opened): captured again, at the sizes seen before, its blocks compile
    nothing. (On e3nn's kernels: cuEquivariance's CPU fallback traces its kernels again,
    new classes that torch's guards tell apart.)"""
    from _mace_models import random_mace
    from test_captured import _assert_same, _graph
    from torch._dynamo.utils import counters

    from nvalchemi_lammps.potentials.mace import Mace

    counters.clear()
    potential = Mace.from_model(random_mace(), dtype="float64", kernels="e3nn", compile_blocks=True)
    graph = _graph(fcc_argon_222(), potential.spec.cutoff)
    _assert_same(evaluate(CapturedPotential(potential), graph), evaluate(potential, graph))
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    _assert_same(evaluate(CapturedPotential(potential), graph), evaluate(potential, graph))
    assert counters["stats"]["unique_graphs"] == compiled


def test_mace_blocks_compiled_inside_the_capture():
    """MACE with ``compile_blocks`` (on cuEquivariance's kernels; their CPU fallback here):
    captured, its blocks run compiled and the evaluation equals the eager model's to 1e-10
    in float64, also after the capacities grow (the blocks compiled again, for any shape),
    and with ghost features from other ranks (the exchanges between the graphs, outside the
    compiled code)."""
    from _mace_models import random_mace
    from _systems import RemoteComm
    from test_captured import _assert_same, _graph
    from torch._dynamo.utils import counters

    from nvalchemi_lammps.potentials.mace import Mace

    counters.clear()
    potential = Mace.from_model(
        random_mace(), dtype="float64", kernels="cuequivariance", compile_blocks=True
    )
    captured = CapturedPotential(potential)
    graph = _graph(fcc_argon_222(), potential.spec.cutoff)
    for _ in range(2):  # the capture, then a replay
        _assert_same(evaluate(captured, graph), evaluate(potential, graph), rtol=1e-10)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0 and captured.captures == 1
    dense = _graph(fcc_argon_222().strained(np.eye(3) * -0.3), potential.spec.cutoff)
    _assert_same(evaluate(captured, dense), evaluate(potential, dense), rtol=1e-10)
    assert captured.captures == 2
    compiled = counters["stats"]["unique_graphs"]

    several = CapturedPotential(potential)
    remote = _graph(fcc_argon_222(), potential.spec.cutoff, RemoteComm)
    want = evaluate(potential, remote)
    eager_calls = remote.comm.taken()
    for _ in range(2):
        _assert_same(evaluate(several, remote), want, rtol=1e-10)
        assert remote.comm.taken() == eager_calls
    assert several.eager_reason is None and several.collectives == 2
