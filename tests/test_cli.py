"""The ``nvalchemi-lammps`` command: export, info, demo."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from nvalchemi_lammps import LennardJones, LocalGraph, evaluate, load_model, save_model
from nvalchemi_lammps.cli import demo as demo_cli
from nvalchemi_lammps.cli import export as export_cli
from nvalchemi_lammps.cli import info as info_cli
from nvalchemi_lammps.cli import main
from nvalchemi_lammps.cli.demo import StyleRun, compare, lammps_input, thermo_blocks
from nvalchemi_lammps.cli.export import potential_from_config
from nvalchemi_lammps.potentials import potential_class

ARKR = Path(__file__).resolve().parents[1] / "lammps_inputs" / "arkr_lj.toml"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _cluster_energies(potential, count: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Energies and pair forces of a small random cluster with every element."""
    gen = torch.Generator().manual_seed(7)
    n = len(potential.spec.elements)
    species = torch.arange(count) % n
    x = (
        3.0 * torch.rand(count, 3, generator=gen, dtype=torch.float64)
        + torch.arange(count, dtype=torch.float64)[:, None]
    )
    i, j = (
        t.reshape(-1)
        for t in torch.meshgrid(torch.arange(count), torch.arange(count), indexing="ij")
    )
    keep = i != j
    result = evaluate(
        potential, LocalGraph(count, species, i[keep], j[keep], x[j[keep]] - x[i[keep]])
    )
    return result.atom_energies, result.pair_forces


# --- export -----------------------------------------------------------------------------


def test_export_default_writes_the_argon_model(tmp_path, capsys):
    out = tmp_path / "argon.pt"
    assert main(["export", "--default", "-o", str(out)]) == 0
    model = load_model(out)
    assert isinstance(model, LennardJones)
    assert model.spec.elements == ("Ar",)
    assert model.spec.cutoff == 8.5
    assert model.spec.units == "metal"
    config = model.config()
    assert config["epsilon"] == {"Ar": 0.0104}
    assert config["sigma"] == {"Ar": 3.40}
    text = capsys.readouterr().out
    assert f"pair_style   nvalchemi {out}" in text
    assert "pair_coeff   * * Ar" in text
    assert "(reloaded and checked)" in text


def test_export_config_round_trip_with_pairs(tmp_path, capsys):
    config_text = ARKR.read_text() + (
        '\n[[pairs]]\nelements = ["Ar", "Kr"]\nepsilon = 0.0118\nsigma = 3.52\ncutoff = 10.0\n'
    )
    config = _write(tmp_path / "arkr.toml", config_text)
    out = tmp_path / "arkr.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 0
    capsys.readouterr()

    expected = tomllib.loads(config_text)
    expected.pop("potential")
    direct = LennardJones(**expected)
    model = load_model(out)
    assert model.config() == direct.config()
    assert model.spec.cutoff == 10.0  # the longest pair cutoff
    for got, want in zip(_cluster_energies(model), _cluster_energies(direct)):
        assert torch.equal(got, want)


def test_export_checks_a_model_with_non_pairwise_terms(tmp_path, capsys):
    """The reload check also runs models that read positions, charges and the cell."""
    config = ARKR.parent / "nacl_ewald.toml"
    out = tmp_path / "nacl.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 0
    capsys.readouterr()
    assert load_model(out).spec.needs_positions


@pytest.mark.parametrize("slab", ["", "slab = 3.0"], ids=["periodic", "slab"])
def test_export_checks_electrostatics_in_their_own_box(tmp_path, capsys, slab):
    """The reload check runs a slab model (boundary p p f) in a slab, and it sits in a
    pipeline too."""
    term = f'potential = "pme"\nelements = ["Na", "Cl"]\ncutoff = 6.0\nalpha = 0.5\nmesh = 12\n{slab}\n'
    config = tmp_path / "pipeline.toml"
    config.write_text('potential = "pipeline"\n[[terms]]\n' + term)
    out = tmp_path / "pipeline.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 0, capsys.readouterr().out
    assert load_model(out).periodicity == (True, True, not slab)


def test_export_example_config_matches_the_lj_cut_input():
    """lammps_inputs/in.arkr runs lj/cut with these numbers; keep the two in step."""
    config = tomllib.loads(ARKR.read_text())
    script = lammps_input("in.arkr").read_text()
    assert f"pair_style lj/cut {config['cutoff']:g}" in script
    assert f"pair_modify mix {config['mixing']}" in script
    for k, element in enumerate(config["elements"], start=1):
        eps, sig = config["epsilon"][element], config["sigma"][element]
        assert f"pair_coeff {k} {k} {eps:g} {sig:.2f}" in script


def test_default_config_matches_the_lj_cut_input():
    config = tomllib.loads(export_cli.default_config_text())
    script = lammps_input("in.argon").read_text()
    assert f"pair_style lj/cut {config['cutoff']:g}" in script
    assert f"pair_coeff 1 1 {config['epsilon']['Ar']:g} {config['sigma']['Ar']:.2f}" in script


def test_export_refuses_another_suffix(tmp_path, capsys):
    out = tmp_path / "argon.model"
    assert main(["export", "--default", "-o", str(out)]) == 2
    assert capsys.readouterr().out.strip() == (f"error: the model file must end in .pt, got {out}")
    assert not out.exists()


def test_export_names_an_output_it_cannot_write(tmp_path, capsys):
    """One line and exit code 2, before any work; before, torch's writer raised a
    RuntimeError with a traceback. (Run as root here: a path under a regular file is one
    that root cannot write either.)"""
    blocker = _write(tmp_path / "file", "")
    (tmp_path / "folder.pt").mkdir()
    cases = {
        tmp_path / "missing" / "m.pt": f"{tmp_path / 'missing'} does not exist",
        blocker / "m.pt": f"{blocker} is not a folder",
        tmp_path / "folder.pt": "it is a folder",
    }
    for out, why in cases.items():
        assert main(["export", "--default", "-o", str(out)]) == 2
        assert capsys.readouterr().out == f"error: cannot write {out}: {why}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.pt"]


def test_export_writes_nothing_when_its_check_fails(tmp_path, capsys):
    """A model with a nan parameter: before, the file stayed on disk with a message about
    reloaded energies. Now the file is written only after the check (a temporary beside
    it, then renamed): what was at the output before stays, and no temporary is left."""
    config = _write(tmp_path / "nan.toml", _LJ_HEAD + "[epsilon]\nAr = nan\n[sigma]\nAr = 3.4\n")
    out = _write(tmp_path / "lj.pt", "what was here before")
    assert export_cli.main([str(config), "-o", str(out)]) == 1
    assert capsys.readouterr().out == (
        f"error: {out} not written: the check of the written file failed: the potential's "
        "atom energies are not finite on a line of 4 atoms of Ar, 0.3 cutoff apart: look "
        "for nan or inf among its parameters\n"
    )
    assert out.read_text() == "what was here before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lj.pt", "nan.toml"]


def test_export_check_names_what_differs(tmp_path):
    """The check compares the file loaded back with the potential: another model's file
    differs, and the message says in what."""
    config = tomllib.loads(export_cli.default_config_text())
    potential = potential_from_config(config)
    config["epsilon"] = {"Ar": 2 * config["epsilon"]["Ar"]}
    other = save_model(potential_from_config(config), tmp_path / "other.pt")
    message = (
        "the file loaded back gives other atom energies and pair forces than the potential "
        "on a line of 4 atoms of Ar, 0.3 cutoff apart"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        export_cli.check_model_file(potential, other)


def _unknown_potential_message(name: str) -> str:
    """What the potential registry says about ``name``; it lists every registered one."""
    with pytest.raises(ValueError) as exc:
        potential_class(name)
    assert re.fullmatch(rf"unknown potential '{name}' \(known: .*lennard_jones.*\)", str(exc.value))
    return str(exc.value)


_LJ_HEAD = 'potential = "lennard_jones"\nelements = ["Ar"]\ncutoff = 8.5\n'
_LJ_TABLES = "[epsilon]\nAr = 0.01\n[sigma]\nAr = 3.4\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            _LJ_HEAD + "foo = 1\n" + _LJ_TABLES,
            (
                "unknown key(s) foo for potential lennard_jones (allowed: potential, elements, "
                "epsilon, sigma, cutoff, pairs, mixing, shift, units, dtype)"
            ),
        ),
        (
            'potential = "lennard_jones"\nelements = ["Ar"]\n[epsilon]\nAr = 0.01\n',
            "potential lennard_jones needs key(s) sigma, cutoff",
        ),
        ('elements = ["Ar"]\n', 'the configuration needs a top-level key potential = "<name>"'),
        # the registry may grow as other tests import their potentials: build it at run time
        ('potential = "morse"\n', lambda: _unknown_potential_message("morse")),
        (
            _LJ_HEAD + 'mixing = "magic"\n' + _LJ_TABLES,
            "mixing must be one of geometric, arithmetic, sixthpower; got 'magic'",
        ),
    ],
    ids=["unknown-key", "missing-keys", "no-potential", "unknown-potential", "bad-value"],
)
def test_export_reports_bad_configs(tmp_path, capsys, text, message):
    config = _write(tmp_path / "bad.toml", text)
    out = tmp_path / "bad.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 1
    message = message() if callable(message) else message
    assert capsys.readouterr().out.strip() == f"error: {message}"


def test_export_reports_unreadable_configs(tmp_path, capsys):
    missing = tmp_path / "missing.toml"
    assert export_cli.main([str(missing), "-o", str(tmp_path / "m.pt")]) == 1
    assert capsys.readouterr().out.strip() == f"error: configuration file {missing} not found"
    broken = _write(tmp_path / "broken.toml", "potential = \n")
    assert export_cli.main([str(broken), "-o", str(tmp_path / "m.pt")]) == 1
    assert re.match(
        re.escape(f"error: configuration file {broken} is not valid TOML: "),
        capsys.readouterr().out,
    )


def test_export_needs_a_config_or_default(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        export_cli.main(["-o", str(tmp_path / "m.pt")])
    assert exc.value.code == 2
    assert "one of the arguments CONFIG.toml --default is required" in capsys.readouterr().err


def test_potential_from_config_is_what_export_writes(tmp_path, capsys):
    config = tomllib.loads(export_cli.default_config_text())
    out = tmp_path / "argon.pt"
    assert export_cli.main(["--default", "-o", str(out), "--no-check"]) == 0
    assert "reloaded" not in capsys.readouterr().out
    assert load_model(out).config() == potential_from_config(config).config()


# --- demo (no LAMMPS) -------------------------------------------------------------------


def _style_run(style: str, pe: float, forces: np.ndarray, ids: np.ndarray) -> StyleRun:
    results = {
        "atoms": float(len(ids)),
        "step0_pe": pe,
        "step0_press": 100.0,
        "nvt_steps": 10.0,
        "nve_steps": 10.0,
        "dt": 0.002,
        "nve_start_etotal": -1.0,
        "final_pe": -2.0,
        "final_ke": 1.0,
        "final_etotal": -1.0,
        "final_press": 10.0,
        "final_temp": 50.0,
    }
    dump = {"id": ids, "fx": forces[:, 0], "fy": forces[:, 1], "fz": forces[:, 2]}
    return StyleRun(style, Path("."), results, dump, [], 1.0)


def test_demo_comparison_passes_identical_runs_and_fails_different_ones():
    ids = np.arange(1.0, 5.0)
    forces = np.array([[0.1, -0.2, 0.3], [0.0, 0.5, -0.1], [0.2, 0.2, 0.2], [-0.3, 0.1, 0.0]])
    same = _style_run("lj/cut", -10.0, forces, ids)
    lines, ok = compare([_style_run("nvalchemi", -10.0, forces, ids), same])
    assert ok and lines[-1].startswith("PASS")

    bent = forces.copy()
    bent[2, 1] += 1e-9  # 2e-9 relative to max |F| = 0.5
    lines, ok = compare([_style_run("nvalchemi", -10.0, bent, ids), same])
    assert not ok and lines[-1].startswith("FAIL")
    assert "largest difference on atom 3" in "\n".join(lines)

    lines, ok = compare([_style_run("nvalchemi", -10.0 * (1 + 1e-9), forces, ids), same])
    assert not ok

    lines, ok = compare([_style_run("nvalchemi", -10.0, forces, ids[::-1] + 10), same])
    assert not ok and "different atom IDs" in "\n".join(lines)


def test_thermo_blocks_keep_headers_rows_and_loop_times():
    lines = [
        "Setting up Verlet run ...",
        "   Step          Temp          PotEng   ",
        "         0   0             -169.10835  ",
        "        50   54.2          -155.1      ",
        "Loop time of 1.2 on 2 procs for 50 steps with 2048 atoms",
        "",
        "MPI task timing breakdown:",
    ]
    assert thermo_blocks("\n".join(lines)) == lines[1:5]


def test_demo_rejects_nonpositive_sizes(capsys):
    assert demo_cli.main(["--ranks", "0"]) == 2
    assert "must be positive" in capsys.readouterr().out


def test_demo_names_a_workdir_it_cannot_make(tmp_path, capsys):
    """Before: a raw NotADirectoryError traceback."""
    workdir = _write(tmp_path / "file", "") / "demo"
    assert demo_cli.main(["--workdir", str(workdir)]) == 2
    assert capsys.readouterr().out == (
        f"error: --workdir {workdir}: cannot make this folder: Not a directory\n"
    )


def _probe_report(accelerators: dict[str, list[str]]) -> dict:
    """What the LAMMPS probe reports for a LAMMPS with ML-IAP and PYTHON, without the
    plugin, with these accelerator packages."""
    return {
        "version": 20260704,
        "mpi": True,
        "gpu_device": False,
        "accelerators": accelerators,
        "packages": ["KOKKOS", "ML-IAP", "ML-SNAP", "PLUGIN", "PYTHON"],
        "plugin_package": True,
        "python_package": True,
        "mliap_package": True,
        "mliap_style": True,
        "nvalchemi": False,
        "nvalchemi_autoloaded": False,
    }


@pytest.mark.parametrize(
    ("apis", "expected"),
    [
        (["cuda", "serial"], "KOKKOS (cuda, serial): run with -k on g N -sf kk -pk kokkos"),
        (["openmp"], "KOKKOS (openmp): run with -k on -sf kk"),
        ([], None),
    ],
    ids=["kokkos-cuda", "kokkos-openmp", "no-kokkos"],
)
def test_info_reports_kokkos(apis, expected):
    """KOKKOS and its execution spaces are named, with the switches ML-IAP needs on them."""
    lines, works = info_cli.report(_probe_report({"KOKKOS": apis} if apis else {}))
    text = "\n".join(lines)
    assert not works
    assert "pair_style mliap unified  available (ML-IAP with the PYTHON package)" in text
    if expected:
        assert expected in text, text
        assert f"accelerators    KOKKOS ({', '.join(apis)})" in text
    else:
        assert "KOKKOS (" not in text and "accelerators    none" in text


# --- with LAMMPS ------------------------------------------------------------------------


@pytest.mark.lammps
def test_info_reports_a_working_pair_style(capsys):
    code = main(["info"])
    text = capsys.readouterr().out
    assert f"torch             {torch.__version__}" in text
    assert re.search(r"^LAMMPS\s+\d+ \w{3} \d{4}", text, re.MULTILINE), text
    assert re.search(r"^pair_style nvalchemi\s+available", text, re.MULTILINE), text
    assert "works, two Ar atoms" in text
    assert code == 0


@pytest.mark.lammps
def test_demo_passes_on_two_ranks(tmp_path, capsys):
    code = main(
        ["demo", "--ranks", "2", "--atoms", "256", "--steps", "20", "--workdir", str(tmp_path)]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "PASS: step-0 relative differences" in text
    assert (tmp_path / "nvalchemi" / "log.lammps").is_file()
    assert (tmp_path / "lj_cut" / "forces_step0.dump").is_file()


#: Where the docs show pipeline configurations.
PIPELINE_DOCS = ["README.md", "docs/pipelines.md"]


def _pipeline_examples() -> list[str]:
    """The TOML blocks of :data:`PIPELINE_DOCS` that configure a pipeline reading no file
    (``checkpoint = ...`` needs one this test does not have)."""
    root = Path(__file__).resolve().parents[1]
    blocks = [
        block.split("```", 1)[0]
        for name in PIPELINE_DOCS
        if (root / name).is_file()
        for block in (root / name).read_text().split("```toml\n")[1:]
    ]
    reads_a_file = re.compile(r"^\s*checkpoint\s*=", re.MULTILINE)
    return [b for b in blocks if 'potential = "pipeline"' in b and not reads_a_file.search(b)]


def test_docs_pipeline_example_exports(tmp_path, capsys):
    """A pipeline configuration the docs show (AIMNet2 with random weights, DFT-D3 and PME
    on AIMNet2's charges) is one export accepts and checks."""
    examples = _pipeline_examples()
    assert examples, f"no pipeline example without files in {', '.join(PIPELINE_DOCS)}"
    config = tmp_path / "pipeline.toml"
    config.write_text(examples[0])
    out = tmp_path / "pipeline.pt"
    assert export_cli.main([str(config), "-o", str(out)]) == 0, capsys.readouterr().out
    assert [t.name for t in load_model(out).terms] == ["aimnet2", "dftd3", "pme"]
