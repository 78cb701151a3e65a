"""``nvalchemi-lammps bench``: a small real run end to end (JSON and plot), styles timed in
alternating rounds beside a peer (LAMMPS's lj/cut) and the bare model, a model that is wrong
across ranks makes it fail, and bad configurations are refused."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nvalchemi_lammps.cli import main

TESTS = Path(__file__).resolve().parent


def _config(tmp_path: Path, model: str, extra: str = "", ranks: str = "[1, 2]") -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: small
            model: {model}
            lattice: fcc:4.1
            atoms: [256]
            elements: [Ar, Ne]
            ranks: {ranks}
            steps: 3
            warmup: 1
            rounds: 1
            temperature: 50.0
            """
        )
        + extra
    )
    return path


@pytest.mark.lammps
def test_bench_reports_every_run(tmp_path, capsys):
    config = _config(
        tmp_path, "{potential: message_passing, elements: [Ar, Ne], cutoff: 4.5, layers: 2}"
    )
    out = tmp_path / "out"
    assert main(["bench", str(config), "--out", str(out), "--profile"]) == 0
    result = json.loads((out / "bench_small.json").read_text())
    rows = result["rows"]
    assert [(r["atoms"], r["ranks"], r["style"]) for r in rows] == [
        (256, 1, "nvalchemi"),
        (256, 2, "nvalchemi"),
    ]
    # rank 0's profile of each process: the table of ops and the timeline
    for ranks in (1, 2):
        stem = out / f"profile_small_256_{ranks}_nvalchemi"
        assert "Self CPU" in stem.with_suffix(".txt").read_text()
        assert json.loads(stem.with_suffix(".json").read_text())["traceEvents"]
    for row in rows:
        assert row["ms_per_step"] > 0.0 and row["inside_model_ms"] > 0.0
        assert row["force_difference"] <= 1e-10
        assert row["peak_host_mib"] > 0.0
    # the 2-layer model exchanges ghost features on 2 ranks
    assert rows[1]["collectives_ms"] > 0.0
    # the bare model is timed on 1 rank only (in the same process as the steps)
    assert rows[0]["model_ms"] > 0.0 and rows[0]["step_over_model"] > 0.0
    assert rows[1]["model_ms"] is None
    assert (out / "bench_small.png").read_bytes()[:4] == b"\x89PNG"
    assert "step/mdl" in capsys.readouterr().out
    # each process's output: LAMMPS's screen and what the run did when
    for ranks in (1, 2):
        log = (out / f"bench_small_256_{ranks}.log").read_text()
        assert "Loop time of" in log and "[bench" in log
        assert "round 0: nvalchemi timed" in log


@pytest.mark.lammps
def test_bench_of_a_compiled_model_counts_its_compilations(tmp_path, capsys):
    """One rank, whose process compiles the model twice (the pair style's and the bare
    model's): the count column of the timed steps. Rank counts side by side are
    test_bench_reports_every_run's; a compiled model on 1, 2 and 4 ranks equal to the
    reference, and its MD on 2 ranks compiling nothing after its first step,
    test_lammps_compile's."""
    config = _config(
        tmp_path,
        "{potential: message_passing, elements: [Ar, Ne], cutoff: 4.5, layers: 2}",
        'compile: "yes"\n',
        ranks="[1]",
    )
    assert main(["bench", str(config), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "bench_small.json").read_text())
    # the first steps compiled the model; the timed steps fit its capacities
    assert [(r["ranks"], r["compiled"]) for r in result["rows"]] == [(1, 0)]
    # the log says what the pair style's and the bare model's graphs are padded to
    log = (tmp_path / "out" / "bench_small_256_1.log").read_text()
    assert re.search(
        r"nvalchemi timed, .* s; \d+ graphs so far, padded to \d+ atoms, \d+ pairs", log
    )
    assert re.search(r"the bare model \(padded to \d+ atoms, \d+ pairs\) built", log)
    assert result["rows"][0]["model_ms"] > 0.0  # the bare model, compiled alike, timed
    assert "compiled" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.lammps
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
    [
        ("colour: red\n", "unknown key(s) colour"),
        ("units: lj\n", "units must be one of"),
        ("time_limit: 0\n", "time_limit must be positive"),
    ],
    ids=["unknown-key", "units", "time-limit"],
)
def test_bad_configuration_is_refused(tmp_path, capsys, extra, message):
    config = _config(tmp_path, "{file: missing.pt}", extra)
    assert main(["bench", str(config)]) == 2
    assert message in capsys.readouterr().out


@pytest.mark.lammps
def test_styles_take_turns_beside_a_peer(tmp_path):
    """The host door and LAMMPS's lj/cut on the same argon, two rounds in one process: both
    timed every round, the same step-0 forces, only our door split into phases."""
    config = tmp_path / "lj.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            name: lj
            model: {potential: lennard_jones, elements: [Ar], epsilon: {Ar: 0.0104},
                    sigma: {Ar: 3.40}, cutoff: 6.0}
            lattice: fcc:5.26
            atoms: [256]
            elements: [Ar]
            ranks: [1]
            styles:
              - nvalchemi
              - {name: lj/cut, pair_style: "lj/cut 6.0", pair_coeff: ["* * 0.0104 3.40"]}
            steps: 3
            warmup: 1
            rounds: 2
            calls: 2
            temperature: 50.0
            """
        )
    )
    assert main(["bench", str(config), "--out", str(tmp_path), "--no-plot"]) == 0
    ours, peer = json.loads((tmp_path / "bench_lj.json").read_text())["rows"]
    assert (ours["style"], peer["style"]) == ("nvalchemi", "lj/cut")
    assert len(ours["rounds_ms"]) == len(peer["rounds_ms"]) == 2
    assert peer["force_vs_first_style"] <= 1e-10
    assert ours["bridge_ms"] is not None and peer["bridge_ms"] is None
    assert ours["model_ms"] == peer["model_ms"] > 0.0  # one bare model for the process
    assert ours["over_first"] == 1.0 and peer["over_first"] > 0.0
    # every turn ran the same steps from the same positions and velocities
    assert ours["rounds_pe"][0] == ours["rounds_pe"][1]
    assert peer["rounds_pe"][0] == peer["rounds_pe"][1]
    assert ours["rounds_pe"][0] == pytest.approx(peer["rounds_pe"][0], rel=1e-10)


def test_rounds_rotate_the_order_of_the_styles():
    from nvalchemi_lammps.cli._bench_worker import turn_order

    assert [turn_order(["a", "b", "c"], t) for t in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        ("styles: [lammps]\n", "unknown door 'lammps'"),
        ("styles: [{name: lj}]\n", "style lj: a door or a pair_style"),
        ("styles: [nvalchemi/kk]\n", "nvalchemi/kk needs a KOKKOS LAMMPS"),
        ("styles: [mliap]\n", "mliap needs a LAMMPS with ML-IAP and PYTHON"),
        ("styles: [nvalchemi, nvalchemi]\n", "style names must differ"),
        ("gpus: 1\n", "gpus runs a KOKKOS LAMMPS"),
    ],
    ids=["door", "peer", "kokkos", "mliap", "names", "gpus"],
)
def test_bad_styles_are_refused(tmp_path, capsys, extra, message):
    config = _config(tmp_path, "{file: missing.pt}", extra)
    assert main(["bench", str(config)]) == 2
    assert message in capsys.readouterr().out


def test_the_command_line_picks_styles_and_model_arguments(tmp_path):
    from nvalchemi_lammps.cli._bench_config import (
        model_argument,
        read_bench_config,
        with_overrides,
    )

    peer = '{name: lj, pair_style: "lj/cut 4.0", pair_coeff: ["* * 0.01 3.4"]}'
    extra = f"styles: [nvalchemi, {peer}, {{name: shell, door: nvalchemi}}]\n"
    path = _config(tmp_path, '{python: "models.py:build", args: {cutoff: 4.5}}', extra)
    config = read_bench_config(path)
    arguments = dict(map(model_argument, ["layers=3", "compile=true", "name=Ar-Ne"]))
    picked = with_overrides(config, path, styles=["shell", "lj"], model_args=arguments)
    assert [s.name for s in picked.styles] == ["shell", "lj"]
    assert picked.model["args"] == {"cutoff": 4.5, "layers": 3, "compile": True, "name": "Ar-Ne"}
    assert with_overrides(config, path, styles=None, model_args={}) == config


@pytest.mark.parametrize(
    "model, arguments, message",
    [
        ('{python: "models.py:build"}', ["--styles", "kk"], "no style kk (styles: nvalchemi)"),
        ('{python: "models.py:build"}', ["--model-arg", "layers"], "is KEY=VALUE, got 'layers'"),
        ("{file: model.pt}", ["--model-arg", "a=1"], "go to a model.python function"),
    ],
    ids=["style", "argument", "not-python"],
)
def test_bad_command_line_overrides_are_refused(tmp_path, capsys, model, arguments, message):
    assert main(["bench", str(_config(tmp_path, model)), *arguments]) == 2
    assert message in capsys.readouterr().out


#: UMA's need fairchem-core: tests/test_benchmark_models_uma.py builds them, in .venv-uma
CONFIGS = [
    p
    for p in sorted((TESTS.parent / "benchmarks" / "configs").glob("*.yaml"))
    if not p.stem.startswith("uma")
]


@pytest.mark.slow  # MACE and AIMNet2 take tens of seconds to build
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_benchmark_configurations_build_their_models(path, tmp_path):
    """Every configuration in benchmarks/configs reads and writes its model file."""
    from nvalchemi_lammps.cli._bench_config import build_model, read_bench_config

    config = read_bench_config(path)
    potential = build_model(config, tmp_path / "model.pt")
    assert (tmp_path / "model.pt").is_file()
    assert len(config.elements) <= len(potential.spec.elements)


def _expand(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``abd``, ``acd`` (the shell's braces, as the docs write file groups)."""
    head, brace, rest = pattern.partition("{")
    if not brace:
        return [pattern]
    inner, _, tail = rest.partition("}")
    return [p for choice in inner.split(",") for p in _expand(head + choice + tail)]


def test_results_hold_what_the_docs_cite_and_nothing_else():
    """benchmarks/results keeps the files docs/performance.md cites, each indexed in
    results/README.md."""
    import re

    results = TESTS.parent / "benchmarks" / "results"
    docs = (TESTS.parent / "docs" / "performance.md").read_text()
    index = (results / "README.md").read_text()
    cited = {
        name
        for found in re.findall(r"`(\d{4}-\d\d-\d\d-[\w-]+/[^`]+)`", docs)
        for name in _expand(found)
    }
    kept = {str(p.relative_to(results)) for p in results.rglob("*") if p.is_file()}
    assert cited - kept == set(), "cited but missing"
    assert kept - cited - {"README.md"} == set(), "kept but not cited"
    indexed = {name for found in re.findall(r"`([^`]+)`", index) for name in _expand(found)}
    assert kept - indexed - {"README.md"} == set(), "not in results/README.md"


def test_the_timeline_says_where_a_step_goes_on_the_gpu():
    """The profile's summary of a GPU timeline (torch.profiler's trace format): busy and
    idle time, the work by what launched it, kernels outside the graphs, idle stretches
    with the host operation running then. One step: a graph of two kernels, a Kokkos kernel
    after 20 us idle (the host in the pair style), an eager kernel overlapping it, a copy."""
    from nvalchemi_lammps.cli._bench_timeline import timeline_summary

    def op(cat, name, ts, dur, correlation=None):
        args = {} if correlation is None else {"correlation": correlation}
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}

    trace = {
        "traceEvents": [
            op("cpu_op", "pair compute", 0, 100),
            op("cuda_runtime", "cudaGraphLaunch", 10, 5, 1),
            op("kernel", "graph_first", 20, 30, 1),
            op("kernel", "graph_second", 50, 20, 1),
            op("cuda_runtime", "cudaLaunchKernel", 60, 2, 2),
            op("kernel", "Kokkos::parallel_for pairs", 90, 10, 2),
            op("cuda_runtime", "cudaLaunchKernel", 62, 2, 3),
            op("kernel", "elementwise", 95, 10, 3),
            op("cuda_runtime", "cudaMemcpyAsync", 110, 2, 4),
            op("gpu_memcpy", "Memcpy DtoH", 120, 5, 4),
        ]
    }
    summary = timeline_summary(trace, steps=1)
    assert "0.125 ms in all, the GPU busy 0.070 ms and idle 0.035 ms" in summary
    by_source = summary.split("GPU work by what launched it:\n")[1].split("longest kernels")[0]
    assert [line.strip() for line in by_source.splitlines()] == [
        "0.050 ms  CUDA graphs",
        "0.010 ms  Kokkos (LAMMPS, the pair style)",
        "0.010 ms  kernels launched one by one (torch)",
        "0.005 ms  copies and sets",
    ]
    outside = summary.split("outside CUDA graphs")[1].split("longest idle")[0]
    assert "Kokkos::parallel_for pairs" in outside and "graph_first" not in outside
    idle = summary.split("running meanwhile:\n")[1].splitlines()
    assert [line.strip() for line in idle] == ["20.0 us  pair compute", "15.0 us  (none traced)"]
    assert "no GPU work" in timeline_summary({"traceEvents": trace["traceEvents"][:1]}, 1)


def test_the_bare_model_runs_the_potential_the_pair_style_opened(tmp_path):
    """In the benchmark's process the bare model takes the potential the pair styles opened
    from the same file (what torch compiled for it is not compiled again), and its own
    from any other file."""
    from _systems import fcc_argon_222, lennard_jones

    from nvalchemi_lammps import save_model
    from nvalchemi_lammps.cli._bench_worker import BareModel
    from nvalchemi_lammps.frontends.plugin import open_session

    system = fcc_argon_222()
    model = str(save_model(lennard_jones(system), tmp_path / "model.pt"))
    other = str(save_model(lennard_jones(system, cutoff=6.0), tmp_path / "other.pt"))
    np.savez(
        tmp_path / "system.npz",
        positions=system.positions,
        cell=system.cell,
        types=np.asarray(system.species) + 1,
    )
    spec = {"system": str(tmp_path / "system.npz"), "device": "cpu", "compile": "no"}
    session = open_session(model, 1)
    bare = BareModel({**spec, "model": model})
    assert bare.potential is session.potential
    assert bare.samples(1)[0] > 0.0
    assert BareModel({**spec, "model": other}).potential.spec.cutoff == 6.0


@pytest.mark.lammps
def test_a_time_limit_ends_the_rounds_early(tmp_path, capsys):
    """With a time limit every process measures its first round and begins no other that
    would end past the limit, on every rank alike (rank 0's clock decides: 2 ranks end
    together, no hang), and says so; without one, every round."""
    config = _config(
        tmp_path,
        "{potential: message_passing, elements: [Ar, Ne], cutoff: 4.5, layers: 2}",
        "rounds: 3\nbare_model: false\n",
    )
    out = tmp_path / "out"
    assert main(["bench", str(config), "--out", str(out), "--no-plot", "--time-limit", "1e-3"]) == 0
    rows = json.loads((out / "bench_small.json").read_text())["rows"]
    assert [(r["ranks"], len(r["rounds_ms"])) for r in rows] == [(1, 1), (2, 1)]
    said = capsys.readouterr().out
    assert "256 atoms, 2 rank(s): 1 of 3 rounds within the time limit (0.001 s)" in said
    assert "stopped after 1 of 3 rounds" in (out / "bench_small_256_2.log").read_text()
    assert main(["bench", str(config), "--out", str(out), "--no-plot", "--ranks", "2"]) == 0
    rows = json.loads((out / "bench_small.json").read_text())["rows"]
    assert [len(r["rounds_ms"]) for r in rows] == [3]
