"""UMA (fairchem-core's eSCN-MD backbone) as a potential, without LAMMPS.

- the potential on a whole periodic system equals fairchem's own backbone and head forward,
  fairchem building its own radius graph, same weights (energy, forces, virial), for
  several charges, spins and tasks, with and without charge / spin channel balancing;
- systems split over 1 to 4 ranks (one of them empty), with node embeddings exchanged
  between blocks (``exchange``) or a widened ghost shell (``shell``), equal it too;
- float32 models, model files, ``nvalchemi-lammps export``, NULL atoms, errors.

Weights are random, drawn by fairchem's own initialization of a small backbone
configuration (``_uma_models.BACKBONE``) with a seed.
"""

from __future__ import annotations

import copy
import re
import sys

import numpy as np
import pytest
import torch
from _systems import (
    RankGraph,
    System,
    ThreadWorld,
    assert_same_results,
    assert_same_weights,
    decompose,
    decompose_shell,
    exported,
    gather_evaluations,
    in_float32,
    relative,
)
from _uma_models import (
    BACKBONE,
    BALANCED_BACKBONE,
    ELEMENTS,
    copper_oxide_box,
    fairchem_forward,
    random_uma,
)

from nvalchemi_lammps import LocalGraph, evaluate, load_model, save_model
from nvalchemi_lammps.cli import main
from nvalchemi_lammps.frontends.plugin import LammpsComm
from nvalchemi_lammps.potentials import uma as uma_module
from nvalchemi_lammps.potentials.uma import Uma
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.uma

#: float64: our evaluation = fairchem's, and multi-rank = single process (relative).
TOLERANCE = 1e-10
SYSTEM = copper_oxide_box()  # 16 atoms of H, C, O, Cu in a 7.2 x 7.2 x 3.6 Angstrom box
CUTOFF = BACKBONE["cutoff"]


@pytest.fixture(scope="module")
def potential() -> Uma:
    return random_uma(seed=0)


@pytest.fixture(scope="module")
def balanced() -> Uma:
    """With charge and spin channel balancing (a sum over the whole system per block)."""
    return random_uma(seed=1, backbone=BALANCED_BACKBONE, task="omol", spin=3)


@pytest.fixture(scope="module")
def potential32(potential) -> Uma:
    """The same weights in float32 (the model's own precision)."""
    return in_float32(potential)


def _reference(potential: Uma, system: System, charge: float = 0.0):
    return evaluate_reference(
        potential, system.positions, system.cell, system.pbc, system.species, total_charge=charge
    )


# --- (a) the potential = fairchem's forward ------------------------------------------------

#: The virial's antisymmetric part relative to the virial: UMA's grid feed-forward (values
#: on a finite S2 grid) makes the energy rotation-invariant only to ~1e-8 (measured 7e-9 to
#: 3e-8), so ``-sum rij (x) fij`` (ours, LAMMPS's) is not exactly symmetric; fairchem's
#: stress is its symmetric part. The bound is 30x the largest seen.
ANTISYMMETRY = 1e-6


@pytest.mark.parametrize(
    ("model", "charge", "spin", "task"),
    [
        ("plain", 0, 0, "omat"),
        ("plain", -2, 3, "omol"),
        ("balanced", 1, 2, "omol"),
    ],
    ids=["omat", "omol-charged", "balanced"],
)
def test_equals_fairchem_forward(potential, model, charge, spin, task):
    config = {**potential.config(), "spin": spin, "task": task}
    if model == "balanced":
        config["backbone"] = BALANCED_BACKBONE
    ours = Uma.from_config(config)
    ours.load_state_dict(potential.state_dict())
    ref = _reference(ours, SYSTEM, charge)
    theirs = fairchem_forward(ours, SYSTEM, charge)
    symmetric = (ref.virial + ref.virial.T) / 2
    diffs = {
        "energy": relative([ref.energy], [theirs["energy"]]),
        "forces": relative(ref.forces, theirs["forces"]),
        "virial": relative(symmetric, theirs["virial"]),
    }
    assert all(d <= TOLERANCE for d in diffs.values()), diffs
    assert relative(ref.virial, symmetric) <= ANTISYMMETRY
    assert np.abs(theirs["forces"]).max() > 1e-2


def test_charge_spin_and_task_reach_the_model(potential, balanced):
    """Each input changes the energy: the comparisons above could fail."""
    base = _reference(potential, SYSTEM)
    for other in (
        _reference(potential, SYSTEM, charge=1.0),
        _reference(Uma.from_config({**potential.config(), "spin": 2}), SYSTEM),
        _reference(Uma.from_config({**potential.config(), "task": "omol"}), SYSTEM),
    ):
        assert abs(other.energy - base.energy) > 1e-6 * abs(base.energy)
    assert (
        relative(_reference(balanced, SYSTEM, 1.0).forces, _reference(balanced, SYSTEM).forces)
        > 1e-4
    )


# --- (b) several ranks -----------------------------------------------------------------------


def _run_ranks(potential, system, graphs, charge=0.0, exchange=True, comm_class=LammpsComm):
    """Every rank in its own thread with LAMMPS's collectives faked: the engine's evaluation,
    folded as LAMMPS folds it. Each rank has its own copy of the potential, as each LAMMPS
    rank (a process) has: a mixture of experts keeps its coefficients on the modules."""
    world = ThreadWorld(graphs, system.natoms)
    copies = [copy.deepcopy(potential) for _ in graphs]

    def work(rank):
        g = graphs[rank]
        comm = comm_class(world.collectives(rank), exchange=exchange)
        inputs = [torch.from_numpy(a) for a in (g.species, g.pair_i, g.pair_j, g.rij)]
        return evaluate(copies[rank], LocalGraph(g.nlocal, *inputs, comm, total_charge=charge))

    results = world.run(work)
    got = gather_evaluations(system, graphs, results)
    return got, world


DECOMPOSITIONS = [(2, None), (4, None), (3, 2)]
DECOMPOSITION_IDS = ["np2", "np4-thin", "np3-one-empty"]


@pytest.mark.parametrize(("nranks", "nslabs"), DECOMPOSITIONS, ids=DECOMPOSITION_IDS)
def test_ranks_equal_reference_exchange(potential, nranks, nslabs):
    ref = _reference(potential, SYSTEM, -1.0)
    graphs = decompose(SYSTEM, CUTOFF, nranks, nslabs)
    got, world = _run_ranks(potential, SYSTEM, graphs, -1.0)
    assert_same_results(got, ref)
    # after the edge degree embedding and every block but the last: layers - 1 exchanges
    # (their reverse in the backward), on every rank
    exchanges = potential.spec.layers - 1
    assert potential.spec.layers == BACKBONE["num_layers"] + 1
    assert all(calls == world.calls[0] for calls in world.calls)
    assert world.calls[0].count("forward_exchange") == exchanges
    assert world.calls[0].count("reverse_exchange") == exchanges
    assert "allreduce" not in world.calls[0]


def test_balanced_ranks_equal_reference(balanced):
    """Channel balancing sums over owned atoms of all ranks: one all-reduce per balanced
    channel group and block (and again in the backward)."""
    ref = _reference(balanced, SYSTEM, 2.0)
    got, world = _run_ranks(balanced, SYSTEM, decompose(SYSTEM, CUTOFF, 3, 2), 2.0)
    assert_same_results(got, ref)
    assert world.calls[0].count("allreduce") == 2 * 2 * BALANCED_BACKBONE["num_layers"]
    assert world.calls[2] == world.calls[0]


def test_shell_equals_reference(potential):
    """The widened shell (layers x cutoff, no exchange) on 2 ranks."""
    ref = _reference(potential, SYSTEM)
    graphs = decompose_shell(SYSTEM, CUTOFF, potential.spec.layers, 2)
    got, world = _run_ranks(potential, SYSTEM, graphs, exchange=False)
    assert_same_results(got, ref)
    assert "forward_exchange" not in world.calls[0]


def test_exchange_is_needed(potential):
    """A one-cutoff ghost shell without the exchange gives other energies."""
    ref = _reference(potential, SYSTEM)
    wrong, _ = _run_ranks(potential, SYSTEM, decompose(SYSTEM, CUTOFF, 2), exchange=False)
    assert relative(wrong.atom_energies, ref.atom_energies) > 1e-6


def test_rank_without_atoms_takes_part(balanced):
    """A rank with no atoms at all still calls every collective, or the others would wait."""
    nothing = np.zeros(0, np.int64)
    empty = RankGraph(0, nothing, nothing, nothing, np.zeros((0, 3)), nothing)
    graphs = [*decompose(SYSTEM, CUTOFF, 2), empty]
    got, world = _run_ranks(balanced, SYSTEM, graphs, 1.0)
    assert_same_results(got, _reference(balanced, SYSTEM, 1.0))
    assert world.calls[2] == world.calls[0]


# --- (c) float32 -----------------------------------------------------------------------------

#: float32 model vs the same weights in float64. Each block sums ~20 edge messages per atom
#: through Wigner rotations and SO(2) convolutions (l <= 2), RMS norms and an S2-grid
#: feed-forward, each float32 operation rounding at 6e-8: measured 1.3e-7 (energy), 3.4e-7
#: (per-atom energies), 3.1e-6 (forces), 1.3e-6 (virial), 2.0e-6 (per-atom virials). 2e-5 is
#: 6x the largest; a change of the function (here the net charge by 1 e) moves the forces
#: by 2e-1.
FLOAT32_TOLERANCE = 2e-5


def test_float32_model(potential, potential32):
    ref = _reference(potential, SYSTEM, 1.0)
    got = _reference(potential32, SYSTEM, 1.0)
    assert_same_results(got, ref, tol=FLOAT32_TOLERANCE)
    # across ranks: the same float32 arithmetic in another order
    ranks, _ = _run_ranks(potential32, SYSTEM, decompose(SYSTEM, CUTOFF, 3), 1.0)
    assert_same_results(ranks, got, tol=1e-6)


# --- model files, export, NULL atoms ---------------------------------------------------------


def test_model_file_round_trip(balanced, tmp_path):
    path = save_model(balanced, tmp_path / "uma.pt")
    loaded = load_model(path)
    assert isinstance(loaded, Uma) and loaded.spec == balanced.spec
    assert (loaded.task, loaded.spin) == ("omol", 3)
    assert loaded.spec.layers == 3 and loaded.spec.cutoff == CUTOFF
    a, b = _reference(loaded, SYSTEM, 1.0), _reference(balanced, SYSTEM, 1.0)
    assert a.energy == b.energy and np.array_equal(a.forces, b.forces)


def test_export_from_toml(tmp_path, capsys):
    config = (
        'potential = "uma"\nelements = ["H", "C", "O", "Cu"]\ntask = "omol"\nspin = 1\n'
        "seed = 3\n[backbone]\nsphere_channels = 8\nhidden_channels = 8\nedge_channels = 8\n"
        "num_distance_basis = 16\ncutoff = 4.0\n[backbone.dataset_mapping]\n"
        'omat = "omat"\nomol = "omol"\n'
    )
    loaded = exported(config, tmp_path, "uma")
    capsys.readouterr()
    assert loaded.spec.dtype == "float32" and loaded.spec.elements == ELEMENTS
    assert (loaded.task, loaded.spin, loaded.spec.cutoff) == ("omol", 1, 4.0)
    same = Uma.random_weights(loaded.config()["backbone"], list(ELEMENTS), "omol", seed=3, spin=1)
    assert_same_weights(loaded, same)


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "oc20"}, "unknown UMA task 'oc20' (this model's tasks: omat, omol)"),
        ({"elements": ["H", "Xx", "U"]}, "element(s) Xx, U not in this UMA model, which embeds"),
        ({"spin": -1}, "spin multiplicity must be an integer from 0 to 100, got -1"),
        ({"spin": 1.5}, "spin multiplicity must be an integer from 0 to 100, got 1.5"),
        ({"dtype": "float16"}, "dtype must be one of float32, float64; got 'float16'"),
        ({"backbone": {**BACKBONE, "sphere_chanels": 8}}, "UMA backbone configuration: "),
        (
            {"backbone": {**BACKBONE, "execution_mode": "umas_fast_gpu"}},
            "UMA execution_mode umas_fast_gpu is not supported (supported: general)",
        ),
    ],
    ids=["task", "element", "spin", "spin-float", "dtype", "option", "execution-mode"],
)
def test_bad_model(potential, change, message):
    backbone = {**BACKBONE, "max_num_elements": 90}
    config = {**potential.config(), "backbone": backbone, **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        Uma.from_config(config)


def test_too_many_neighbors(potential):
    """fairchem would keep only the nearest max_neighbors; we refuse instead."""
    capped = Uma.from_config({**potential.config(), "backbone": {**BACKBONE, "max_neighbors": 10}})
    with pytest.raises(ValueError, match=r"an atom has \d+ neighbors within the UMA cutoff"):
        _reference(capped, SYSTEM)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"elements": ["H"], "task": "omat", "backbone": {}}, "potential uma needs key(s) seed"),
        ({"seed": 0}, "potential uma needs key(s) backbone, elements, task"),
        ({"seed": 0, "cutoff": 4.0}, "unknown key(s) cutoff for potential uma"),
    ],
)
def test_bad_export_config(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Uma.from_export_config(config)


def test_fairchem_missing_at_export(monkeypatch):
    """Without fairchem-core, export says what to install (a ValueError: one line from the
    CLI)."""
    monkeypatch.setattr(uma_module, "_ESCN_MD", None)
    monkeypatch.setitem(sys.modules, "fairchem.core.models.uma", None)
    with pytest.raises(ValueError, match=re.escape("the uma potential needs fairchem-core: pip")):
        Uma.from_export_config({"seed": 0, "elements": ["H"], "task": "omat", "backbone": BACKBONE})


def test_spin_and_task_from_the_input_script(potential):
    """``pair_style ... spin S task NAME`` (``graph.spin``, ``graph.task``) stand in for the
    model's own; a task or spin the model cannot take is refused before any step."""
    given = _reference_with(potential, spin=2, task="omol")
    other = Uma.from_config({**potential.config(), "spin": 2, "task": "omol"})
    other.load_state_dict(potential.state_dict())
    exported = _reference(other, SYSTEM)
    assert given.energy == exported.energy
    np.testing.assert_array_equal(given.forces, exported.forces)
    with pytest.raises(ValueError, match=re.escape("unknown UMA task 'nope'")):
        potential.check_system_state(spin=None, task="nope")
    with pytest.raises(ValueError, match="spin multiplicity must be an integer from 0 to 100"):
        potential.check_system_state(spin=101, task=None)


def _reference_with(potential, **state):
    return evaluate_reference(
        potential, SYSTEM.positions, SYSTEM.cell, SYSTEM.pbc, SYSTEM.species, **state
    )


# --- UMA's released architecture: mixture of experts from a fairchem checkpoint -------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """fairchem checkpoint files of small random mixture-of-experts models: heads with an
    expert per dataset, one head for all (as uma-s-1p1), and one with an energy mean and
    UMA-S-1.2's averaging of the composition; and fairchem's predict unit on each."""
    from _uma_models import predict_unit, write_moe_checkpoint

    workdir = tmp_path_factory.mktemp("uma_checkpoints")
    paths = {
        "experts": write_moe_checkpoint(workdir / "experts.pt", seed=0, head="experts"),
        "single": write_moe_checkpoint(workdir / "single.pt", seed=1, head="single"),
        "uma-s-1.2": write_moe_checkpoint(
            workdir / "s12.pt", seed=2, energy_mean=3.5, model_id="UMA-S-1.2"
        ),
        # uma-m's shape: m < l in the SO(2) convolutions (their expert layers included)
        "m-shaped": write_moe_checkpoint(workdir / "m.pt", seed=3, lmax=3, mmax=2),
    }
    return {name: (path, predict_unit(path)) for name, path in paths.items()}


def _from_checkpoint(checkpoints, name, task, **kwargs) -> Uma:
    return Uma.from_checkpoint(
        checkpoints[name][0], task, elements=list(ELEMENTS), dtype="float64", **kwargs
    )


@pytest.mark.parametrize(
    ("name", "task", "charge", "spin"),
    [
        ("experts", "omat", 0, 0),
        ("experts", "omol", -1, 2),
        ("experts", "oc20", 0, 0),
        ("single", "omol", 1, 3),
        ("uma-s-1.2", "oc20", 0, 0),
        ("m-shaped", "omat", 0, 0),
    ],
    ids=["experts-omat", "experts-omol-anion", "experts-oc20", "single-omol-cation", "s12", "m"],
)
def test_checkpoint_equals_predict_unit(checkpoints, name, task, charge, spin):
    """Our evaluation of a fairchem checkpoint = fairchem's predict unit (FAIRChemCalculator)
    on the whole periodic system: energy (normalized, element references added), forces,
    stress. fairchem's stress adds the energy normalizer's mean to the stress (its stress
    task copies the energy's normalizer): with a mean, the stress is not compared."""
    from _uma_models import fairchem_predict

    ours = _from_checkpoint(checkpoints, name, task)
    ref = _reference_with(ours, total_charge=float(charge), spin=spin)
    theirs = fairchem_predict(checkpoints[name][1], SYSTEM, task, charge, spin)
    diffs = {
        "energy": relative([ref.energy], [theirs["energy"]]),
        "forces": relative(ref.forces, theirs["forces"]),
    }
    if name != "uma-s-1.2":
        diffs["virial"] = relative((ref.virial + ref.virial.T) / 2, theirs["virial"])
    assert all(d <= TOLERANCE for d in diffs.values()), diffs
    assert np.abs(theirs["forces"]).max() > 1e-4  # random weights: forces of ~1e-3 eV/A


def test_checkpoint_inputs_reach_the_model(checkpoints):
    """Task, charge, spin and the composition each change the energy (so the comparisons
    above could fail), and each task has its own expert head and normalization."""
    potential = _from_checkpoint(checkpoints, "experts", "omat")
    base = _reference_with(potential).energy
    others = [
        _reference_with(potential, task="oc20").energy,
        _reference_with(potential, total_charge=1.0).energy,
        _reference_with(potential, spin=2).energy,
    ]
    assert all(abs(e - base) > 1e-6 * abs(base) for e in others), (base, others)
    head = potential._head[1]
    assert sorted(head.items()) == [("oc20", 0), ("omat", 1), ("omol", 2)]


@pytest.mark.parametrize(("nranks", "nslabs"), [(2, None), (3, 2)], ids=["np2", "np3-one-empty"])
def test_checkpoint_ranks_equal_reference(checkpoints, nranks, nslabs):
    """The expert coefficients need the composition of the whole system: each rank counts
    its owned atoms per element and one all-reduce adds them up (once per evaluation, on
    every rank, an empty one included). Without it each rank would mix its experts by its
    own atoms: other energies."""
    potential = _from_checkpoint(checkpoints, "experts", "omol")
    ref = _reference(potential, SYSTEM, -1.0)
    graphs = decompose(SYSTEM, CUTOFF, nranks, nslabs)
    got, world = _run_ranks(potential, SYSTEM, graphs, -1.0)
    assert_same_results(got, ref)
    assert all(calls == world.calls[0] for calls in world.calls)
    assert world.calls[0].count("allreduce") == 1
    local, _ = _run_ranks(potential, SYSTEM, graphs, -1.0, comm_class=_LocalSums)
    assert relative(local.atom_energies, ref.atom_energies) > 1e-6


class _LocalSums(LammpsComm):
    """Every all-reduce returns this rank's own part."""

    def allreduce(self, x):
        return x


def test_checkpoint_model_file_and_export(checkpoints, tmp_path, capsys):
    """``nvalchemi-lammps export`` of a TOML naming the checkpoint writes a model file
    (plain data, loaded without unpickling) that evaluates as the checkpoint does; by
    default the model takes every element it embeds."""
    path = checkpoints["experts"][0]
    config = tmp_path / "uma.toml"
    config.write_text(f'potential = "uma"\ncheckpoint = "{path}"\ntask = "omat"\n')
    out = tmp_path / "uma.pt"
    assert main(["export", str(config), "-o", str(out)]) == 0, capsys.readouterr()
    capsys.readouterr()
    loaded = load_model(out)
    assert loaded.spec.elements[:3] == ("H", "He", "Li") and len(loaded.spec.elements) == 99
    assert loaded.spec.dtype == "float32" and loaded.experts
    float64 = Uma.from_config({**loaded.config(), "dtype": "float64"})
    float64.load_state_dict(loaded.state_dict())
    species = np.array([loaded.spec.elements.index(ELEMENTS[s]) for s in SYSTEM.species])
    a = evaluate_reference(float64, SYSTEM.positions, SYSTEM.cell, SYSTEM.pbc, species)
    b = _reference(_from_checkpoint(checkpoints, "experts", "omat"), SYSTEM)
    assert relative([a.energy], [b.energy]) <= TOLERANCE
    assert relative(a.forces, b.forces) <= TOLERANCE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "odac"}, "unknown UMA task 'odac' (this model's tasks: oc20, omat, omol)"),
        ({"elements": ["H", "Es", "Fm"]}, "element(s) Fm not in this UMA model, which embeds"),
        ({"elements": ["H", "Xx"]}, "element(s) Xx not in this UMA model"),
    ],
    ids=["task", "element-beyond", "element-unknown"],
)
def test_bad_checkpoint_use(checkpoints, change, message):
    arguments = {"task": "omat", "elements": list(ELEMENTS), **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        Uma.from_checkpoint(checkpoints["experts"][0], **arguments)
    potential = _from_checkpoint(checkpoints, "experts", "omat")
    with pytest.raises(ValueError, match=re.escape("unknown UMA task 'omc'")):
        potential.check_system_state(spin=None, task="omc")


def test_bad_checkpoints(tmp_path):
    """Files that are no checkpoint, direct-force models and forces normalized otherwise
    than the energy are refused at export, with what is wrong."""
    import hydra
    from _uma_models import write_moe_checkpoint

    missing = tmp_path / "nothing.pt"
    with pytest.raises(ValueError, match=re.escape(f"UMA checkpoint {missing} not found")):
        Uma.from_checkpoint(missing, "omat")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=re.escape(f"cannot read UMA checkpoint {junk}")):
        Uma.from_checkpoint(junk, "omat")
    direct = write_moe_checkpoint(tmp_path / "direct.pt", direct_forces=True)
    with pytest.raises(ValueError, match="is a direct-force model"):
        Uma.from_checkpoint(direct, "omat")
    odd = write_moe_checkpoint(tmp_path / "odd.pt")
    checkpoint = torch.load(odd, weights_only=False)
    checkpoint.tasks_config[1]["normalizer"]["rmsd"] = 2.0  # the first dataset's forces
    torch.save(checkpoint, odd)
    assert hydra.utils.instantiate(checkpoint.tasks_config[1]).name == "oc20_forces"
    with pytest.raises(ValueError, match="task oc20_forces is normalized with rmsd 2"):
        Uma.from_checkpoint(odd, "omat")
    config = {"checkpoint": str(odd), "task": "omat", "seed": 0}
    with pytest.raises(ValueError, match=re.escape("unknown key(s) seed for potential uma")):
        Uma.from_export_config(config)
