"""Ewald and PME captured on padded graphs (engine/_captured.py) against the same potentials
run eagerly, on the CPU (the static buffers "replayed" by running the potential on them
again), through a replay with another cell and a capture again when the capacities grow;
and what the forward and backward would make the host wait for on a GPU
(tests/_host_syncs.py), for them and for the potentials captured before them. A pipeline
captures Ewald, also where it reads another term's predicted charges (AIMNet2:
tests/test_captured_aimnet2.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from _host_syncs import host_syncs
from _ionic_systems import PBC, SLAB_PBC, rock_salt, slab_system
from _pipeline_terms import ELEMENTS, message_passing
from _pipeline_terms import system as argon_krypton
from _systems import OneRankComm, System, decompose, fcc_argon_222
from test_captured import POTENTIALS as CAPTURED_BEFORE

from nvalchemi_lammps import MessagePassing, Pipeline, Potential, evaluate
from nvalchemi_lammps.engine import CapturedPotential, capture_potential
from nvalchemi_lammps.potentials.ewald import Ewald
from nvalchemi_lammps.potentials.pme import Pme

SALT = ["Na", "Cl"]

#: The electrostatics captured: explicit alpha and resolution, per-atom (LAMMPS's) or
#: per-element charges, periodic or a slab.
POTENTIALS = {
    "ewald": lambda: Ewald(SALT, cutoff=5.0, alpha=0.6, kmax=5),
    "ewald_element_charges_slab": lambda: Ewald(
        SALT, cutoff=5.0, alpha=0.6, kmax=[5, 5, 12], charges={"Na": 0.8, "Cl": -0.8}, slab=3.0
    ),
    "pme": lambda: Pme(SALT, cutoff=5.0, alpha=0.6, mesh=10, order=5),
    "pme_slab": lambda: Pme(SALT, cutoff=5.0, alpha=0.6, mesh=[10, 10, 32], order=4, slab=3.0),
}


def ionic_graph(positions, cell, species, charges, cutoff, pbc=PBC, elements=SALT):
    """The whole system as one rank with ghosts (its atoms' periodic images) would hand it:
    positions of every row, the cell, LAMMPS's per-atom charges."""
    rank = decompose(System("ions", positions, cell, pbc, species, tuple(elements)), cutoff, 1)[0]
    rows = positions[rank.owner].copy()
    rows[rank.pair_j] = rows[rank.pair_i] + rank.rij  # ghosts at their images
    return rank.local_graph(
        OneRankComm(rank.owner, exchange=False),
        positions=torch.from_numpy(rows),
        cell=torch.from_numpy(np.asarray(cell, dtype=np.float64)),
        pbc=pbc,
        charges=torch.from_numpy(np.asarray(charges, dtype=np.float64)[rank.owner]),
    )


def _graphs(name: str, cutoff: float):
    """The first graph, the same atoms in a cell strained by 1 % (a replay: no count
    outgrows its capacity), and a larger system (a capture again)."""
    if "slab" in name:
        positions, cell, species, charges = slab_system()
        big = slab_system()  # 64 ions; the first graph: the 12 Na and 12 Cl of least x
        order = np.argsort(positions[:, 0], kind="stable")
        keep = np.concatenate([order[species[order] == s][:12] for s in (0, 1)])
        first = (positions[keep], cell, species[keep], charges[keep])
        pbc = SLAB_PBC
    else:
        first = rock_salt(1, displacement=0.1, seed=1)
        big = rock_salt(2, displacement=0.1, seed=2)
        pbc = PBC
    strain = np.eye(3) + np.diag([0.01, -0.005, 0.0])
    strained = (first[0] @ strain, first[1] @ strain, *first[2:])
    return [ionic_graph(*s, cutoff, pbc) for s in (first, strained, big)]


def _assert_same(got, want, rtol=1e-12):
    assert got.energy == pytest.approx(want.energy, rel=rtol, abs=1e-13)
    for field in ("atom_energies", "pair_forces", "atom_forces", "virial"):
        a, b = getattr(got, field), getattr(want, field)
        scale = float(b.abs().max())
        assert scale > 0.0, field
        assert float((a - b).abs().max()) <= rtol * scale, field


@pytest.mark.parametrize("make", POTENTIALS.values(), ids=POTENTIALS.keys())
def test_captured_equals_eager(make, request):
    """Captured (padding atoms at the origin without charge, padding pairs beyond the
    cutoff, the k-vectors or mesh fixed) equals eager in energy, per-atom energies, pair
    and atom forces and virial: at the capture, at a replay in another cell, and captured
    again for a larger system."""
    potential = make()
    captured = CapturedPotential(potential)
    first, strained, big = _graphs(request.node.callspec.id, potential.spec.cutoff)
    _assert_same(evaluate(captured, first), evaluate(potential, first))
    assert captured.captures == 1 and captured.eager_reason is None
    capacities = (captured.atom_capacity, captured.pair_capacity)
    _assert_same(evaluate(captured, strained), evaluate(potential, strained))
    assert captured.captures == 1
    _assert_same(evaluate(captured, big), evaluate(potential, big))
    assert captured.captures == 2
    assert captured.atom_capacity > capacities[0] and captured.pair_capacity > capacities[1]


def test_checks_still_run_captured():
    """The net charge is checked where the potential runs outside a capture (every
    replay on the CPU, every capture on a GPU), padded as eagerly."""
    positions, cell, species, charges = rock_salt(1)
    graph = ionic_graph(positions, cell, species, charges + 0.1, 5.0)
    with pytest.raises(ValueError, match="net charge of 0.8"):
        evaluate(CapturedPotential(POTENTIALS["ewald"]()), graph)


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda: Ewald(SALT, cutoff=5.0, accuracy=1e-5), "kmax"),
        (lambda: Ewald(SALT, cutoff=5.0, alpha=0.6, accuracy=1e-5), "kmax"),
        (lambda: Pme(SALT, cutoff=5.0, mesh=10, accuracy=1e-5), "mesh"),
    ],
    ids=["ewald_accuracy", "ewald_kmax_derived", "pme_alpha_derived"],
)
def test_derived_parameters_are_not_captured(make, what):
    """Alpha and the resolution derived from the accuracy follow the cell and the charges
    at every step: refused, saying what to give instead."""
    with pytest.raises(ValueError) as refused:
        CapturedPotential(make())
    assert str(refused.value) == (
        f"the {make().name} model cannot be captured with alpha and {what} derived from "
        f"accuracy: they follow the cell and the charges, read back from the GPU at every "
        f"step, and {what} sets the shapes; give alpha and {what} (LAMMPS's log prints the "
        "values it derives) to capture it"
    )


class _PredictsCharges(Potential):
    """Charges from the pair vectors (``q_i = c sum_j (|rij| - 4)``, no energy): a
    stand-in for a model whose charges feed Ewald."""

    name = "predicts_charges"
    predicts = ("energies", "charges")

    def __init__(self) -> None:
        super().__init__()
        self.spec = dataclasses.replace(message_passing().spec, cutoff=5.0)

    def outputs(self, graph):
        r = graph.rij.norm(dim=1)
        q = torch.zeros(graph.ntotal, dtype=r.dtype).index_add(0, graph.pair_i, 0.05 * (r - 4.0))
        q = graph.comm.forward_exchange(q)
        return {"energies": torch.zeros_like(q), "charges": q}

    def forward(self, graph):
        return self.outputs(graph)["energies"]


def test_pipeline_captures_ewald_also_where_it_reads_predicted_charges():
    """Ewald in a pipeline is captured with the other terms; one that reads another
    term's predicted charges too, with them as a differentiable input of its graphs (their
    derivative carries the predicting term's share of the forces), while the predicting
    term runs eagerly: equal to eager both ways."""
    positions, cell, species = argon_krypton(cells=1)
    graph = ionic_graph(positions, cell, species, np.zeros(len(species)), 6.0, PBC, ELEMENTS)
    graph = dataclasses.replace(graph, charges=None)
    ewald = Ewald(ELEMENTS, cutoff=6.0, alpha=0.45, kmax=5, charges={"Ar": 0.4, "Kr": -0.4})
    fixed = Pipeline([message_passing(), ewald])
    captured = capture_potential(fixed)
    assert [type(t) for t in captured.terms] == [CapturedPotential] * 2
    _assert_same(evaluate(captured, graph), evaluate(fixed, graph))

    reading = Ewald(ELEMENTS, cutoff=6.0, alpha=0.45, kmax=5, background=True)
    predicted = Pipeline([_PredictsCharges(), message_passing(), reading], [None, None, 0])
    captured = capture_potential(predicted)
    assert [type(t) for t in captured.terms] == [_PredictsCharges, *[CapturedPotential] * 2]
    _assert_same(evaluate(captured, graph), evaluate(predicted, graph))


# --- host synchronizations -------------------------------------------------------------


def _argon_graph(cutoff: float):
    rank = decompose(fcc_argon_222(), cutoff, 1)[0]
    return rank.local_graph(OneRankComm(rank.owner, exchange=True))


@pytest.mark.parametrize(
    ("make", "graph"),
    [
        *(
            (make, lambda p, name=name: _graphs(name, p.spec.cutoff)[0])
            for name, make in POTENTIALS.items()
        ),
        *(
            pytest.param(
                make,
                lambda p: _argon_graph(p.spec.cutoff),
                marks=[pytest.mark.slow] * (name == "mace"),
            )
            for name, make in CAPTURED_BEFORE.items()
        ),
    ],
    ids=[*POTENTIALS, *CAPTURED_BEFORE],
)
def test_no_host_synchronization_when_captured(make, graph):
    """Run on a padded graph as inside a capture, forward and backward, nothing would make
    the host wait for the GPU (no value read back, no shape from values, no host data
    copied to the device), and the energies are eager's."""
    potential = make()
    g = graph(potential)
    found, energies = host_syncs(potential, g)
    assert found == []
    want = evaluate(potential, g).atom_energies
    assert float((energies[: g.nlocal] - want).abs().max()) <= 1e-12 * float(want.abs().max())


class _Syncing(Potential):
    """Pair energies, with every kind of host synchronization the check looks for."""

    name = "syncing"

    def __init__(self) -> None:
        super().__init__()
        self.spec = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=1).spec

    def forward(self, graph):
        r = graph.rij.norm(dim=1)
        inside = r < float(r.detach().max())  # a value read back
        pair = (self.spec.cutoff - r[inside]) ** 2  # a boolean mask
        scale = torch.tensor(2.0)  # host data
        e = torch.zeros(graph.ntotal, dtype=r.dtype).index_add(0, graph.pair_i[inside], pair)
        return e * scale * torch.linalg.inv(torch.eye(3, dtype=r.dtype))[0, 0]

    def prepare_capture(self):
        return self


def test_the_check_finds_host_synchronizations():
    """The check is not blind: a potential that reads a value back, indexes by a mask,
    makes a tensor from host data and inverts through torch.linalg is caught at each."""
    found, _ = host_syncs(_Syncing(), _argon_graph(5.0))
    reasons = " ".join(found)
    for what in ("read back", "boolean-mask", "host data", "torch.linalg"):
        assert what in reasons, (what, found)
