"""The single-process reference evaluator: its pair list, its outputs' conventions and its
input checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _systems import (
    cluster_ar_ne,
    fcc_argon,
    fcc_argon_222,
    lennard_jones,
    slab_argon,
    triclinic_ar_ne,
)

from nvalchemi_lammps.reference import (
    NKTV2P,
    ReferenceResult,
    evaluate_atoms,
    evaluate_reference,
    neighbor_pairs,
)

SYSTEMS = [fcc_argon(), fcc_argon_222(), triclinic_ar_ne(), slab_argon(), cluster_ar_ne()]


def _canonical(i, j, shifts, rij):
    order = np.lexsort((shifts[:, 2], shifts[:, 1], shifts[:, 0], j, i))
    return i[order], j[order], shifts[order], rij[order]


@pytest.mark.parametrize("cutoff", [3.0, 8.5], ids=["short", "long"])
@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.name)
def test_pair_list_matches_ase(system, cutoff):
    ase = pytest.importorskip("ase")
    from ase.neighborlist import neighbor_list

    atoms = ase.Atoms(
        numbers=np.full(system.natoms, 18),
        positions=system.positions,
        cell=system.cell,
        pbc=system.pbc,
    )
    expected = _canonical(*neighbor_list("ijSD", atoms, cutoff))
    p = neighbor_pairs(system.positions, system.cell, system.pbc, cutoff)
    got = _canonical(p.pair_i, p.pair_j, p.shifts, p.rij)
    assert len(got[0]) == len(expected[0])
    for a, b in zip(got[:3], expected[:3]):
        assert np.array_equal(a, b)
    np.testing.assert_allclose(got[3], expected[3], rtol=0, atol=1e-12)
    assert got[0].dtype == np.int64 and got[2].dtype == np.int64 and got[3].dtype == np.float64


def test_rij_is_image_of_j_minus_i():
    system = triclinic_ar_ne()
    p = neighbor_pairs(system.positions, system.cell, system.pbc, 7.0)
    expected = system.positions[p.pair_j] + p.shifts @ system.cell - system.positions[p.pair_i]
    np.testing.assert_allclose(p.rij, expected, rtol=0, atol=1e-12)
    assert np.all(np.linalg.norm(p.rij, axis=1) < 7.0)


def test_no_atoms():
    system = fcc_argon()
    ref = evaluate_reference(
        lennard_jones(system), np.zeros((0, 3)), system.cell, system.pbc, np.zeros(0, np.int64)
    )
    assert ref.energy == 0.0
    assert ref.atom_energies.shape == (0,) and ref.forces.shape == (0, 3)
    assert ref.atom_virials.shape == (0, 6) and ref.pair_forces.shape == (0, 3)
    assert np.array_equal(ref.virial, np.zeros((3, 3)))


def _result_with_virial(virial: np.ndarray) -> ReferenceResult:
    empty = np.zeros(0)
    return ReferenceResult(
        0.0, empty, np.zeros((0, 3)), virial, np.zeros((0, 6)), None, np.zeros((0, 3))
    )


def test_voigt_order_is_lammps():
    virial = np.array([[1.0, 4.0, 5.0], [4.0, 2.0, 6.0], [5.0, 6.0, 3.0]])
    assert _result_with_virial(virial).virial_voigt.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_pressure():
    virial = np.array([[1.0, 0.5, 0.0], [0.5, 2.0, 0.0], [0.0, 0.0, 3.0]])
    kinetic = np.diag([0.3, 0.3, 0.6])
    result = _result_with_virial(virial)
    np.testing.assert_array_equal(result.pressure(2.0), virial / 2.0)
    np.testing.assert_array_equal(result.pressure(2.0, kinetic), (virial + kinetic) / 2.0)
    np.testing.assert_allclose(
        result.pressure(2.0, units="metal"), virial / 2.0 * 1.6021765e6, rtol=1e-15
    )
    np.testing.assert_allclose(
        result.pressure(2.0, units="real"), virial / 2.0 * 68568.415, rtol=1e-15
    )
    assert set(NKTV2P) == {"metal", "real"}
    # the scalar pressure LAMMPS prints: trace / 3
    assert np.trace(result.pressure(2.0)) / 3 == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"volume": 0.0}, "volume must be positive, got 0.0"),
        (
            {"volume": 1.0, "kinetic": np.zeros(3)},
            "kinetic tensor must have shape (3, 3), got (3,)",
        ),
        ({"volume": 1.0, "units": "lj"}, "units must be one of metal, real; got 'lj'"),
    ],
    ids=["volume", "kinetic-shape", "units"],
)
def test_pressure_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _result_with_virial(np.eye(3)).pressure(**kwargs)


def test_lj_pressure_is_minus_volume_derivative():
    """Isotropic check tying the virial convention to thermodynamics: P = -dE/dV."""
    system = fcc_argon()
    potential = lennard_jones(system, shift=True)
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    h = 1e-6
    energies = [
        evaluate_reference(potential, s.positions, s.cell, s.pbc, s.species).energy
        for s in (system.strained(np.eye(3) * h), system.strained(-np.eye(3) * h))
    ]
    dv = system.volume * ((1 + h) ** 3 - (1 - h) ** 3)
    pressure = np.trace(ref.pressure(system.volume)) / 3
    assert pressure == pytest.approx(-(energies[0] - energies[1]) / dv, rel=1e-6)


def test_evaluate_atoms():
    ase = pytest.importorskip("ase")
    system = triclinic_ar_ne()
    symbols = [system.elements[s] for s in system.species]
    atoms = ase.Atoms(symbols=symbols, positions=system.positions, cell=system.cell, pbc=system.pbc)
    potential = lennard_jones(system)
    direct = evaluate_reference(
        potential, system.positions, system.cell, system.pbc, system.species
    )
    via_atoms = evaluate_atoms(potential, atoms)
    assert via_atoms.energy == direct.energy
    assert np.array_equal(via_atoms.forces, direct.forces)

    names = ["Ar", "NULL", "Ar", "Ne", "Ne", "Ar"]
    species = np.array([0, -1, 0, 1, 1, 0])
    renamed = evaluate_atoms(potential, atoms, names)
    expected = evaluate_reference(potential, system.positions, system.cell, system.pbc, species)
    assert renamed.energy == expected.energy

    with pytest.raises(ValueError, match=re.escape("element Kr not in model (Ar, Ne)")):
        evaluate_atoms(potential, ase.Atoms("Kr", positions=[[0, 0, 0]]))
    with pytest.raises(ValueError, match=re.escape("2 element names for 6 atoms")):
        evaluate_atoms(potential, atoms, ["Ar", "Ne"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"species": np.zeros(3, np.int64)},
            "species must have shape (6,) like positions, got (3,)",
        ),
        (
            {"species": np.array([0, 1, 2, 0, 1, 0])},
            "species must lie in [-1, 2) for a model of 2 elements, got values in [0, 2]",
        ),
        (
            {"species": np.array([0, 1, -2, 0, 1, 0])},
            "species must lie in [-1, 2) for a model of 2 elements, got values in [-2, 1]",
        ),
        ({"cell": np.eye(2)}, "cell must have shape (3, 3), got (2, 2)"),
        ({"pbc": (True, True)}, "pbc must have 3 entries, got 2"),
    ],
    ids=["species-shape", "species-too-large", "species-too-small", "cell-shape", "pbc-length"],
)
def test_input_errors(change, message):
    system = triclinic_ar_ne()
    args = {
        "positions": system.positions,
        "cell": system.cell,
        "pbc": system.pbc,
        "species": system.species,
    } | change
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate_reference(lennard_jones(system), **args)


def test_positions_shape_error():
    message = "positions must have shape (N, 3), got (4, 2)"
    with pytest.raises(ValueError, match=re.escape(message)):
        neighbor_pairs(np.zeros((4, 2)), np.eye(3), (True,) * 3, 2.0)
    with pytest.raises(ValueError, match=re.escape(message)):
        evaluate_reference(
            lennard_jones(fcc_argon()), np.zeros((4, 2)), np.eye(3), (True,) * 3, np.zeros(4)
        )
