"""Lennard-Jones against an independent brute-force numpy implementation and LAMMPS's
``lj/cut`` formulas."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
import torch
from _systems import (
    System,
    cluster_ar_ne,
    fcc_argon,
    fcc_argon_222,
    image_ranges,
    lennard_jones,
    local_graph,
    slab_argon,
    triclinic_ar_ne,
)

from nvalchemi_lammps import LennardJones, evaluate
from nvalchemi_lammps.reference import evaluate_reference, neighbor_pairs

SYSTEMS = [fcc_argon(), fcc_argon_222(), triclinic_ar_ne(), slab_argon(), cluster_ar_ne()]
SYSTEM_IDS = [s.name for s in SYSTEMS]


def _tables(potential: LennardJones) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per element pair (eps, sig, cut) from the potential's config, mixed by hand."""
    cfg = potential.config()
    elements = cfg["elements"]
    n = len(elements)
    eps, sig = np.zeros((n, n)), np.zeros((n, n))
    cut = np.full((n, n), cfg["cutoff"])
    for a, b in itertools.product(range(n), repeat=2):
        ei, ej = cfg["epsilon"][elements[a]], cfg["epsilon"][elements[b]]
        si, sj = cfg["sigma"][elements[a]], cfg["sigma"][elements[b]]
        assert cfg["mixing"] == "geometric"
        eps[a, b], sig[a, b] = math.sqrt(ei * ej), math.sqrt(si * sj)
    for pair in cfg["pairs"]:
        a, b = (elements.index(e) for e in pair["elements"])
        for key, table in (("epsilon", eps), ("sigma", sig), ("cutoff", cut)):
            if key in pair:
                table[a, b] = table[b, a] = pair[key]
    return eps, sig, cut


def brute_force(system: System, potential: LennardJones) -> dict[str, np.ndarray]:
    """E, per-atom E, forces, virial and per-atom virial by an explicit loop over lattice
    images (no neighbor list, no minimum image, no torch)."""
    eps, sig, cut = _tables(potential)
    shift = potential.config()["shift"]
    images = np.array(list(itertools.product(*image_ranges(system, cut.max()))), dtype=float)
    x = system.positions
    d = x[None, :, None, :] + (images @ system.cell)[None, None, :, :] - x[:, None, None, :]
    r2 = (d * d).sum(axis=-1)  # (N, N, images)
    s = system.species
    e_ij, s_ij, c_ij = (t[s][:, s][:, :, None] for t in (eps, sig, cut))
    inside = (r2 < c_ij**2) & (r2 > 0.0)
    r2 = np.where(inside, r2, 1.0)
    sr6 = (s_ij**2 / r2) ** 3
    u = 4.0 * e_ij * (sr6 * sr6 - sr6)
    if shift:
        sc6 = (s_ij / c_ij) ** 6
        u = u - 4.0 * e_ij * (sc6 * sc6 - sc6)
    du_over_r = 4.0 * e_ij * (-12.0 * sr6 * sr6 + 6.0 * sr6) / r2
    u, du_over_r = np.where(inside, u, 0.0), np.where(inside, du_over_r, 0.0)
    atom_energies = 0.5 * u.sum(axis=(1, 2))
    forces = (du_over_r[..., None] * d).sum(axis=(1, 2))
    w = -du_over_r[..., None, None] * d[..., :, None] * d[..., None, :]  # (N, N, M, 3, 3)
    atom_w = 0.5 * w.sum(axis=(1, 2))
    voigt = np.stack(
        [atom_w[:, a, b] for a, b in ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))], 1
    )
    return {
        "energy": atom_energies.sum(),
        "atom_energies": atom_energies,
        "forces": forces,
        "virial": atom_w.sum(axis=0),
        "atom_virials": voigt,
    }


def _reference(system: System, potential) -> object:
    return evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)


def _close(actual, expected, rtol=1e-11):
    scale = max(float(np.abs(expected).max()), 1e-300)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


# --- against the brute-force implementation ------------------------------------------------


@pytest.mark.parametrize("shift", [False, True], ids=["plain", "shift"])
@pytest.mark.parametrize("system", SYSTEMS, ids=SYSTEM_IDS)
def test_matches_brute_force(system, shift):
    potential = lennard_jones(system, shift=shift)
    ref = _reference(system, potential)
    expected = brute_force(system, potential)
    assert len(ref.pairs.pair_i) > 0
    assert abs(ref.energy - expected["energy"]) <= 1e-11 * abs(expected["energy"])
    for key in ("atom_energies", "forces", "virial", "atom_virials"):
        _close(getattr(ref, key), expected[key])
    np.testing.assert_allclose(
        ref.atom_virials.sum(axis=0), ref.virial_voigt, rtol=1e-12, atol=1e-15
    )


def test_small_cell_lists_own_images():
    """In the 4-atom fcc cell each atom is its own neighbor many times over."""
    system = fcc_argon()
    pairs = neighbor_pairs(system.positions, system.cell, system.pbc, 8.5)
    own = pairs.pair_i == pairs.pair_j
    assert own.sum() > 0 and np.all(np.abs(pairs.shifts[own]).sum(axis=1) > 0)
    # Every pair is listed in both directions with opposite shifts.
    forward = {(i, j, *s) for i, j, s in zip(pairs.pair_i, pairs.pair_j, pairs.shifts.tolist())}
    backward = {
        (j, i, *(-np.array(s)))
        for i, j, s in zip(pairs.pair_i, pairs.pair_j, pairs.shifts.tolist())
    }
    assert forward == backward


# --- finite differences --------------------------------------------------------------------


def _energy(system: System, potential) -> float:
    return _reference(system, potential).energy


@pytest.mark.parametrize(
    "system", [fcc_argon(), triclinic_ar_ne(), slab_argon(), cluster_ar_ne()], ids=lambda s: s.name
)
def test_forces_are_minus_energy_gradient(system):
    potential = lennard_jones(system, shift=True)
    forces = _reference(system, potential).forces
    h = 1e-5
    numeric = np.zeros_like(forces)
    for a, k in itertools.product(range(system.natoms), range(3)):
        plus, minus = system.positions.copy(), system.positions.copy()
        plus[a, k] += h
        minus[a, k] -= h
        e_plus = _energy(
            System(system.name, plus, system.cell, system.pbc, system.species, system.elements),
            potential,
        )
        e_minus = _energy(
            System(system.name, minus, system.cell, system.pbc, system.species, system.elements),
            potential,
        )
        numeric[a, k] = -(e_plus - e_minus) / (2 * h)
    _close(forces, numeric, rtol=1e-6)


@pytest.mark.parametrize("system", [fcc_argon(), triclinic_ar_ne()], ids=lambda s: s.name)
def test_virial_is_minus_strain_derivative(system):
    """Under ``x -> x (1 + eps)``, ``dE/deps_ab = sum rij_a fij_b = -W_ab``."""
    potential = lennard_jones(system, shift=True)
    virial = _reference(system, potential).virial
    h = 1e-6
    numeric = np.zeros((3, 3))
    for a, b in itertools.product(range(3), repeat=2):
        strain = np.zeros((3, 3))
        strain[a, b] = h
        numeric[a, b] = -(
            _energy(system.strained(strain), potential)
            - _energy(system.strained(-strain), potential)
        ) / (2 * h)
    _close(virial, numeric, rtol=1e-6)
    np.testing.assert_allclose(virial, virial.T, atol=1e-12 * np.abs(virial).max())


# --- mixing, explicit pairs, cutoffs, shift ------------------------------------------------

EPSILON = {"Ar": 1.0, "Ne": 0.25}
SIGMA = {"Ar": 1.0, "Ne": 2.0}


def _dimer_energy(potential, a: int, b: int, r: float) -> tuple[float, float]:
    """Energy and force on atom 1 along x of an isolated dimer at distance ``r``."""
    ref = evaluate_reference(
        potential,
        np.array([[0.0, 0.0, 0.0], [r, 0.0, 0.0]]),
        np.zeros((3, 3)),
        (False, False, False),
        np.array([a, b]),
    )
    np.testing.assert_allclose(ref.forces[0], -ref.forces[1], atol=1e-15)
    return ref.energy, float(ref.forces[1, 0])


def _lj(eps: float, sig: float, r: float) -> tuple[float, float]:
    """4 eps ((s/r)^12 - (s/r)^6) and its force -dE/dr."""
    sr6 = (sig / r) ** 6
    return 4 * eps * (sr6 * sr6 - sr6), 4 * eps * (12 * sr6 * sr6 - 6 * sr6) / r


@pytest.mark.parametrize(
    ("mixing", "eps", "sig"),
    [
        ("geometric", 0.5, math.sqrt(2.0)),
        ("arithmetic", 0.5, 1.5),
        ("sixthpower", 8.0 / 65.0, 32.5 ** (1.0 / 6.0)),
    ],
    ids=["geometric", "arithmetic", "sixthpower"],
)
def test_mixing_rules(mixing, eps, sig):
    potential = LennardJones(["Ar", "Ne"], EPSILON, SIGMA, cutoff=5.0, mixing=mixing)
    for r in (1.3, 1.9, 3.1):
        energy, force = _dimer_energy(potential, 0, 1, r)
        np.testing.assert_allclose((energy, force), _lj(eps, sig, r), rtol=1e-13)
    # Like pairs keep their own parameters under every rule.
    np.testing.assert_allclose(_dimer_energy(potential, 0, 0, 1.2), _lj(1.0, 1.0, 1.2), rtol=1e-13)
    np.testing.assert_allclose(_dimer_energy(potential, 1, 1, 2.5), _lj(0.25, 2.0, 2.5), rtol=1e-13)


def test_explicit_pair_parameters_and_cutoff():
    pairs = [{"elements": ["Ne", "Ar"], "epsilon": 0.3, "sigma": 1.7, "cutoff": 3.0}]
    potential = LennardJones(["Ar", "Ne"], EPSILON, SIGMA, cutoff=5.0, pairs=pairs)
    assert potential.spec.cutoff == 5.0
    np.testing.assert_allclose(_dimer_energy(potential, 0, 1, 2.5), _lj(0.3, 1.7, 2.5), rtol=1e-13)
    np.testing.assert_allclose(_dimer_energy(potential, 1, 0, 2.5), _lj(0.3, 1.7, 2.5), rtol=1e-13)
    assert _dimer_energy(potential, 0, 1, 3.5) == (0.0, 0.0)  # beyond the pair's own cutoff
    assert _dimer_energy(potential, 0, 0, 3.5)[0] == pytest.approx(_lj(1.0, 1.0, 3.5)[0], rel=1e-13)


def test_pair_cutoff_beyond_global_widens_the_model_cutoff():
    pairs = [{"elements": ["Ar", "Ne"], "cutoff": 6.0}]
    potential = LennardJones(["Ar", "Ne"], EPSILON, SIGMA, cutoff=5.0, pairs=pairs)
    assert potential.spec.cutoff == 6.0
    # sigma of the pair still comes from mixing: only the cutoff was given
    np.testing.assert_allclose(
        _dimer_energy(potential, 0, 1, 5.5), _lj(0.5, math.sqrt(2.0), 5.5), rtol=1e-13
    )
    assert _dimer_energy(potential, 0, 0, 5.5) == (0.0, 0.0)


def test_shift_zeroes_energy_at_cutoff_and_keeps_forces():
    plain = LennardJones(["Ar"], {"Ar": 1.0}, {"Ar": 1.0}, cutoff=2.5)
    shifted = LennardJones(["Ar"], {"Ar": 1.0}, {"Ar": 1.0}, cutoff=2.5, shift=True)
    offset = _lj(1.0, 1.0, 2.5)[0]
    for r in (1.1, 2.0, 2.4999):
        e_plain, f_plain = _dimer_energy(plain, 0, 0, r)
        e_shift, f_shift = _dimer_energy(shifted, 0, 0, r)
        assert e_shift == pytest.approx(e_plain - offset, rel=1e-12, abs=1e-15)
        assert f_shift == pytest.approx(f_plain, rel=1e-13)
    assert abs(_dimer_energy(shifted, 0, 0, 2.4999)[0]) < 1e-5
    assert _dimer_energy(shifted, 0, 0, 2.6) == (0.0, 0.0)


# --- precision -------------------------------------------------------------------------------


@pytest.mark.parametrize("system", [fcc_argon(), triclinic_ar_ne()], ids=lambda s: s.name)
def test_float32_agrees_with_float64(system):
    p64 = lennard_jones(system, shift=True)
    p32 = lennard_jones(system, shift=True, dtype="float32")
    assert p32.lj3.dtype == torch.float32 and p32.spec.torch_dtype == torch.float32
    ref64, ref32 = _reference(system, p64), _reference(system, p32)
    assert ref32.energy == pytest.approx(ref64.energy, rel=1e-5)
    _close(ref32.forces, ref64.forces, rtol=1e-4)
    _close(ref32.virial, ref64.virial, rtol=1e-4)
    assert not np.array_equal(ref32.forces, ref64.forces)  # float32 really was used

    pairs = ref64.pairs
    result = evaluate(p32, local_graph(system.natoms, system.species, pairs))
    assert result.pair_forces.dtype == torch.float64
    assert result.atom_energies.dtype == torch.float64


def test_config_round_trip():
    potential = LennardJones(
        ["Ar", "Ne"],
        EPSILON,
        SIGMA,
        cutoff=5.0,
        mixing="arithmetic",
        shift=True,
        pairs=[{"elements": ["Ar", "Ne"], "sigma": 1.4}],
        units="real",
        dtype="float32",
    )
    again = LennardJones.from_config(potential.config())
    assert again.config() == potential.config()
    assert again.spec == potential.spec
    for name, buffer in potential.state_dict().items():
        assert torch.equal(buffer, again.state_dict()[name])


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"mixing": "harmonic"},
            "mixing must be one of geometric, arithmetic, sixthpower; got 'harmonic'",
        ),
        ({"epsilon": {"Ar": 1.0}}, "epsilon missing for element(s) Ne"),
        ({"sigma": {}}, "sigma missing for element(s) Ar, Ne"),
        (
            {"pairs": [{"elements": ["Ar", "Xe"], "epsilon": 1.0}]},
            (
                "pair entry {'elements': ['Ar', 'Xe'], 'epsilon': 1.0} "
                "must name two of the elements ['Ar', 'Ne']"
            ),
        ),
        (
            {"pairs": [{"elements": ["Ar"], "epsilon": 1.0}]},
            (
                "pair entry {'elements': ['Ar'], 'epsilon': 1.0} "
                "must name two of the elements ['Ar', 'Ne']"
            ),
        ),
        (
            {"pairs": [{"epsilon": 1.0}]},
            "pair entry {'epsilon': 1.0} must name two of the elements ['Ar', 'Ne']",
        ),
        (
            {"pairs": [{"elements": ["Ar", "Ne"], "eps": 1.0, "rc": 2}]},
            "unknown pair parameter(s) eps, rc",
        ),
        ({"cutoff": 0.0}, "cutoff must be positive, got 0.0"),
        ({"units": "lj"}, "units must be one of metal, real; got 'lj'"),
        ({"dtype": "float16"}, "dtype must be one of float32, float64; got 'float16'"),
        ({"elements": ["Ar", "Ar"]}, "duplicate element names in ['Ar', 'Ar']"),
        ({"elements": []}, "a model needs at least one element"),
    ],
    ids=[
        "unknown-mixing",
        "missing-epsilon",
        "missing-sigma",
        "pair-unknown-element",
        "pair-one-element",
        "pair-no-elements",
        "pair-unknown-parameter",
        "zero-cutoff",
        "bad-units",
        "bad-dtype",
        "duplicate-elements",
        "no-elements",
    ],
)
def test_constructor_errors(kwargs, message):
    args = {"elements": ["Ar", "Ne"], "epsilon": EPSILON, "sigma": SIGMA, "cutoff": 5.0} | kwargs
    with pytest.raises(ValueError, match=re.escape(message)):
        LennardJones(**args)


# --- closed form -------------------------------------------------------------------------------


def _with_null_atom(system: System) -> np.ndarray:
    species = system.species.copy()
    species[3] = -1
    return species


@pytest.mark.parametrize("null", [False, True], ids=["all-mapped", "null-atom"])
@pytest.mark.parametrize("shift", [False, True], ids=["plain", "shift"])
@pytest.mark.parametrize("system", [fcc_argon(), triclinic_ar_ne()], ids=lambda s: s.name)
def test_closed_form_equals_autograd(system, shift, null):
    """The engine takes energies and pair forces from ``pair_terms`` (no autograd): the same
    as differentiating ``forward``, per atom and per pair, one element or several."""
    potential = lennard_jones(system, shift=shift)
    species = _with_null_atom(system) if null else system.species
    pairs = neighbor_pairs(system.positions, system.cell, system.pbc, potential.spec.cutoff)
    graph = local_graph(system.natoms, species, pairs)
    closed = evaluate(potential, graph)
    potential.pair_terms = lambda graph: None  # no closed form: autograd of forward
    differentiated = evaluate(potential, graph)
    _close(closed.atom_energies.numpy(), differentiated.atom_energies.numpy(), rtol=1e-14)
    _close(closed.pair_forces.numpy(), differentiated.pair_forces.numpy(), rtol=1e-13)
    assert closed.energy == pytest.approx(differentiated.energy, rel=1e-14)
    if null:
        touching = (pairs.pair_i == 3) | (pairs.pair_j == 3)
        assert touching.any() and not closed.pair_forces.numpy()[touching].any()
