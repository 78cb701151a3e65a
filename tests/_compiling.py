"""What the compiled-potential tests (tests/test_compiled.py, tests/test_compiled_mace.py)
share: a rank's comm on one process, the potentials they compile, the comparison with
eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _systems import decompose, fcc_argon_222

from nvalchemi_lammps import evaluate
from nvalchemi_lammps.contract import Comm, with_adjoint
from nvalchemi_lammps.engine import CompiledPotential


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


class ExchangeComm(OwnerComm):
    """The exchange strategy's collectives: ghost rows only ever hold their owners'
    features, so the potentials update owned rows only."""

    exchange = True


def evaluate_on(potential, graph, comm):
    return evaluate(potential, graph.local_graph(comm))


def assert_same(got, want, rtol=1e-12):
    scale = float(want.pair_forces.abs().max())
    assert scale > 0.0
    assert float((got.pair_forces - want.pair_forces).abs().max()) <= rtol * scale
    assert got.energy == pytest.approx(want.energy, rel=rtol)
    energies = want.atom_energies.abs().max()
    assert float((got.atom_energies - want.atom_energies).abs().max()) <= rtol * energies


def one_rank(system, cutoff):
    """``system`` on one rank, and its :class:`OwnerComm`."""
    graph = decompose(system, cutoff, 1)[0]
    assert graph.ntotal > graph.nlocal  # ghosts, so exchanges copy something
    return graph, OwnerComm(graph.owner, graph.nlocal)


def mace():
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(random_mace(), dtype="float64")


def assert_compiled_equals_eager(potential):
    """``potential`` compiled equals it eager on fcc argon's rank (energy, per-atom
    energies, pair forces to 1e-12), the exchanges inside the compiled forward and backward;
    one graph compiled, with capacities above the graph's sizes."""
    compiled = CompiledPotential(potential)
    graph, comm = one_rank(fcc_argon_222(), potential.spec.cutoff)
    want = evaluate_on(potential, graph, comm)
    got = evaluate_on(compiled, graph, comm)
    assert_same(got, want)
    if potential.spec.layers > 1:  # the exchanges ran inside the compiled forward and backward
        assert comm.calls == 4 * (potential.spec.layers - 1)
    assert compiled.compilations == 1
    assert compiled.atom_capacity > graph.ntotal and compiled.pair_capacity > len(graph.pair_i)
