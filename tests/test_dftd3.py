"""DFT-D3(BJ) without LAMMPS: parameters, export, model files, errors.

The physics is checked against LAMMPS's own ``dispersion/d3`` and across ranks in
``test_lammps_dftd3.py``; here, what the potential is built from.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from nvalchemi_lammps import load_model
from nvalchemi_lammps.cli import export as export_cli
from nvalchemi_lammps.cli.export import potential_from_config
from nvalchemi_lammps.potentials.dftd3 import BJ_FUNCTIONALS, DFTD3, D3Reference
from nvalchemi_lammps.reference import evaluate_reference

ELEMENTS = ["Si", "O", "H"]


def _system() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A jittered 2x2x2 grid of Si, O, H atoms, 1.6 Angstrom apart, in a periodic box."""
    rng = np.random.default_rng(3)
    grid = np.stack(np.meshgrid(*[np.arange(3.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    positions = 1.6 * grid + rng.normal(0.0, 0.1, grid.shape)
    return positions, np.diag([4.8, 4.8, 4.8]), rng.integers(0, 3, len(grid))


def _energy(potential: DFTD3) -> float:
    positions, cell, species = _system()
    return evaluate_reference(potential, positions, cell, (True, True, True), species).energy


def _no_aimnet(monkeypatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "aimnet" else find_spec(name)
    )


def test_functional_presets_and_overrides():
    pbe = DFTD3(ELEMENTS, 8.0, 6.0)
    assert pbe.damping == {"s6": 1.0, "a1": 0.4289, "s8": 0.7875, "a2": 4.4407}
    b3lyp = DFTD3(ELEMENTS, 8.0, 6.0, functional="B3LYP", a1=0.5)
    assert b3lyp.damping == {"s6": 1.0, "a1": 0.5, "s8": 1.9889, "a2": 4.4211}
    explicit = DFTD3(ELEMENTS, 8.0, 6.0, functional=None, a1=0.4289, s8=0.7875, a2=4.4407)
    assert explicit.damping == pbe.damping
    assert BJ_FUNCTIONALS["r2scan"] == (1.0, 0.4948, 0.7898, 5.7308)


def test_spec_is_two_layers_of_the_larger_cutoff():
    spec = DFTD3(ELEMENTS, 8.0, 10.0).spec
    assert (spec.cutoff, spec.layers, spec.strategies) == (10.0, 2, ("exchange", "shell"))


def test_coordination_dependence_is_active():
    # the same geometry with every CN reference table flattened to its first entry
    potential = DFTD3(ELEMENTS, 8.0, 6.0)
    ref = D3Reference.from_file(ELEMENTS)
    first = ref.c6[:, :, :1, :1].expand_as(ref.c6).contiguous()
    flat = DFTD3(
        ELEMENTS, 8.0, 6.0, reference=D3Reference(ref.rcov, ref.r4r2, first, ref.cn_i, ref.cn_j)
    )
    assert abs(_energy(potential) - _energy(flat)) > 1e-2 * abs(_energy(potential))


def test_reference_data_of_the_model_elements_only():
    ref = D3Reference.from_file(["O", "H"])
    assert ref.c6.shape == (2, 2, 5, 5) and ref.c6.dtype == torch.float64
    # H-H at the first references of both (Grimme's table: 3.0267)
    assert ref.c6[1, 1, 0, 0].item() == pytest.approx(3.0267, rel=1e-7)
    assert torch.equal(ref.c6, ref.c6.permute(1, 0, 3, 2))


def test_export_from_toml_and_run_without_aimnet(tmp_path, monkeypatch, capsys):
    config = tmp_path / "d3.toml"
    config.write_text(
        'potential = "dftd3"\nelements = ["Si", "O", "H"]\ncutoff = 8.0\ncn_cutoff = 6.0\n'
        'functional = "pbe0"\ns8 = 1.0\n'
    )
    out = tmp_path / "d3.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 0
    assert "dftd3, elements Si O H" in capsys.readouterr().out
    direct = DFTD3(ELEMENTS, 8.0, 6.0, functional="pbe0", s8=1.0)

    _no_aimnet(monkeypatch)  # the model file carries the data
    loaded = load_model(out)
    assert loaded.config() == direct.config()
    assert _energy(loaded) == _energy(direct)


def test_export_with_an_explicit_parameter_file(tmp_path):
    data = Path(importlib.util.find_spec("aimnet").submodule_search_locations[0])
    config = {"potential": "dftd3", "elements": ["O"], "cutoff": 6.0, "cn_cutoff": 5.0}
    from_file = potential_from_config({**config, "parameter_file": str(data / "dftd3_data.pt")})
    assert torch.equal(from_file.c6, potential_from_config(config).c6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"elements": ["C", "Am"]},
            "no D3 parameters for element(s) Am: D3 covers H to Pu",
        ),
        ({"functional": "pbe-d4"}, "no D3(BJ) parameters for functional 'pbe-d4' (known: "),
        ({"functional": None, "a1": 0.4}, "without a functional, D3(BJ) needs s8, a2"),
        ({"cn_cutoff": 0.0}, "cn_cutoff must be positive, got 0.0"),
    ],
    ids=["element", "functional", "damping", "cutoff"],
)
def test_bad_arguments(kwargs, message):
    arguments = {"elements": ["C"], "cutoff": 8.0, "cn_cutoff": 6.0, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        DFTD3(**arguments)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"cutoff": 8.0}, "potential dftd3 needs key(s) elements, cn_cutoff"),
        (
            {"elements": ["C"], "cutoff": 8.0, "cn_cutoff": 6.0, "damping": "zero"},
            "unknown key(s) damping for potential dftd3 (allowed: potential, elements,",
        ),
        (
            {"elements": ["C"], "cutoff": 8.0, "cn_cutoff": 6.0, "parameter_file": "none.pt"},
            "D3 parameter file none.pt not found",
        ),
    ],
    ids=["missing", "unknown", "file"],
)
def test_bad_export_configs(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        potential_from_config({"potential": "dftd3", **config})


def test_export_without_aimnet_says_what_to_install(monkeypatch):
    _no_aimnet(monkeypatch)
    config = {"potential": "dftd3", "elements": ["C"], "cutoff": 8.0, "cn_cutoff": 6.0}
    message = "DFT-D3 reference data come from the aimnet package, which is not installed"
    with pytest.raises(ValueError, match=re.escape(message)):
        potential_from_config(config)
