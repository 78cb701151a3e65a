"""``nvalchemi-lammps bench``: a small real run end to end (JSON and plot), a model that is
wrong across ranks makes it fail, and bad configurations are refused."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from nvalchemi_lammps.cli import main

pytestmark = pytest.mark.lammps

TESTS = Path(__file__).resolve().parent


def _config(tmp_path: Path, model: str, extra: str = "") -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: small
            model: {model}
            lattice: fcc:4.1
            atoms: [256]
            elements: [Ar, Ne]
            ranks: [1, 2]
            steps: 3
            warmup: 1
            repeats: 1
            temperature: 50.0
            """
        )
        + extra
    )
    return path


def test_bench_reports_every_run(tmp_path, capsys):
    config = _config(
        tmp_path, "{potential: message_passing, elements: [Ar, Ne], cutoff: 4.5, layers: 2}"
    )
    assert main(["bench", str(config), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "bench_small.json").read_text())
    assert [(r["atoms"], r["ranks"]) for r in result["rows"]] == [(256, 1), (256, 2)]
    for row in result["rows"]:
        assert row["ms_per_step"] > 0.0 and row["model_ms"] > 0.0
        assert row["force_difference"] <= 1e-10
        assert row["peak_host_mib"] > 0.0
    # the 2-layer model exchanges ghost features on 2 ranks
    assert result["rows"][1]["collectives_ms"] > 0.0
    assert (tmp_path / "out" / "bench_small.png").read_bytes()[:4] == b"\x89PNG"
    assert "atom-steps/s" in capsys.readouterr().out


def test_bench_of_a_compiled_model_counts_its_compilations(tmp_path, capsys):
    config = _config(
        tmp_path,
        "{potential: message_passing, elements: [Ar, Ne], cutoff: 4.5, layers: 2}",
        'compile: "yes"\n',
    )
    assert main(["bench", str(config), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "bench_small.json").read_text())
    # the first steps compiled the model; the timed steps fit its capacities
    assert [r["compiled"] for r in result["rows"]] == [0, 0]
    assert all(r["force_difference"] <= 1e-10 for r in result["rows"])
    assert "compiled" in capsys.readouterr().out.splitlines()[0]


def test_bench_fails_when_rank_counts_disagree(tmp_path, monkeypatch, capsys):
    """A model reaching further than it declares gives other forces on 2 ranks."""
    site = tmp_path / "site"
    site.mkdir()
    # every process of the run (the mpirun workers too) registers the broken model
    (site / "sitecustomize.py").write_text("import _broken_models  # noqa: F401\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}:{TESTS}:{TESTS.parent}")
    (tmp_path / "models.py").write_text(
        textwrap.dedent(
            """\
            from _broken_models import UnderdeclaredMessagePassing

            def build():
                return UnderdeclaredMessagePassing(["Ar", "Ne"], cutoff=4.5, layers=3)
            """
        )
    )
    config = _config(tmp_path, '{python: "models.py:build"}')
    assert main(["bench", str(config), "--out", str(tmp_path), "--no-plot"]) == 1
    assert "step-0 forces differ across rank counts" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [("colour: red\n", "unknown key(s) colour"), ("units: lj\n", "units must be one of")],
    ids=["unknown-key", "units"],
)
def test_bad_configuration_is_refused(tmp_path, capsys, extra, message):
    config = _config(tmp_path, "{file: missing.pt}", extra)
    assert main(["bench", str(config)]) == 2
    assert message in capsys.readouterr().out


CONFIGS = sorted((TESTS.parent / "benchmarks" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_benchmark_configurations_build_their_models(path, tmp_path):
    """Every configuration in benchmarks/configs reads and writes its model file."""
    from nvalchemi_lammps.cli.bench import build_model, read_bench_config

    config = read_bench_config(path)
    potential = build_model(config, tmp_path / "model.pt")
    assert (tmp_path / "model.pt").is_file()
    assert len(config.elements) <= len(potential.spec.elements)
