"""MACE (mace-torch) as a potential, without LAMMPS.

- the potential on a whole periodic system equals mace-torch's own ``forward`` on the same
  structure with its own neighbor list (energy, per-atom energies, forces, virial);
- systems split over 1 to 4 ranks (one of them empty), with ghost features exchanged
  between layers (``exchange``) or with a widened ghost shell (``shell``), equal it too;
- the model file and checkpoint round trips, float32 models, NULL atoms, errors.

Models are small and random (seeded): Ar and Kr, r_max 4, hidden irreps 8x0e+8x1o.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _systems import (
    FCC,
    RankGraph,
    System,
    ThreadWorld,
    assert_same_results,
    decompose,
    decompose_shell,
    gather_evaluations,
    local_graph,
    relative,
)
from torch.utils._python_dispatch import TorchDispatchMode

from nvalchemi_lammps import LocalGraph, evaluate, load_model, save_model
from nvalchemi_lammps.frontends.plugin import LammpsComm
from nvalchemi_lammps.potentials.mace import Mace, _kernels, _mace_torch, _potential, model_config
from nvalchemi_lammps.potentials.mace._tensor_product_splits import (
    _same_output,
    _split_column_slices,
    split_tensor_product_inputs,
)
from nvalchemi_lammps.reference import evaluate_reference

try:
    _mace_torch._mace()
except ImportError:  # pragma: no cover - mace-torch is an optional dependency
    pytest.skip("mace-torch is not installed", allow_module_level=True)

from _mace_models import (
    ELEMENTS,
    FAMILIES,
    R_MAX,
    VARIANTS,
    mace_forward,
    random_family,
    random_mace,
)

#: Multi-rank = single process, and our evaluation = mace-torch's (float64, relative).
TOLERANCE = 1e-10


# --- systems: every one has pairs shorter than r_max across periodic boundaries ---------


def _rattled(frac, cell, amount, seed):
    rng = np.random.default_rng(seed)
    return frac @ cell + rng.uniform(-amount, amount, size=(len(frac), 3))


def fcc_ar_kr() -> System:
    """2x2x2 fcc cells of 5.0 Angstrom (32 atoms), rattled, Ar and Kr mixed. At 3 and 4
    ranks a slab is thinner than r_max."""
    shifts = np.array([[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)], float)
    frac = (FCC[None, :, :] + shifts[:, None, :]).reshape(-1, 3) / 2.0
    cell = 10.0 * np.eye(3)
    species = np.random.default_rng(11).integers(0, 2, size=len(frac)).astype(np.int64)
    return System("fcc_ar_kr", _rattled(frac, cell, 0.15, 10), cell, (True,) * 3, species, ELEMENTS)


def triclinic_ar_kr() -> System:
    """Three atoms in a skewed cell with a lattice vector shorter than r_max: atoms see
    their own periodic images."""
    cell = np.array([[3.7, 0.0, 0.0], [1.2, 4.4, 0.0], [-0.9, 1.1, 5.2]])
    frac = np.array([[0.0, 0.0, 0.0], [0.5, 0.4, 0.3], [0.1, 0.6, 0.7]])
    return System(
        "triclinic_ar_kr",
        _rattled(frac, cell, 0.1, 12),
        cell,
        (True,) * 3,
        np.array([0, 1, 1]),
        ELEMENTS,
    )


def slab_ar_kr() -> System:
    """16 atoms periodic in x and y only."""
    cell = np.array([[7.0, 0.0, 0.0], [0.0, 7.0, 0.0], [0.0, 0.0, 7.0]])
    grid = np.array([[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)], float)
    frac = np.concatenate([grid / 2.0, grid / 2.0 + 0.25])
    species = np.random.default_rng(13).integers(0, 2, size=len(frac)).astype(np.int64)
    return System(
        "slab_ar_kr", _rattled(frac, cell, 0.1, 14), cell, (True, True, False), species, ELEMENTS
    )


SYSTEMS = [fcc_ar_kr(), triclinic_ar_kr(), slab_ar_kr()]


# --- models ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def variant(request) -> tuple[str, torch.nn.Module, Mace]:
    model = random_mace(**VARIANTS[request.param])
    return request.param, model, Mace.from_model(model)


@pytest.fixture(scope="module")
def scale_shift() -> tuple[torch.nn.Module, Mace]:
    model = random_mace(**VARIANTS["scale_shift"])
    return model, Mace.from_model(model)


# --- mace-torch's own evaluation ---------------------------------------------------------


def _reference(potential: Mace, system: System):
    return evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)


# --- (a) the potential = mace-torch's forward --------------------------------------------


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.name)
def test_equals_mace_forward(variant, system):
    _, model, potential = variant
    ref = _reference(potential, system)
    theirs = mace_forward(model, system)
    assert len(ref.pairs.pair_i) > 0
    diffs = {
        "energy": relative([ref.energy], [theirs["energy"]]),
        "atom_energies": relative(ref.atom_energies, theirs["atom_energies"]),
        "forces": relative(ref.forces, theirs["forces"]),
        # mace-torch's virial is -dE/dstrain, ours -sum rij (x) fij: the same tensor
        "virial": relative(ref.virial, theirs["virial"]),
    }
    if all(system.pbc):  # mace-torch stretches the cell along non-periodic directions
        diffs["stress"] = relative(-ref.virial / system.volume, theirs["stress"])
    assert all(d <= TOLERANCE for d in diffs.values()), diffs
    assert np.abs(theirs["forces"]).max() > 1e-3  # forces that could be wrong


@pytest.mark.slow  # a model of each block: about 6 s of CPU each
@pytest.mark.parametrize(
    "interaction",
    [
        "RealAgnosticDensityInteractionBlock",
        "RealAgnosticDensityResidualInteractionBlock",
        "RealAgnosticResidualNonLinearInteractionBlock",
        "RealAgnosticAttResidualInteractionBlock",
    ],
)
def test_other_interaction_blocks(interaction):
    model = random_mace(interaction=interaction, seed=3)
    potential = Mace.from_model(model)
    system = fcc_ar_kr()
    ref = _reference(potential, system)
    theirs = mace_forward(model, system)
    assert relative([ref.energy], [theirs["energy"]]) <= TOLERANCE
    assert relative(ref.forces, theirs["forces"]) <= TOLERANCE
    # and across ranks with ghost features exchanged
    got, _ = _run_exchange(potential, system, decompose(system, R_MAX, 3))
    assert relative(got.forces, ref.forces) <= TOLERANCE


def _options():
    from e3nn import o3

    mm = _mace_torch._mace()
    two_heads = {
        "heads": ["pt_head", "Default"],
        "atomic_energies": np.array([[-0.5, -0.7], [-0.4, -0.9]]),
        "atomic_inter_scale": np.array([1.3, 0.9]),
        "atomic_inter_shift": np.array([0.1, -0.2]),
    }
    return {
        "one_layer": ({"num_interactions": 1}, None),
        "two_heads-default": (two_heads, None),
        "two_heads-pt_head": (two_heads, "pt_head"),
        "agnesi-gaussian": ({"distance_transform": "Agnesi", "radial_type": "gaussian"}, None),
        "bias_readout-last_only": (
            {"readout_cls": mm.NonLinearBiasReadoutBlock, "use_last_readout_only": True},
            None,
        ),
        "keep_last_layer_irreps": ({"keep_last_layer_irreps": True}, None),
        "correlation_per_layer-chebyshev-tanh": (
            {"correlation": [3, 2], "radial_type": "chebyshev", "gate": torch.tanh},
            None,
        ),
        "edge_irreps": ({"edge_irreps": o3.Irreps("4x0e+4x1o")}, None),
        "agnostic_product-no_cutoff": (
            {"kind": "MACE", "use_agnostic_product": True, "apply_cutoff": False},
            None,
        ),
    }


OPTIONS = _options()


@pytest.mark.slow  # a model of each option set: about 6 s of CPU each
@pytest.mark.parametrize("case", OPTIONS, ids=list(OPTIONS))
def test_model_options(case, tmp_path):
    """MACE options round-trip through plain data (``from_model`` checks the rebuilt
    network against the original) and the result equals mace-torch's forward."""
    options, head = OPTIONS[case]
    model = random_mace(seed=7, **options)
    potential = Mace.from_model(model, head=head)
    heads = list(model.heads)
    assert potential.config()["head"] == (head or "Default")
    system = triclinic_ar_kr()
    ref = _reference(potential, system)
    theirs = mace_forward(model, system, head=head or "Default")
    assert relative(ref.atom_energies, theirs["atom_energies"]) <= TOLERANCE
    assert relative(ref.forces, theirs["forces"]) <= TOLERANCE
    loaded = load_model(save_model(potential, tmp_path / "m.pt"))
    assert np.array_equal(_reference(loaded, system).forces, ref.forces)
    assert heads == loaded.config()["model"]["heads"]


def test_edges_as_mace_sees_them(scale_shift):
    """MACE's blocks get the same edges from us as from mace-torch's own neighbor list:
    ``edge_index = [sender, receiver]`` and vector ``x[receiver] - x[sender]`` (-rij for
    the pair j -> i). MACE's energy is invariant under flipping every vector (inversion),
    so the comparisons above could not tell the sign; this one does."""
    model, potential = scale_shift
    seen = []

    def record(module, args, kwargs):
        _lengths, _, edge_index, _ = args
        seen.append(edge_index.detach().clone())

    def vectors(module, args):
        seen.append(args[0].detach().clone())

    system = triclinic_ar_kr()
    edges = []
    for network, run in (
        (potential.model, lambda: _reference(potential, system)),
        (model, lambda: mace_forward(model, system)),
    ):
        hooks = [
            network.radial_embedding.register_forward_pre_hook(record, with_kwargs=True),
            network.spherical_harmonics.register_forward_pre_hook(vectors),
        ]
        seen.clear()
        run()
        for hook in hooks:
            hook.remove()
        edge_index, vecs = seen[1], seen[0]
        table = np.concatenate([edge_index.T.numpy(), np.round(vecs.numpy(), 9)], axis=1)
        edges.append(table[np.lexsort(table.T[::-1])])
    ours, theirs = edges
    assert ours.shape == theirs.shape and len(ours) > 0
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    assert not np.allclose(ours[:, 2:], -theirs[:, 2:])


# --- (b) decomposed over ranks -----------------------------------------------------------


def _run_exchange(potential: Mace, system: System, graphs, exchange: bool = True):
    """Every rank in its own thread with LAMMPS's collectives faked; results folded as
    LAMMPS folds them."""
    world = ThreadWorld(graphs, system.natoms)

    def work(rank):
        g = graphs[rank]
        comm = LammpsComm(world.collectives(rank), exchange=exchange)
        return evaluate(potential, local_graph(g.nlocal, g.species, g, comm))

    results = world.run(work)
    got = gather_evaluations(system, graphs, results)
    return got, world


DECOMPOSITIONS = [(1, None), (2, None), (3, None), (4, None), (3, 2)]
DECOMPOSITION_IDS = ["np1", "np2", "np3-thin", "np4-thin", "np3-one-empty"]


@pytest.mark.parametrize(("nranks", "nslabs"), DECOMPOSITIONS, ids=DECOMPOSITION_IDS)
@pytest.mark.parametrize("system", SYSTEMS[:2], ids=lambda s: s.name)
def test_ranks_equal_reference(variant, system, nranks, nslabs):
    _, _, potential = variant
    layers = potential.spec.layers
    ref = _reference(potential, system)

    exchanged, world = _run_exchange(potential, system, decompose(system, R_MAX, nranks, nslabs))
    assert_same_results(exchanged, ref)
    # one forward exchange per layer after the first, its reverse in the backward pass,
    # on every rank including an empty one
    assert all(calls == world.calls[0] for calls in world.calls)
    assert world.calls[0].count("forward_exchange") == layers - 1
    assert world.calls[0].count("reverse_exchange") == layers - 1

    graphs = decompose_shell(system, R_MAX, layers, nranks, nslabs)
    shelled, world = _run_exchange(potential, system, graphs, exchange=False)
    assert_same_results(shelled, ref)
    assert world.calls == [[] for _ in graphs]
    assert_same_results(exchanged, shelled, tol=1e-12)


@pytest.mark.parametrize(("nranks", "nslabs"), DECOMPOSITIONS[1:], ids=DECOMPOSITION_IDS[1:])
def test_one_layer_updates_owned_rows_only(nranks, nslabs):
    """A one-interaction model needs no ghost row's update (nothing is exchanged): its
    block's message ``linear`` and the product basis take the owned rows only, as mace-torch's
    ML-IAP path runs them, and the ranks still equal the reference."""
    potential = Mace.from_model(random_mace(seed=7, num_interactions=1))
    system = triclinic_ar_kr()
    ref = _reference(potential, system)
    rows = []  # rows the message linear ran on, per call
    (block,) = potential.network.interactions
    handle = block.linear.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    graphs = decompose_shell(system, R_MAX, 1, nranks, nslabs)
    try:
        got, world = _run_exchange(potential, system, graphs, exchange=False)
    finally:
        handle.remove()
    assert_same_results(got, ref)
    assert world.calls == [[] for _ in graphs]
    assert sorted(rows) == sorted(g.nlocal for g in graphs)


def test_rank_without_atoms_or_ghosts_exchanges_too(scale_shift):
    """A rank with no atoms at all (LAMMPS's top rank over empty space) still takes part in
    every exchange, forward and reverse, or the others would wait for it forever."""
    _, potential = scale_shift
    system = fcc_ar_kr()
    nothing = np.zeros(0, np.int64)
    empty = RankGraph(0, nothing, nothing, nothing, np.zeros((0, 3)), nothing)
    graphs = [*decompose(system, R_MAX, 2), empty]
    got, world = _run_exchange(potential, system, graphs)
    assert_same_results(got, _reference(potential, system))
    assert world.calls[2] == world.calls[0] == ["forward_exchange", "reverse_exchange"]


def test_exchange_is_needed(scale_shift):
    """A one-cutoff ghost shell without the exchange gives other energies: the test above
    could fail."""
    _, potential = scale_shift
    system = fcc_ar_kr()
    ref = _reference(potential, system)
    graphs = decompose(system, R_MAX, 2)
    wrong, _ = _run_exchange(potential, system, graphs, exchange=False)
    assert relative(wrong.atom_energies, ref.atom_energies) > 1e-6


# --- NULL atoms, empty ranks --------------------------------------------------------------


def test_null_atoms_are_left_out(scale_shift):
    """An atom of a NULL type (species -1) takes part in no pair: same result as without
    it, zero energy and force for it."""
    _, potential = scale_shift
    system = fcc_ar_kr()
    species = system.species.copy()
    species[5] = -1
    with_null = evaluate_reference(potential, system.positions, system.cell, system.pbc, species)
    keep = np.arange(system.natoms) != 5
    without = evaluate_reference(
        potential, system.positions[keep], system.cell, system.pbc, species[keep]
    )
    assert with_null.atom_energies[5] == 0.0 and not with_null.forces[5].any()
    assert relative(with_null.atom_energies[keep], without.atom_energies) <= 1e-13
    assert relative(with_null.forces[keep], without.forces) <= 1e-13


@pytest.mark.parametrize(("nlocal", "nghost"), [(0, 0), (0, 4), (3, 0), (2, 3)])
def test_no_pairs(scale_shift, nlocal, nghost):
    """A rank without pairs (or without atoms) runs through; its atoms have the energies
    mace-torch gives isolated atoms."""
    model, potential = scale_shift
    species = np.arange(nlocal + nghost) % 2
    none = torch.zeros(0, dtype=torch.int64)
    result = evaluate(
        potential,
        LocalGraph(
            nlocal, torch.from_numpy(species), none, none, torch.zeros(0, 3, dtype=torch.float64)
        ),
    )
    assert result.atom_energies.shape == (nlocal,) and result.pair_forces.shape == (0, 3)
    if nlocal:
        far_apart = System(
            "isolated",
            10.0 * np.eye(3)[:nlocal],
            np.zeros((3, 3)),
            (False,) * 3,
            species[:nlocal],
            ELEMENTS,
        )
        isolated = mace_forward(model, far_apart)["atom_energies"]
        assert relative(result.atom_energies.numpy(), isolated) <= 1e-14


# --- (c) model file, checkpoint, configuration --------------------------------------------


def test_model_file_round_trip(variant, tmp_path):
    _, _, potential = variant
    config = potential.config()
    assert json.loads(json.dumps(config)) == config  # plain data
    path = save_model(potential, tmp_path / "mace.pt")
    loaded = load_model(path)
    assert isinstance(loaded, Mace) and loaded.spec == potential.spec
    assert loaded.config() == config
    system = triclinic_ar_kr()
    before, after = _reference(potential, system), _reference(loaded, system)
    assert after.energy == before.energy
    assert np.array_equal(after.atom_energies, before.atom_energies)
    assert np.array_equal(after.forces, before.forces)


def test_spec(variant):
    name, model, potential = variant
    spec = potential.spec
    assert spec.elements == ELEMENTS
    assert spec.cutoff == R_MAX
    assert spec.layers == VARIANTS[name].get("num_interactions", 2) == int(model.num_interactions)
    assert spec.units == "metal" and spec.dtype == "float64"
    assert spec.strategies == ("exchange", "shell")
    assert potential.config()["head"] == "Default"


def test_from_checkpoint(scale_shift, tmp_path):
    model, potential = scale_shift
    path = tmp_path / "small.model"
    with _mace_torch._quiet_torchscript():  # e3nn's modules pickle through torch.jit.save
        torch.save(model, path)
    loaded = Mace.from_checkpoint(path)
    assert loaded.config() == potential.config()
    system = triclinic_ar_kr()
    assert np.array_equal(_reference(loaded, system).forces, _reference(potential, system).forces)
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ

    torch.save(model.state_dict(), tmp_path / "weights.pt")
    message = (
        f"{tmp_path / 'weights.pt'} holds a OrderedDict, not a mace-torch model: weights "
        "alone (a training checkpoint) cannot be used; give the saved model (*.model) instead"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        Mace.from_checkpoint(tmp_path / "weights.pt")
    with pytest.raises(ValueError, match=re.escape(f"MACE checkpoint {tmp_path / 'no'} not found")):
        Mace.from_checkpoint(tmp_path / "no")


def test_export_from_checkpoint(scale_shift, tmp_path, capsys):
    """``nvalchemi-lammps export`` with potential = "mace" and a checkpoint."""
    from nvalchemi_lammps.cli import export

    model, potential = scale_shift
    with _mace_torch._quiet_torchscript():
        torch.save(model, tmp_path / "small.model")
    toml = tmp_path / "mace.toml"
    toml.write_text(
        f'potential = "mace"\ncheckpoint = "{tmp_path / "small.model"}"\ndtype = "float32"\n'
        "pair_chunk = 200\ncompile_blocks = true\n"
    )
    assert export.main([str(toml), "-o", str(tmp_path / "mace.pt")]) == 0
    assert "wrote" in capsys.readouterr().out
    loaded = load_model(tmp_path / "mace.pt")
    assert loaded.spec.dtype == "float32"
    assert loaded.config()["pair_chunk"] == 200
    assert loaded.config()["compile_blocks"] is True
    assert loaded.config()["model"] == potential.config()["model"]

    toml.write_text('potential = "mace"\nfile = "x"\n')
    assert export.main([str(toml), "-o", str(tmp_path / "bad.pt")]) == 1
    assert capsys.readouterr().out.startswith(
        "error: unknown key(s) file for potential mace "
        "(allowed: potential, checkpoint, head, dtype, kernels, pair_chunk, compile_blocks)"
    )


def test_import_leaves_environment_alone():
    """mace-torch's import sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (which would let every
    torch.load unpickle code); the potential puts it back."""
    _mace_torch._mace()
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ


def test_missing_mace_torch(scale_shift, monkeypatch):
    """Without mace-torch, building a MACE model says which extra to install."""
    _, potential = scale_shift
    monkeypatch.setattr(_mace_torch, "_MACE", None)
    monkeypatch.setitem(sys.modules, "mace.modules", None)
    message = "the mace potential needs mace-torch: pip install 'nvalchemi-lammps[mace]'"
    with pytest.raises(ImportError, match=re.escape(message)):
        Mace(potential.config()["model"])


# --- (d) float32 -------------------------------------------------------------------------


def test_float32(scale_shift):
    model, potential = scale_shift
    single = Mace.from_model(model, dtype="float32")
    assert single.spec.dtype == "float32"
    assert next(single.model.parameters()).dtype == torch.float32
    assert next(model.parameters()).dtype == torch.float64  # the original is left alone
    system = fcc_ar_kr()
    ref, got = _reference(potential, system), _reference(single, system)
    assert got.pair_forces.dtype == np.float64 and got.forces.dtype == np.float64
    assert relative([got.energy], [ref.energy]) <= 1e-5
    assert relative(got.atom_energies, ref.atom_energies) <= 1e-5
    assert relative(got.forces, ref.forces) <= 1e-4
    assert not np.array_equal(got.forces, ref.forces)
    exchanged, _ = _run_exchange(single, system, decompose(system, R_MAX, 3, 2))
    assert relative(exchanged.forces, ref.forces) <= 1e-4


# --- e3nn's tensor products, each input split once --------------------------------------


def _split_codes(potential: Mace) -> int:
    scripted = [m for m in potential.model.modules() if isinstance(m, torch.jit.ScriptModule)]
    return sum("split_with_sizes" in m.code for m in scripted)


class _SliceBackwards(TorchDispatchMode):
    """Counts the ``slice_backward`` calls (a zero-filled tensor each) inside the block."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket is torch.ops.aten.slice_backward
        return func(*args, **(kwargs or {}))


def _backward_slices(potential: Mace, system: System) -> int:
    with _SliceBackwards() as counter:
        _reference(potential, system)
    return counter.count


def test_tensor_products_split_inputs_once(variant):
    """The network's tensor products split each input once (fewer slices to take back in
    the backward pass) and give what e3nn's generated code gives, to the last bit."""
    _, model, potential = variant
    with _mace_torch._quiet_torchscript():
        as_generated = copy.deepcopy(potential)
        as_generated.model = _mace_torch._inference(copy.deepcopy(model))  # e3nn's code
    assert _split_codes(potential) > 0 and _split_codes(as_generated) == 0
    system = fcc_ar_kr()
    ours, theirs = _reference(potential, system), _reference(as_generated, system)
    for key in ("energy", "atom_energies", "pair_forces", "forces", "virial"):
        assert np.array_equal(getattr(ours, key), getattr(theirs, key)), key
    assert _backward_slices(potential, system) < _backward_slices(as_generated, system)


def _tensor_product():
    from e3nn import o3

    with _mace_torch._quiet_torchscript():
        return o3.FullyConnectedTensorProduct(
            "2x0e+2x1o", "1x0e+1x1o", "2x0e+2x1o", shared_weights=False, internal_weights=False
        )


def test_split_tensor_product_gives_e3nns_values_and_gradients():
    tp = _tensor_product()
    as_generated = tp._compiled_main_left_right
    assert split_tensor_product_inputs(tp) == 1
    assert "split_with_sizes" in tp._compiled_main_left_right.code
    torch.manual_seed(0)
    dims = (tp.irreps_in1.dim, tp.irreps_in2.dim, tp.weight_numel)
    inputs = [torch.randn(7, d, requires_grad=True) for d in dims]
    results = []
    for code in (tp._compiled_main_left_right, as_generated):
        out = code(*inputs)
        results.append([out, *torch.autograd.grad((out * out).sum(), inputs)])
    for ours, theirs in zip(*results, strict=True):
        assert torch.equal(ours, theirs)


def test_rewritten_tensor_product_used_only_when_it_gives_e3nns_output():
    tp = _tensor_product()
    code = tp._compiled_main_left_right
    assert _same_output(tp, code, code)
    assert not _same_output(tp, code, lambda *inputs: code(*inputs) + 1.0)

    class Short(torch.nn.Module):  # column slices that stop before the last column
        def forward(self, x, y, w):
            return torch.cat([x[:, 0:1], x[:, 1:2]], dim=1)

    short = torch.fx.symbolic_trace(Short())
    assert _split_column_slices(short.graph) == 2
    short.recompile()
    assert not _same_output(tp, code, short)  # split_with_sizes refuses: not used


# --- the pair work in chunks (pair_chunk) ------------------------------------------------


def _chunked(potential: Mace, pair_chunk: int) -> Mace:
    """``potential`` with its pair work in chunks of ``pair_chunk`` pairs, the same weights."""
    config = potential.config()
    chunked = Mace(
        config["model"], dtype=config["dtype"], kernels=config["kernels"], pair_chunk=pair_chunk
    )
    chunked.load_state_dict(potential.state_dict())
    return chunked


@pytest.fixture(scope="module")
def chunked(variant) -> Mace:
    """The variant with its pair work in chunks of 50 pairs (the 32-atom system has ~1,500
    pairs, the triclinic one a few hundred)."""
    return _chunked(variant[2], 50)


@pytest.mark.parametrize("system", SYSTEMS[:2], ids=lambda s: s.name)
def test_pair_chunks_equal_all_pairs(variant, chunked, system):
    """Residual and plain interaction blocks: the same results up to the sums' order,
    alone and over 2 and 3 ranks (one empty) with both strategies."""
    _, _, potential = variant
    ref = _reference(potential, system)
    assert_same_results(_reference(chunked, system), ref, tol=1e-12)
    for nranks, nslabs in [(2, None), (3, 2)]:
        exchanged, _ = _run_exchange(chunked, system, decompose(system, R_MAX, nranks, nslabs))
        assert_same_results(exchanged, ref)
        graphs = decompose_shell(system, R_MAX, potential.spec.layers, nranks, nslabs)
        shelled, _ = _run_exchange(chunked, system, graphs, exchange=False)
        assert_same_results(shelled, ref)


def _saved_bytes(potential: Mace, system: System) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of one
    evaluation of ``system`` (with ``torch.autograd.graph.saved_tensors_hooks``)."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _reference(potential, system)
    return sum(storages.values())


def test_pair_chunks_keep_less_for_the_backward(variant, chunked):
    """What chunks are for: the pairs' convolution weights and messages are not kept for
    the backward pass (made again there), so autograd keeps a fraction of the bytes
    (measured: 0.30 for the scale-shift variant)."""
    system = fcc_ar_kr()
    whole, kept = _saved_bytes(variant[2], system), _saved_bytes(chunked, system)
    assert kept < 0.5 * whole, (kept, whole)


def test_pair_chunk_in_the_model_file(chunked, tmp_path):
    assert chunked.config()["pair_chunk"] == 50
    loaded = load_model(save_model(chunked, tmp_path / "chunked.pt"))
    assert loaded.config() == chunked.config()
    system = triclinic_ar_kr()
    before, after = _reference(chunked, system), _reference(loaded, system)
    assert np.array_equal(after.forces, before.forces)


# --- errors --------------------------------------------------------------------------------


ERRORS = {
    "model-class": (
        lambda config: Mace.from_model(torch.nn.Linear(2, 2)),
        "unsupported MACE model class Linear (supported: MACE, ScaleShiftMACE)",
    ),
    "config-class": (
        lambda config: Mace({**config["model"], "class": "AtomicDipolesMACE"}),
        "unsupported MACE model class AtomicDipolesMACE (supported: MACE, ScaleShiftMACE)",
    ),
    "unknown-head": (
        lambda config: Mace(config["model"], head="other"),
        "head other not in the MACE model (heads: Default)",
    ),
    "several-heads": (
        lambda config: Mace({**config["model"], "heads": ["a", "b"]}),
        "this MACE model has several heads (a, b): choose one with head",
    ),
    "dtype": (
        lambda config: Mace(config["model"], dtype="float16"),
        "dtype must be one of float32, float64; got 'float16'",
    ),
    "gate": (
        lambda config: Mace({**config["model"], "gate": "relu"}),
        "unsupported MACE gate relu (supported: abs, tanh, silu, None)",
    ),
    "interaction": (
        lambda config: Mace({**config["model"], "interaction_cls": "Mystery"}),
        "unsupported MACE interaction_cls Mystery (supported: RealAgnosticResidualInteractionBlock",
    ),
    "readout": (
        lambda config: Mace({**config["model"], "readout_cls": "LinearReadoutBlock"}),
        (
            "unsupported MACE readout_cls LinearReadoutBlock "
            "(supported: NonLinearReadoutBlock, NonLinearBiasReadoutBlock)"
        ),
    ),
    "pair-chunk": (
        lambda config: Mace(config["model"], pair_chunk=-5),
        "pair_chunk must be an integer >= 0 (0: off); got -5",
    ),
    "compile-blocks": (
        lambda config: Mace(config["model"], compile_blocks="yes"),
        "compile_blocks must be true or false; got 'yes'",
    ),
    "pair-chunk-block": (
        lambda config: Mace(
            {**config["model"], "interaction_cls": "RealAgnosticDensityInteractionBlock"},
            pair_chunk=1000,
        ),
        (
            "pair_chunk is not supported for MACE interaction blocks "
            "RealAgnosticDensityInteractionBlock (supported: RealAgnosticInteractionBlock, "
            "RealAgnosticResidualInteractionBlock); leave pair_chunk at 0"
        ),
    ),
    "keys": (
        lambda config: Mace(
            {k: v for k, v in {**config["model"], "extra": 1}.items() if k != "gate"}
        ),
        "MACE model configuration: unknown key(s) ['extra'], missing key(s) ['gate']",
    ),
}


@pytest.mark.parametrize("case", ERRORS, ids=list(ERRORS))
def test_errors(scale_shift, case):
    _, potential = scale_shift
    build, message = ERRORS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        build(potential.config())


# --- with and without cuEquivariance (issue 17) ---------------------------------------------

#: A small MACE (correlation 3, max_ell 2) exported by save_model where cuequivariance-torch
#: 0.13.0 was importable (on the CPU), so mace-torch built the reduced Clebsch-Gordan basis:
#: U_matrix_3 is [9, 9, 9, 5] there and [9, 9, 9, 11] without it.
REDUCED_CG_MODEL = Path(__file__).parent / "data" / "mace_reduced_cg.pt"


def test_reduced_basis_model_without_cuequivariance_names_the_package(monkeypatch):
    """Before: "model file ... is damaged or incomplete: ... size mismatch"."""
    from mace.modules import wrapper_ops

    from nvalchemi_lammps import load_model

    monkeypatch.setattr(wrapper_ops, "CUET_AVAILABLE", False)  # as mace-torch decides
    message = (
        "this MACE model cannot be built here: its weights were made for cuEquivariance's "
        "reduced Clebsch-Gordan basis, which mace-torch builds only where cuequivariance is "
        "installed: pip install cuequivariance-torch"
    )
    with pytest.raises(ImportError, match=re.escape(message)):
        load_model(REDUCED_CG_MODEL)


def test_export_records_the_basis_built(monkeypatch):
    """mace-torch models ask for the reduced basis by default but build it only with
    cuequivariance: the file records the basis the weights are for."""
    from mace.modules import wrapper_ops

    monkeypatch.setattr(wrapper_ops, "CUET_AVAILABLE", False)
    model = random_mace(correlation=3, max_ell=2)
    assert model.use_reduced_cg  # asked for
    assert model_config(model)["use_reduced_cg"] is False  # built
    contraction = model.products[0].symmetric_contractions.contractions[0]
    assert tuple(contraction.U_matrix_3.shape) == (9, 9, 9, 11)  # the full basis


# --- on cuEquivariance's kernels (issue 16) --------------------------------------------------
# cuequivariance-torch runs on the CPU without its CUDA kernels (its pure-torch code): the
# conversion, the network and the exchange between layers are the ones the GPU runs, only
# the kernels inside cuEquivariance's operations differ.


def _cuet_available() -> bool:
    return _kernels._cueq_available()


cueq_only = pytest.mark.skipif(
    not _cuet_available(), reason="cuequivariance-torch is not installed (extra: cueq)"
)


@pytest.fixture(scope="module")
def on_cueq(scale_shift) -> tuple[torch.nn.Module, Mace, Mace]:
    """The scale-shift model on both kernels (the e3nn one is the fixture's)."""
    model, e3nn = scale_shift
    return model, e3nn, Mace.from_model(model, kernels="cuequivariance")


def _mace_cueq(model: torch.nn.Module, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """mace-torch's own conversion of ``model`` to cuEquivariance (on the CPU)."""
    with _mace_torch._quiet_torchscript():
        copied = copy.deepcopy(model).to(dtype)
    return _kernels._to_cuequivariance(copied, torch.device("cpu"))


@cueq_only
@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.name)
def test_cuequivariance_equals_e3nn(on_cueq, system):
    """float64: the network on cuEquivariance's operations gives e3nn's numbers."""
    _, e3nn, cueq = on_cueq
    assert (e3nn.kernels, cueq.kernels) == ("e3nn", "cuequivariance")
    contraction = cueq.network.products[0].symmetric_contractions
    assert type(contraction).__module__.startswith("cuequivariance_torch")
    assert cueq.network is not cueq.model  # the weights stay in e3nn's form
    assert_same_results(_reference(cueq, system), _reference(e3nn, system))


@cueq_only
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuequivariance_equals_mace_forward_of_converted(on_cueq, dtype):
    """Ours on cuEquivariance = mace-torch's forward of the model mace-torch converted, in
    float64 to 1e-10 and in float32 to float32's rounding."""
    model, _, _ = on_cueq
    torch_dtype = getattr(torch, dtype)
    theirs = mace_forward(_mace_cueq(model, torch_dtype), fcc_ar_kr(), dtype=torch_dtype)
    ours = _reference(Mace.from_model(model, dtype=dtype, kernels="cuequivariance"), fcc_ar_kr())
    tol = {"float64": TOLERANCE, "float32": 1e-5}[dtype]
    assert relative([ours.energy], [theirs["energy"]]) <= tol
    assert relative(ours.atom_energies, theirs["atom_energies"]) <= tol
    assert relative(ours.forces, theirs["forces"]) <= 10 * tol
    assert relative(ours.virial, theirs["virial"]) <= 10 * tol


@cueq_only
@pytest.mark.parametrize(("nranks", "nslabs"), [(2, None), (3, 2)], ids=["np2", "np3-one-empty"])
def test_cuequivariance_ranks_equal_reference(on_cueq, nranks, nslabs):
    """The same exchange between layers on cuEquivariance's network (both strategies)."""
    _, e3nn, cueq = on_cueq
    system = fcc_ar_kr()
    ref = _reference(e3nn, system)
    exchanged, world = _run_exchange(cueq, system, decompose(system, R_MAX, nranks, nslabs))
    assert_same_results(exchanged, ref)
    assert all(calls == ["forward_exchange", "reverse_exchange"] for calls in world.calls)
    graphs = decompose_shell(system, R_MAX, cueq.spec.layers, nranks, nslabs)
    shelled, _ = _run_exchange(cueq, system, graphs, exchange=False)
    assert_same_results(shelled, ref)


@cueq_only
def test_model_converted_to_cuequivariance_exports(on_cueq, tmp_path):
    """A mace-torch model converted to cuEquivariance is exported in e3nn's form (the same
    model file as its e3nn original's) and runs on either kernels."""
    model, e3nn, _ = on_cueq
    converted = _mace_cueq(model)
    assert _kernels._uses_cuequivariance(converted)
    potential = Mace.from_model(converted)
    assert potential.config() == {**e3nn.config(), "kernels": "auto"}
    assert potential.kernels == "e3nn"  # auto, on the CPU
    loaded = load_model(save_model(potential, tmp_path / "m.pt"))
    system = triclinic_ar_kr()
    ref = _reference(e3nn, system)
    assert_same_results(_reference(loaded, system), ref)
    path = tmp_path / "c.pt"
    save_model(Mace(loaded.config()["model"], kernels="cuequivariance"), path)
    on_cueq_kernels = load_model(path)
    on_cueq_kernels.load_state_dict(loaded.state_dict())  # weights arrive after building
    assert on_cueq_kernels.kernels == "cuequivariance"
    assert_same_results(_reference(on_cueq_kernels, system), ref)


@cueq_only
def test_cuequivariance_network_follows_the_weights(on_cueq):
    """The cuEquivariance network is made again when the weights change (loaded, moved):
    never a stale copy."""
    _, e3nn, _ = on_cueq
    potential = Mace(e3nn.config()["model"], kernels="cuequivariance")  # random weights
    system = triclinic_ar_kr()
    before = _reference(potential, system)
    potential.load_state_dict(e3nn.state_dict())
    assert_same_results(_reference(potential, system), _reference(e3nn, system))
    assert not np.allclose(before.forces, _reference(e3nn, system).forces)
    network = potential.network
    potential.to("cpu")
    assert potential.network is not network


@cueq_only
def test_cuequivariance_network_made_once_for_threads(on_cueq):
    """Ranks that are threads of one process (the stand-in worlds) ask for the network at
    once: it is made once, and torch's default dtype, which mace-torch builds under, is left
    as it was (made by each thread, one thread's restore left another building in float32:
    1e-8 from e3nn)."""
    _, e3nn, _ = on_cueq
    potential = Mace.from_model(e3nn.model, kernels="cuequivariance")
    made = []
    select = potential._select_kernels

    def slow_select():
        made.append(threading.get_ident())
        time.sleep(0.2)
        select()

    object.__setattr__(potential, "_select_kernels", slow_select)
    before = torch.get_default_dtype()
    threads = [threading.Thread(target=lambda: potential.network) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert potential.kernels == "cuequivariance"
    assert torch.get_default_dtype() == before


def test_kernels_auto_is_e3nn_off_cuda(scale_shift):
    """``auto`` runs e3nn's kernels where there is no CUDA device."""
    _, potential = scale_shift
    assert potential.config()["kernels"] == "auto"
    assert potential.kernels == "e3nn" and potential.network is potential.model


def test_kernels_errors(scale_shift, monkeypatch):
    from mace.modules import wrapper_ops

    model, potential = scale_shift
    with pytest.raises(
        ValueError,
        match=re.escape("kernels must be one of auto, e3nn, cuequivariance; got 'cueq'"),
    ):
        Mace(potential.config()["model"], kernels="cueq")
    monkeypatch.setattr(wrapper_ops, "CUET_AVAILABLE", False)
    message = (
        "kernels = cuequivariance needs cuequivariance-torch: pip install cuequivariance-torch"
    )
    with pytest.raises(ImportError, match=re.escape(message)):
        Mace(potential.config()["model"], kernels="cuequivariance")
    with pytest.raises(ImportError, match=re.escape(message)):
        Mace.from_model(model, kernels="cuequivariance")


@cueq_only
def test_converter_limits(monkeypatch):
    """A model mace-torch's converter does not take (a correlation per layer) is refused on
    ``kernels = "cuequivariance"``, and runs on e3nn's kernels, with a warning, on ``auto``
    where cuEquivariance would be used."""
    model = random_mace(correlation=[3, 2], seed=7)
    potential = Mace.from_model(model, kernels="cuequivariance")
    message = "mace-torch's cuEquivariance converter does not take this MACE model ("
    with pytest.raises(ValueError, match=re.escape(message)):
        potential.kernels  # noqa: B018 - the network is made when first needed
    monkeypatch.setattr(_potential, "_auto_uses_cuequivariance", lambda device: True)
    auto = Mace.from_model(model)
    system = triclinic_ar_kr()
    with pytest.warns(UserWarning, match=re.escape("this MACE model runs on e3nn's kernels")):
        got = _reference(auto, system)
    assert auto.kernels == "e3nn"
    monkeypatch.undo()
    assert_same_results(got, _reference(Mace.from_model(model), system))


def test_openequivariance_is_refused(scale_shift):
    from types import SimpleNamespace

    model, _ = scale_shift
    with _mace_torch._quiet_torchscript():
        oeq = copy.deepcopy(model)
    oeq.interactions[0].oeq_config = SimpleNamespace(enabled=True)
    message = "this MACE model uses OpenEquivariance kernels, which are not supported"
    with pytest.raises(ValueError, match=re.escape(message)):
        Mace.from_model(oeq)


# --- MACE's foundation-model families (random weights of their architectures) --------------

#: MACE-OMOL's charge and spin inputs (mace-torch's embedding_specs)
CHARGE_SPIN = {
    "total_charge": {"type": "categorical", "num_classes": 11, "emb_dim": 4},
    "total_spin": {"type": "categorical", "num_classes": 11, "emb_dim": 4},
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_foundation_families(family, tmp_path):
    """Each family's blocks and options, shrunk to 4 channels and 3 elements: exported and
    loaded, equal to mace-torch's forward (every head of a multi-head model loads)."""
    off = family.startswith("off")
    model = random_family(family, channels=4, elements=[1, 6, 8] if off else [1, 8, 29])
    heads = list(model.heads)
    head = heads[-1]  # the fine-tuned head of a fine-tune; any head of the others
    potential = load_model(save_model(Mace.from_model(model, head=head), tmp_path / "m.pt"))
    assert potential.config()["head"] == head
    system = dataclasses.replace(triclinic_ar_kr(), elements=potential.spec.elements)
    ref = _reference(potential, system)
    theirs = mace_forward(model, system, head=head)
    assert relative(ref.atom_energies, theirs["atom_energies"]) <= TOLERANCE
    assert relative(ref.forces, theirs["forces"]) <= TOLERANCE


def test_charge_and_spin_embeddings_are_refused():
    """MACE-OMOL's charge and spin inputs (``embedding_specs``) are refused at export."""
    model = random_mace(embedding_specs=CHARGE_SPIN)
    message = "MACE models with extra embeddings (embedding_specs) are not supported"
    with pytest.raises(ValueError, match=re.escape(message)):
        Mace.from_model(model)
