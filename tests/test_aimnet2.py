"""AIMNet2 (aimnet) as a potential, without LAMMPS.

- the potential on a whole periodic system equals aimnet's own ``AIMNet2.forward_prepared``
  in aimnet's periodic layout, same weights (energy, forces, virial, charges), neutral and
  charged, with and without the ``SRCoulomb`` head;
- systems split over 1 to 4 ranks (one of them empty), with features and charges exchanged
  between passes (``exchange``) or a widened ghost shell (``shell``), equal it too, and the
  owned charges of all ranks add up to the net charge; under ``exchange`` only the owned
  rows go through the MLPs;
- float32 models, model files, ``nvalchemi-lammps export``, NULL atoms, errors.

Weights are random, drawn from aimnet's packaged AIMNet2 architecture with a seed.
"""

from __future__ import annotations

import copy
import re
import sys

import numpy as np
import pytest
import torch
from _aimnet2_models import ELEMENTS, aimnet_forward, molecular_box, random_aimnet2
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
    local_graph,
    relative,
)

from nvalchemi_lammps import evaluate, load_model, save_model
from nvalchemi_lammps.contract import LocalGraph
from nvalchemi_lammps.frontends.plugin import LammpsComm
from nvalchemi_lammps.potentials import aimnet2 as aimnet2_module
from nvalchemi_lammps.potentials.aimnet2 import AIMNet2
from nvalchemi_lammps.reference import evaluate_reference, neighbor_pairs

#: float64: our evaluation = aimnet's, and multi-rank = single process (relative).
TOLERANCE = 1e-10
#: Net charge of the charged cases: the predicted charges must add up to it to this.
CHARGE_TOLERANCE = 1e-6
SYSTEM = molecular_box()  # 31 atoms of H, C, N, O in a 6.8 Angstrom cube
CUTOFF = 5.0


@pytest.fixture(scope="module")
def potential() -> AIMNet2:
    return random_aimnet2(seed=0)


@pytest.fixture(scope="module")
def potential32(potential) -> AIMNet2:
    """The same weights in float32 (the model's own precision)."""
    return in_float32(potential)


def _reference(potential: AIMNet2, system: System, charge: float = 0.0):
    return evaluate_reference(
        potential, system.positions, system.cell, system.pbc, system.species, total_charge=charge
    )


def _charges(potential: AIMNet2, system: System, charge: float = 0.0) -> np.ndarray:
    """Predicted charges on the whole system in one process."""
    pairs = neighbor_pairs(system.positions, system.cell, system.pbc, potential.spec.cutoff)
    rij = torch.from_numpy(pairs.rij).to(potential.spec.torch_dtype)
    graph = local_graph(system.natoms, system.species, pairs, rij=rij, total_charge=charge)
    with torch.no_grad():
        return potential.outputs(graph)["charges"].double().numpy()


# --- (a) the potential = aimnet's forward --------------------------------------------------


def _with_short_range_coulomb(seed: int) -> AIMNet2:
    config = aimnet2_module.packaged_config()
    config["kwargs"]["outputs"]["srcoulomb"] = {
        "class": "aimnet.modules.SRCoulomb",
        "kwargs": {"rc": 4.6, "key_in": "charges", "key_out": "energy", "envelope": "exp"},
    }
    return random_aimnet2(seed=seed, model=config)


@pytest.mark.parametrize("charge", [0.0, -1.0], ids=["neutral", "anion"])
@pytest.mark.parametrize("heads", ["plain", "srcoulomb"])
def test_equals_aimnet_forward(potential, heads, charge):
    potential = potential if heads == "plain" else _with_short_range_coulomb(seed=1)
    ref = _reference(potential, SYSTEM, charge)
    charges = _charges(potential, SYSTEM, charge)
    theirs = aimnet_forward(copy.deepcopy(potential.model).double(), SYSTEM, charge)
    diffs = {
        "energy": relative([ref.energy], [theirs["energy"]]),
        "forces": relative(ref.forces, theirs["forces"]),
        # aimnet's virial is -dE/dstrain, ours -sum rij (x) fij: the same tensor
        "virial": relative(ref.virial, theirs["virial"]),
        "charges": relative(charges, theirs["charges"]),
    }
    assert all(d <= TOLERANCE for d in diffs.values()), diffs
    assert abs(charges.sum() - charge) <= CHARGE_TOLERANCE
    assert np.abs(theirs["forces"]).max() > 1e-2 and np.abs(charges).max() > 1e-2


def test_charge_changes_the_energy(potential):
    """The net charge reaches the model: the comparison above could fail."""
    neutral, anion = _reference(potential, SYSTEM, 0.0), _reference(potential, SYSTEM, -1.0)
    assert relative(anion.forces, neutral.forces) > 1e-4


# --- (b) several ranks -----------------------------------------------------------------------


def _run_ranks(potential, system, graphs, charge=0.0, exchange=True):
    """Every rank in its own thread with LAMMPS's collectives faked: the engine's evaluation
    (folded as LAMMPS folds it) and, before it, the rank's predicted charges."""
    world = ThreadWorld(graphs, system.natoms)

    def work(rank):
        g = graphs[rank]
        comm = LammpsComm(world.collectives(rank), exchange=exchange)
        inputs = [torch.from_numpy(a) for a in (g.species, g.pair_i, g.pair_j, g.rij)]
        graph = LocalGraph(
            g.nlocal,
            *inputs[:3],
            inputs[3].to(potential.spec.torch_dtype),
            comm,
            total_charge=charge,
        )
        with torch.no_grad():
            charges = potential.outputs(graph)["charges"].double().numpy()
        return charges, evaluate(
            potential, LocalGraph(g.nlocal, *inputs, comm, total_charge=charge)
        )

    results = world.run(work)
    got = gather_evaluations(system, graphs, [r for _, r in results])
    charges = np.full(system.natoms, np.nan)
    for g, (q, _) in zip(graphs, results):
        charges[g.owner[: g.nlocal]] = q[: g.nlocal]
    if exchange:  # ghost rows hold their owners' charges
        for g, (q, _) in zip(graphs, results):
            np.testing.assert_array_equal(q[g.nlocal :], charges[g.owner[g.nlocal :]])
    return got, charges, world


DECOMPOSITIONS = [(2, None), (4, None), (3, 2)]
DECOMPOSITION_IDS = ["np2", "np4-thin", "np3-one-empty"]


@pytest.mark.parametrize(("nranks", "nslabs"), DECOMPOSITIONS, ids=DECOMPOSITION_IDS)
def test_ranks_equal_reference_exchange(potential, nranks, nslabs):
    charge = 1.0
    ref = _reference(potential, SYSTEM, charge)
    graphs = decompose(SYSTEM, CUTOFF, nranks, nslabs)
    got, charges, world = _run_ranks(potential, SYSTEM, graphs, charge)
    assert_same_results(got, ref)
    assert relative(charges, _charges(potential, SYSTEM, charge)) <= TOLERANCE
    assert abs(charges.sum() - charge) <= CHARGE_TOLERANCE
    # per pass but the last: one all-reduce and one exchange (its reverse in the backward,
    # and the all-reduce again); twice (charges, then the evaluation), on every rank
    passes = potential.spec.layers
    assert all(calls == world.calls[0] for calls in world.calls)
    assert world.calls[0].count("forward_exchange") == 2 * (passes - 1)
    assert world.calls[0].count("reverse_exchange") == passes - 1
    assert world.calls[0].count("allreduce") == 3 * (passes - 1)


@pytest.mark.slow  # about 12 s of CPU
def test_shell_equals_reference(potential):
    """The widened shell (3 cutoffs, no exchange; the all-reduce stays) on 2 ranks."""
    ref = _reference(potential, SYSTEM, -1.0)
    graphs = decompose_shell(SYSTEM, CUTOFF, potential.spec.layers, 2)
    got, charges, world = _run_ranks(potential, SYSTEM, graphs, -1.0, exchange=False)
    assert_same_results(got, ref)
    assert abs(charges.sum() + 1.0) <= CHARGE_TOLERANCE
    assert "forward_exchange" not in world.calls[0]


@pytest.mark.slow  # about 12 s of CPU
def test_only_receiving_rows_are_computed(potential):
    """Under the exchange the MLPs see the owned rows (and aimnet's dummy) only, not the
    ghosts; under the widened shell, whose ghosts receive pairs, every row."""
    rows = []
    hooks = [
        mlp.register_forward_hook(lambda _mlp, args, _out: rows.append(args[0].shape[0]))
        for mlp in potential.model.mlps
    ]
    try:
        exchange = decompose(SYSTEM, CUTOFF, 2)
        _run_ranks(potential, SYSTEM, exchange)
        under_exchange, rows[:] = set(rows), []
        shell = decompose_shell(SYSTEM, CUTOFF, potential.spec.layers, 2)
        _run_ranks(potential, SYSTEM, shell, exchange=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert all(len(g.species) > g.nlocal for g in exchange)
    assert under_exchange == {g.nlocal + 1 for g in exchange}, under_exchange
    assert set(rows) == {len(g.species) + 1 for g in shell}, set(rows)


def test_exchange_is_needed(potential):
    """A one-cutoff ghost shell without the exchange gives other energies."""
    ref = _reference(potential, SYSTEM)
    wrong, _, _ = _run_ranks(potential, SYSTEM, decompose(SYSTEM, CUTOFF, 2), exchange=False)
    assert relative(wrong.atom_energies, ref.atom_energies) > 1e-6


def test_rank_without_atoms_takes_part(potential):
    """A rank with no atoms at all still calls every collective, or the others would wait."""
    nothing = np.zeros(0, np.int64)
    empty = RankGraph(0, nothing, nothing, nothing, np.zeros((0, 3)), nothing)
    graphs = [*decompose(SYSTEM, CUTOFF, 2), empty]
    got, _, world = _run_ranks(potential, SYSTEM, graphs, 1.0)
    assert_same_results(got, _reference(potential, SYSTEM, 1.0))
    assert world.calls[2] == world.calls[0]


# --- (c) float32 -----------------------------------------------------------------------------

#: float32 model vs the same weights in float64. Each pass sums ~70 neighbor terms per atom
#: and chains MLPs of width 512, so the float32 rounding (6e-8 per operation) grows: measured
#: 5e-10 (energy), 6e-7 (forces), 8e-7 (virial), 4e-6 (charges, whose equilibration divides
#: by a sum). 2e-5 is 5x the largest; a difference of the function itself shows up at 1e-4
#: and above (test_charge_changes_the_energy).
FLOAT32_TOLERANCE = 2e-5


def test_float32_model(potential, potential32):
    charge = 1.0
    ref = _reference(potential, SYSTEM, charge)
    got = _reference(potential32, SYSTEM, charge)
    assert_same_results(got, ref, tol=FLOAT32_TOLERANCE)
    charges = _charges(potential32, SYSTEM, charge)
    assert relative(charges, _charges(potential, SYSTEM, charge)) <= FLOAT32_TOLERANCE
    assert abs(charges.sum() - charge) <= CHARGE_TOLERANCE
    # across ranks: the same float32 arithmetic in another order
    ranks, charges, _ = _run_ranks(potential32, SYSTEM, decompose(SYSTEM, CUTOFF, 3), charge)
    assert_same_results(ranks, got, tol=1e-6)
    assert abs(charges.sum() - charge) <= CHARGE_TOLERANCE


# --- model files, export, NULL atoms ---------------------------------------------------------


def test_model_file_round_trip(potential32, tmp_path):
    path = save_model(potential32, tmp_path / "aimnet2.pt")
    loaded = load_model(path)
    assert isinstance(loaded, AIMNet2) and loaded.spec == potential32.spec
    assert loaded.spec.layers == 3 and loaded.spec.cutoff == CUTOFF
    a, b = _reference(loaded, SYSTEM, 1.0), _reference(potential32, SYSTEM, 1.0)
    assert a.energy == b.energy and np.array_equal(a.forces, b.forces)


@pytest.mark.slow  # about 12 s of CPU
def test_export_from_toml(tmp_path, capsys):
    config = 'potential = "aimnet2"\nelements = ["H", "C", "N", "O"]\nseed = 0\n'
    loaded = exported(config, tmp_path, "aimnet2")
    capsys.readouterr()
    assert loaded.spec.dtype == "float32" and loaded.spec.elements == ELEMENTS
    same = AIMNet2.random_weights(list(ELEMENTS), seed=0)
    assert_same_weights(loaded, same)


# --- errors -----------------------------------------------------------------------------------


def test_element_not_in_aimnet():
    with pytest.raises(ValueError, match=re.escape("element(s) Gd, Xx not in AIMNet2")):
        AIMNet2.random_weights(["H", "Gd", "Xx"])


def test_element_not_in_the_weights(potential):
    """A trained model's embedding rows of elements it was not trained on are NaN."""
    state = potential.state_dict()
    state["model.afv.weight"] = state["model.afv.weight"].clone()
    state["model.afv.weight"][7] = float("nan")  # nitrogen
    other = AIMNet2.from_config(potential.config())
    with pytest.raises(ValueError, match=re.escape("element(s) N not in this AIMNet2 model")):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"elements": ["H"]}, "potential aimnet2 needs either checkpoint"),
        ({"seed": 0}, "potential aimnet2 with random weights needs key elements"),
        ({"seed": 0, "checkpoint": "x.pt"}, "potential aimnet2 needs either checkpoint"),
        ({"seed": 0, "cutoff": 4.0}, "unknown key(s) cutoff for potential aimnet2"),
        ({"checkpoint": "missing.pt"}, "AIMNet2 model file missing.pt not found"),
        ({"seed": 0, "elements": ["H"], "dtype": "float16"}, "dtype must be one of float32"),
    ],
)
def test_bad_export_config(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AIMNet2.from_export_config(config)


def test_unsupported_models():
    config = aimnet2_module.packaged_config()
    config["kwargs"]["num_charge_channels"] = 2
    with pytest.raises(ValueError, match="spin-polarized AIMNet2 models"):
        AIMNet2(config, ["H"])
    config = aimnet2_module.packaged_config()
    config["kwargs"]["outputs"]["dipole"] = {"class": "aimnet.modules.Dipole", "kwargs": {}}
    with pytest.raises(ValueError, match="output head dipole of class Dipole is not supported"):
        AIMNet2(config, ["H"])


def test_aimnet_missing_at_export(monkeypatch):
    """Without aimnet, export says what to install (a ValueError: one line from the CLI)."""
    monkeypatch.setattr(aimnet2_module, "_AIMNET", None)
    monkeypatch.setitem(sys.modules, "aimnet", None)
    with pytest.raises(ValueError, match=re.escape("the aimnet2 potential needs aimnet: pip")):
        AIMNet2.from_export_config({"seed": 0, "elements": ["H"]})


def test_from_checkpoint(tmp_path):
    """An aimnet model file (format 2: configuration, weights, metadata; here with the
    SRCoulomb head of models meant for an external Coulomb term) gives the same potential."""
    import yaml

    potential = _with_short_range_coulomb(seed=2)
    config = potential.config()["model"]
    artifact = {
        "format_version": 2,
        "model_yaml": yaml.safe_dump(config),
        "state_dict": potential.model.state_dict(),
        "cutoff": CUTOFF,
        "implemented_species": [1, 6, 7, 8],
        "needs_coulomb": True,
        "needs_dispersion": False,
        "coulomb_mode": "sr_embedded",
        "coulomb_sr_rc": 4.6,
        "coulomb_sr_envelope": "exp",
        "has_embedded_lr": True,
    }
    torch.save(artifact, tmp_path / "model.pt")
    loaded = AIMNet2.from_export_config(
        {"checkpoint": str(tmp_path / "model.pt"), "dtype": "float64"}
    )
    assert loaded.spec == potential.spec
    a, b = _reference(loaded, SYSTEM, 1.0), _reference(potential, SYSTEM, 1.0)
    assert a.energy == b.energy and np.array_equal(a.forces, b.forces)
    with pytest.raises(ValueError, match=re.escape("element(s) Fe not in this AIMNet2 model")):
        state = dict(artifact["state_dict"])
        state["afv.weight"] = state["afv.weight"].clone()
        state["afv.weight"][26] = float("nan")
        torch.save({**artifact, "state_dict": state}, tmp_path / "model.pt")
        AIMNet2.from_checkpoint(tmp_path / "model.pt", elements=["H", "Fe"])
