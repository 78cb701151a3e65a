"""What a KOKKOS LAMMPS step costs beyond the model, measured in turns inside one LAMMPS
process: ``run STEPS`` of a style, then the bare model (kokkos_lammps.BareModel: the whole
periodic system, no LAMMPS) timed ``--calls`` times by LAMMPS's embedded Python
(``python source here``), ``--turns`` times over, on 1 rank and 1 GPU.

The host of a small model's step is the bottleneck (launch-bound), and its speed drifts by
tens of percent between minutes (docs/performance.md, round 9): a step and a bare model
timed in separate processes minutes apart do not give its fixed cost. Here each turn's
ms/step is set against the mean of the bare model's medians just before and just after it,
in the same process, on the same GPU context: printed and written are the median over the
turns of the difference (the fixed cost per step) and of the ratio.

    python benchmarks/kokkos_fixed_cost.py DIR --lammps PREFIX --atoms 1000 20000 \\
        --styles kk kk-compile mliap

DIR is ``kokkos_lammps.py prepare``'s folder; PREFIX as for kokkos_lammps.py. With
``--torchscript-optimized`` the engine runs TorchScript's optimizing executor (off in a
release) for the style and the bare model alike (docs/performance.md, round 14).

With ``--interleave`` the eager styles share one LAMMPS process instead: each turn runs
every style in turn (the order rotating from turn to turn), each from its own
``pair_style`` command, a short untimed run, then the timed one, and the bare model after
the turn. The host's drift then hits every door of a turn alike: printed per style are the
medians over the turns of its ms/step, of its step / model and of its ms/step over the
first style's (docs/performance.md, round 16).

    python benchmarks/kokkos_fixed_cost.py DIR --lammps PREFIX --atoms 1000 20000 \\
        --styles kk mliap mace-torch --interleave --turns 6

``--exchanges gather comm`` (with ``--interleave``) also runs this project's styles with
``NVALCHEMI_LAMMPS_EXCHANGE=comm`` (``kk/comm``, ``mliap/comm``: every ghost-feature exchange
through LAMMPS's communication, where one rank's default gathers by owned row), set in the
process's environment before each ``pair_style`` command.

``--gpus 0`` runs the same on a KOKKOS LAMMPS for the host (``make test``'s, Serial), models
on the CPU: to try a run's scripts end to end before device time is spent on them
(mace-torch's class then stops: its file, pickled on a machine without
``MACE_ALLOW_CPU=true``, refuses the CPU).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import kokkos_lammps as kl
from bench_strategies import LATTICE, crystal

from nvalchemi_lammps.frontends.mliap import EXCHANGE_ENV

#: the bare models this process timed, by (model file, atoms, compile mode): kept between the
#: ``python source`` commands of one LAMMPS run
_MODELS: dict[tuple[str, int, str], kl.BareModel] = {}


def time_bare(
    model_file: str, atoms: int, calls: int, mode: str, out: str, device: str = "cuda"
) -> None:
    """Called by LAMMPS's embedded Python between runs: append the bare model's median ms of
    ``calls`` calls to ``out`` (the first call builds and warms it up, untimed)."""
    key = (model_file, atoms, mode)
    if key not in _MODELS:
        _, system = crystal(atoms, LATTICE["mace"], Path(out).with_suffix(".data"))
        _MODELS[key] = kl.BareModel(Path(model_file), system, device, mode)
        _MODELS[key].samples(2)
    with open(out, "a") as stream:
        stream.write(f"{statistics.median(_MODELS[key].samples(calls))}\n")


def bare_command(
    model_file: str | Path, atoms: int, calls: int, mode: str, out: Path, device: str
) -> str:
    """The LAMMPS command that times the bare model (time_bare) in LAMMPS's Python."""
    call = (
        f"import sys; sys.path.insert(0, '{HERE}'); import kokkos_fixed_cost as f; "
        f"f.time_bare('{model_file}', {atoms}, {calls}, '{mode}', '{out}', '{device}')"
    )
    return f'python source here "{call}"\n'


def turn_order(names: list[str], turn: int) -> list[str]:
    """--interleave's styles in ``turn``: rotated by one each turn."""
    k = turn % len(names)
    return names[k:] + names[:k]


def script(
    data: Path,
    pair_style: str,
    model_file: Path,
    atoms: int,
    steps: int,
    turns: int,
    calls: int,
    mode: str,
    out: Path,
    device: str,
    optimized: bool = False,
) -> str:
    """The style's MD with the bare model timed before the first timed run and after each;
    ``optimized``: with TorchScript's optimizing executor on in the engine, for the style
    and the bare model (``engine.optimize_torchscript``)."""
    bare = bare_command(model_file, atoms, calls, mode, out, device)
    text = kl.md_script(data, pair_style, "Ar Kr", "") + "thermo 0\nrun 5\n" + bare
    if optimized:
        setting = "from nvalchemi_lammps.engine import optimize_torchscript as o; o(True)"
        text = f'python source here "{setting}"\n' + text
    return text + (f"run {steps}\n" + bare) * turns


def interleaved_script(
    data: Path,
    pair_styles: dict[str, tuple[str, str]],
    model_file: Path,
    atoms: int,
    steps: int,
    turns: int,
    calls: int,
    out: Path,
    device: str,
) -> str:
    """Every style in each turn, its order rotating, a warm-up run after each ``pair_style``
    command; the bare model timed before the first turn and after each. ``pair_styles``:
    name -> (pair style, NVALCHEMI_LAMMPS_EXCHANGE), the setting made in the process's
    environment before the style's ``pair_style`` command (both doors read it there)."""
    bare = bare_command(model_file, atoms, calls, "no", out, device)
    names = list(pair_styles)
    first = pair_styles[names[0]][0]
    text = kl.md_script(data, first, "Ar Kr", "") + "thermo 0\nrun 5\n" + bare
    for turn in range(turns):
        for name in turn_order(names, turn):
            pair_style, exchange = pair_styles[name]
            setting = f"import os; os.environ['{EXCHANGE_ENV}'] = '{exchange}'"
            # none first: LAMMPS hands a repeated style's arguments to the pair it has
            text += f'python source here "{setting}"\n'
            text += f"pair_style none\npair_style {pair_style}\npair_coeff * * Ar Kr\n"
            text += f"run {INTERLEAVE_WARMUP}\nrun {steps}\n"
        text += bare
    return text


#: untimed steps after each pair_style command of --interleave (the door's first steps
#: build its model and lists)
INTERLEAVE_WARMUP = 3


def measure_interleaved(
    folder: Path,
    lammps: kl.Lammps,
    atoms: int,
    styles: list[str],
    steps: int,
    turns: int,
    calls: int,
    exchanges: list[str],
    gpus: int = 1,
) -> list[dict]:
    """The eager ``styles`` in turns in one LAMMPS process; a row per style, and per each of
    ``exchanges`` for the styles of this project's file (``STYLE/comm`` for ``comm``)."""
    pair_styles, rows = {}, []
    device = "cuda" if gpus else "cpu"
    data, system = crystal(atoms, LATTICE["mace"], folder / f"bench{atoms}.data")
    ours = folder / "mace32_e3nn.pt"
    for style in styles:
        door, whose, mode = kl.STYLES[style]
        if mode != "no" or not door.kokkos:
            raise SystemExit(f"--interleave takes eager KOKKOS styles, not {style}")
        model_file = folder / "mace32_own.pt" if whose == "mace-torch" else ours
        for exchange in exchanges if whose == "nvalchemi" else exchanges[:1]:
            name = style if exchange == "gather" else f"{style}/{exchange}"
            pair_styles[name] = (door.pair_style(model_file, device), exchange)
    styles = list(pair_styles)
    workdir = folder / "runs" / "fixed" / f"{atoms}_interleaved"
    out = workdir / "bare_ms.txt"
    workdir.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    text = interleaved_script(data, pair_styles, ours, atoms, steps, turns, calls, out, device)
    run = lammps.run(text, 1, gpus, workdir, True, {})
    (workdir / "output.txt").write_text(run.output)
    base = {"atoms": len(system["positions"]), "dtype": "float32", "interleaved": styles}
    if run.returncode != 0:
        return [{**base, "style": s, "error": kl.failure(run)[-300:]} for s in styles]
    timed = kl.run_ms_per_step(run.output)[2::2]  # after the first run and each warm-up
    bare = [float(v) for v in out.read_text().split()]
    around = [(a + b) / 2 for a, b in itertools.pairwise(bare)]
    by_style: dict[str, list[float]] = {s: [] for s in styles}
    for turn in range(turns):
        for style, ms in zip(
            turn_order(styles, turn),
            timed[turn * len(styles) : (turn + 1) * len(styles)],
            strict=True,
        ):
            by_style[style].append(ms)
    first = by_style[styles[0]]
    for style, steps_ms in by_style.items():
        rows.append(
            base
            | {
                "style": style,
                "step_ms": steps_ms,
                "bare_ms": bare,
                "ms_per_step": statistics.median(steps_ms),
                "model_ms": statistics.median(bare),
                "step_over_model": statistics.median(
                    s / m for s, m in zip(steps_ms, around, strict=True)
                ),
                "over_first": statistics.median(
                    s / f for s, f in zip(steps_ms, first, strict=True)
                ),
            }
        )
    return rows


def measure(
    folder: Path,
    lammps: kl.Lammps,
    atoms: int,
    style: str,
    steps: int,
    turns: int,
    calls: int,
    optimized: bool = False,
    gpus: int = 1,
) -> dict:
    door, whose, mode = kl.STYLES[style]
    device = "cuda" if gpus else "cpu"
    extra, env = door.compiled(mode)
    data, system = crystal(atoms, LATTICE["mace"], folder / f"bench{atoms}.data")
    ours = folder / "mace32_e3nn.pt"
    model_file = folder / "mace32_own.pt" if whose == "mace-torch" else ours
    workdir = folder / "runs" / "fixed" / f"{atoms}_{style}"
    out = workdir / "bare_ms.txt"
    workdir.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    text = script(
        data,
        door.pair_style(model_file, device, extra),
        ours,
        atoms,
        steps,
        turns,
        calls,
        mode,
        out,
        device,
        optimized,
    )
    run = lammps.run(text, 1, gpus, workdir, door.kokkos, env)
    (workdir / "output.txt").write_text(run.output)
    row = {"atoms": len(system["positions"]), "style": style, "dtype": "float32"}
    if optimized:
        row["torchscript_optimized"] = True
    if run.returncode != 0:
        return {**row, "error": kl.failure(run)[-300:]}
    steps_ms = kl.run_ms_per_step(run.output)[-turns:]  # the warm-up run first
    bare = [float(v) for v in out.read_text().split()]
    around = [(a + b) / 2 for a, b in itertools.pairwise(bare)]
    row |= {
        "step_ms": steps_ms,
        "bare_ms": bare,
        "ms_per_step": statistics.median(steps_ms),
        "model_ms": statistics.median(bare),
        "fixed_ms": statistics.median(s - m for s, m in zip(steps_ms, around, strict=True)),
        "step_over_model": statistics.median(s / m for s, m in zip(steps_ms, around, strict=True)),
    }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="kokkos_lammps.py prepare's folder")
    parser.add_argument("--lammps", type=Path, required=True, help="tools/build_lammps_kokkos.sh")
    parser.add_argument("--atoms", type=int, nargs="+", default=[1000])
    parser.add_argument("--styles", nargs="+", choices=list(kl.STYLES), default=["kk"])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per turn")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20, help="bare model calls per turn")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument(
        "--gpus",
        type=int,
        choices=[0, 1],
        default=1,
        help="0: a KOKKOS LAMMPS for the host (the scripts tried on a CPU; no timings to keep)",
    )
    parser.add_argument(
        "--torchscript-optimized",
        action="store_true",
        help="TorchScript's optimizing executor on in the engine (off in a release)",
    )
    parser.add_argument(
        "--interleave", action="store_true", help="the eager styles in turns in one process"
    )
    parser.add_argument(
        "--exchanges",
        nargs="+",
        choices=["gather", "comm"],
        default=["gather"],
        help=f"with --interleave: {EXCHANGE_ENV} settings to run this project's styles with",
    )
    args = parser.parse_args()
    folder, lammps = args.dir.resolve(), kl.Lammps(args.lammps.resolve())
    rows = []
    if args.interleave:
        for atoms in args.atoms:
            turn = measure_interleaved(
                folder,
                lammps,
                atoms,
                args.styles,
                args.steps,
                args.turns,
                args.calls,
                args.exchanges,
                args.gpus,
            )
            rows += turn
            for row in turn:
                if "error" in row:
                    print(f"{atoms:8d} atoms {row['style']:12s} failed: {row['error']}", flush=True)
                    continue
                print(
                    f"{row['atoms']:8d} atoms {row['style']:12s} step {row['ms_per_step']:7.2f} ms, "
                    f"step / model {row['step_over_model']:.2f}, / {args.styles[0]} "
                    f"{row['over_first']:.3f} (medians of {args.turns} turns, model "
                    f"{row['model_ms']:.2f} ms)",
                    flush=True,
                )
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
        return 0
    for atoms in args.atoms:
        for style in args.styles:
            row = measure(
                folder,
                lammps,
                atoms,
                style,
                args.steps,
                args.turns,
                args.calls,
                optimized=args.torchscript_optimized,
                gpus=args.gpus,
            )
            rows.append(row)
            if "error" in row:
                print(f"{atoms:8d} atoms {style:12s} failed: {row['error']}", flush=True)
            else:
                print(
                    f"{row['atoms']:8d} atoms {style:12s} step {row['ms_per_step']:7.2f} ms, model "
                    f"{row['model_ms']:7.2f} ms, fixed cost {row['fixed_ms']:6.2f} ms/step, step / "
                    f"model {row['step_over_model']:.2f} (median of {args.turns} turns)",
                    flush=True,
                )
            if args.json:  # after each run: a run cut short keeps the ones before
                args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
