"""MACE on e3nn's kernels against cuEquivariance's, through the engine, and how exactly they
agree.

For each model (``--models``, random weights of a foundation model's architecture, see
``MODELS``) and size (``--atoms``, fcc Cu with 0.08 A of Gaussian jitter), the time of our
potential's forward and backward on the whole periodic system in one process (the
reference evaluator's :func:`evaluate` on the prebuilt pair list, ``nlocal = N``, no
ghosts: what one LAMMPS rank's model call costs, without LAMMPS), median of ``--calls``
after three warm-up calls, once on e3nn's kernels (``kernels = "e3nn"``) and once on
cuEquivariance's (``kernels = "cuequivariance"``: on a CUDA device with
cuequivariance-ops-torch, mace-torch's converter with its fused convolution), and the same
for mace-torch's own forward with forces (its neighbor list and batch built once, outside
the timing) on the e3nn model and on its cuEquivariance conversion. Peak GPU memory per
row; a run out of memory is recorded as such.

Exactness, on the first size of each model (after its timings): our cuEquivariance
evaluation against our e3nn evaluation in float64, and, in ``--dtype``, against
mace-torch's own forward of the
converted model (energy, per-atom energies, forces; max difference over max value), and
whether a rank without atoms, or without pairs, runs on cuEquivariance's kernels.

    python benchmarks/bench_mace_cueq.py --device cuda --atoms 864 19652 97556
    python benchmarks/bench_mace_cueq.py --device cpu --models test --atoms 32 108 --calls 1

Writes ``bench_mace_cueq<tag>.json`` and ``.md`` under ``--out``; every row is also appended
to ``bench_mace_cueq<tag>.jsonl`` as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from nvalchemi_lammps import LocalGraph, evaluate
from nvalchemi_lammps.potentials import mace as mace_module
from nvalchemi_lammps.reference import evaluate_reference, neighbor_pairs

CU_LATTICE, JITTER = 3.61, 0.08

#: Random-weight models of published architectures (``tests/_mace_models.py``'s
#: ``FAMILIES``), and the small model of the tests.
MODELS = ("test", "mp-medium")


def random_model(name: str) -> torch.nn.Module:
    """The mace-torch model (float64, random weights) called ``name``."""
    from _mace_models import FAMILIES, random_family, random_mace

    if name == "test":
        return random_mace(atomic_numbers=[29, 36], seed=0)
    if name not in FAMILIES:
        raise ValueError(f"unknown model {name} (known: test, {', '.join(FAMILIES)})")
    return random_family(name)


def cu_crystal(atoms: int) -> tuple[np.ndarray, np.ndarray]:
    cells = round((atoms / 4) ** (1 / 3))
    if 4 * cells**3 != atoms:
        raise ValueError(f"fcc needs 4 n^3 atoms, got {atoms}")
    fcc = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    positions = (grid + fcc).reshape(-1, 3) * CU_LATTICE
    positions += np.random.default_rng(0).normal(0.0, JITTER, positions.shape)
    return positions, np.eye(3) * cells * CU_LATTICE


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(call, device: str, calls: int) -> dict:
    """Median ms of ``call()`` after three warm-up calls (TorchScript optimizes e3nn's code
    on its second call), and the peak memory (GiB)."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        samples = []
        for k in range(calls + 3):
            _sync(device)
            start = time.perf_counter()
            call()
            _sync(device)
            if k >= 3:
                samples.append(1e3 * (time.perf_counter() - start))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"ms": None, "error": "out of memory"}
    except Exception as err:  # noqa: BLE001 - recorded with the results, the rest still run
        return {"ms": None, "error": repr(err)}
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    return {"ms": statistics.median(samples), "samples": samples, "peak_gib": peak}


def our_call(potential, n: int, pairs, device: str, species: int):
    args = [
        torch.full((n,), species, dtype=torch.int64, device=device),
        torch.from_numpy(pairs.pair_i).to(device),
        torch.from_numpy(pairs.pair_j).to(device),
        torch.from_numpy(pairs.rij).to(device),
    ]
    return lambda: evaluate(potential, LocalGraph(n, *args))


def mace_batch(model, positions, cell, symbol: str, dtype: torch.dtype, device: str) -> dict:
    """mace-torch's own input: its AtomicData and neighbor list (matscipy)."""
    import ase

    with mace_module._quiet_torchscript():
        from mace import data as mace_data
        from mace.tools import torch_geometric
        from mace.tools.utils import AtomicNumberTable

    atoms = ase.Atoms(symbols=[symbol] * len(positions), positions=positions, cell=cell, pbc=True)
    with mace_module._default_dtype(dtype):
        config = mace_data.config_from_atoms(atoms, head_name="Default")
        table = AtomicNumberTable([int(z) for z in model.atomic_numbers])
        data = mace_data.AtomicData.from_config(
            config, z_table=table, cutoff=float(model.r_max), heads=model.heads
        )
        return torch_geometric.batch.Batch.from_data_list([data]).to(device).to_dict()


def mace_call(model, batch: dict):
    return lambda: model(batch, compute_force=True)


def _relative(got, ref) -> float:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def exactness(model, positions, cell, symbol, device: str, dtype: str) -> dict:
    """Our cuEquivariance evaluation against our e3nn one (float64), and against
    mace-torch's own forward of the converted model (``dtype``)."""
    out = {}
    species = np.full(len(positions), list(model.atomic_numbers).index(29))
    results = {}
    for kernels in ("e3nn", "cuequivariance"):
        potential = mace_module.Mace.from_model(model, dtype="float64", kernels=kernels)
        potential = potential.to(device)
        assert potential.kernels == kernels, (potential.kernels, kernels)
        results[kernels] = evaluate_reference(potential, positions, cell, (True,) * 3, species)
    e3nn, cueq = results["e3nn"], results["cuequivariance"]
    out["float64 cueq vs e3nn"] = {
        "energy": _relative([cueq.energy], [e3nn.energy]),
        "atom_energies": _relative(cueq.atom_energies, e3nn.atom_energies),
        "forces": _relative(cueq.forces, e3nn.forces),
        "virial": _relative(cueq.virial, e3nn.virial),
    }
    torch_dtype = mace_module._DTYPES[dtype]
    ours = mace_module.Mace.from_model(model, dtype=dtype, kernels="cuequivariance").to(device)
    mine = evaluate_reference(ours, positions, cell, (True,) * 3, species)
    with mace_module._default_dtype(torch_dtype):
        theirs_model = mace_module._to_cuequivariance(
            _copy_in(model, torch_dtype), torch.device(device)
        )
    batch = mace_batch(theirs_model, positions, cell, symbol, torch_dtype, device)
    theirs = theirs_model(batch, compute_force=True)
    out[f"{dtype} ours (cueq) vs mace-torch forward of the converted model"] = {
        "energy": _relative([mine.energy], [float(theirs["energy"].detach()[0])]),
        "atom_energies": _relative(mine.atom_energies, theirs["node_energy"].detach().cpu()),
        "forces": _relative(mine.forces, theirs["forces"].detach().cpu()),
    }
    out["empty ranks on cueq"] = empty_ranks(ours, device)
    out[f"{dtype} cueq vs float64 e3nn"] = {
        "energy": _relative([mine.energy], [e3nn.energy]),
        "forces": _relative(mine.forces, e3nn.forces),
    }
    return out


def empty_ranks(potential, device: str) -> dict:
    """What a LAMMPS rank without atoms, or with atoms but no pairs, runs: ``"ok"`` or the
    error (cuEquivariance's kernels on zero rows)."""
    out = {}
    none = torch.zeros(0, dtype=torch.int64, device=device)
    rij = torch.zeros(0, 3, dtype=torch.float64, device=device)
    for name, (nlocal, ntotal) in {"no atoms": (0, 0), "atoms, no pairs": (3, 5)}.items():
        species = torch.zeros(ntotal, dtype=torch.int64, device=device)
        try:
            result = evaluate(potential, LocalGraph(nlocal, species, none, none, rij))
            out[name] = "ok" if result.atom_energies.shape == (nlocal,) else "wrong shape"
        except Exception as err:  # noqa: BLE001 - recorded with the results
            out[name] = repr(err)
    return out


def _copy_in(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    import copy

    with mace_module._quiet_torchscript():  # e3nn's modules copy through torch.jit.save
        return copy.deepcopy(model).to(dtype).eval()


def bench(args: argparse.Namespace, stream) -> tuple[list[dict], dict]:
    rows, exact = [], {}
    torch_dtype = mace_module._DTYPES[args.dtype]
    for name in args.models:
        start = time.perf_counter()
        model = random_model(name)
        built = time.perf_counter() - start
        params = sum(p.numel() for p in model.parameters())
        cu = list(model.atomic_numbers).index(29)
        potentials, failed = {}, {}
        for kernels in ("e3nn", "cuequivariance"):
            start = time.perf_counter()
            try:
                potential = mace_module.Mace.from_model(model, dtype=args.dtype, kernels=kernels)
                potential = potential.to(args.device)
                if potential.kernels != kernels:  # the conversion happens here
                    raise RuntimeError(f"runs on {potential.kernels}, not {kernels}")
            except Exception as err:  # noqa: BLE001 - recorded with the results
                failed[f"ours {kernels}"] = {"ms": None, "error": repr(err)}
                print(f"{name} ours {kernels}: {err!r}", flush=True)
                continue
            potentials[kernels] = (potential, time.perf_counter() - start)
        theirs = {"e3nn": _copy_in(model, torch_dtype).to(args.device)}
        try:
            with mace_module._default_dtype(torch_dtype):
                theirs["cuequivariance"] = mace_module._to_cuequivariance(
                    _copy_in(model, torch_dtype), torch.device(args.device)
                )
        except Exception as err:  # noqa: BLE001 - recorded with the results
            failed["mace-torch cuequivariance"] = {"ms": None, "error": repr(err)}
        print(f"{name}: {params:,} parameters, built in {built:.1f} s", flush=True)
        for atoms in args.atoms:
            positions, cell = cu_crystal(atoms)
            pairs = neighbor_pairs(positions, cell, (True,) * 3, float(model.r_max))
            row = {"model": name, "parameters": params, "atoms": atoms, **failed}
            row["pairs"] = len(pairs.pair_i)
            for kernels, (potential, setup) in potentials.items():
                timing = _timed(
                    our_call(potential, atoms, pairs, args.device, cu), args.device, args.calls
                )
                row[f"ours {kernels}"] = {**timing, "setup_s": setup}
            if atoms <= args.mace_max_atoms:
                batch = mace_batch(theirs["e3nn"], positions, cell, "Cu", torch_dtype, args.device)
                for kernels, network in theirs.items():
                    row[f"mace-torch {kernels}"] = _timed(
                        mace_call(network, batch), args.device, args.calls
                    )
                del batch
            rows.append(row)
            stream.write(json.dumps(row) + "\n")
            stream.flush()
            print(table([row]).splitlines()[-1], flush=True)
        if args.check:  # after the timings: a failure here leaves them measured
            positions, cell = cu_crystal(args.atoms[0])
            try:
                exact[name] = exactness(model, positions, cell, "Cu", args.device, args.dtype)
            except Exception as err:  # noqa: BLE001 - recorded with the results
                exact[name] = {"error": {"error": repr(err)}}
            print(f"{name} exactness: {json.dumps(exact[name])}", flush=True)
    return rows, exact


def _ms(entry: dict | None) -> str:
    if entry is None:
        return "—"
    if entry.get("ms") is None:
        return entry.get("error", "—")
    return f"{entry['ms']:.1f}"


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or a.get("ms") is None or b.get("ms") is None:
        return "—"
    return f"{a['ms'] / b['ms']:.2f}"


def _gib(entry: dict | None) -> str:
    if not entry or entry.get("peak_gib") is None:
        return "—"
    return f"{entry['peak_gib']:.1f}"


def table(rows: list[dict]) -> str:
    lines = [
        (
            "| model | atoms | pairs | ours e3nn ms | ours cueq ms | e3nn / cueq | "
            "mace-torch e3nn ms | mace-torch cueq ms | peak GiB e3nn / cueq |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        e3nn, cueq = r.get("ours e3nn"), r.get("ours cuequivariance")
        lines.append(
            f"| {r['model']} | {r['atoms']:,} | {r['pairs']:,} | {_ms(e3nn)} | {_ms(cueq)} | "
            f"{_ratio(e3nn, cueq)} | {_ms(r.get('mace-torch e3nn'))} | "
            f"{_ms(r.get('mace-torch cuequivariance'))} | {_gib(e3nn)} / {_gib(cueq)} |"
        )
    return "\n".join(lines)


def exact_table(exact: dict) -> str:
    lines = ["| model | comparison | quantity | max diff / max value |", "|---|---|---|---:|"]
    for name, comparisons in exact.items():
        for what, values in comparisons.items():
            for quantity, value in values.items():
                shown = value if isinstance(value, str) else f"{value:.1e}"
                lines.append(f"| {name} | {what} | {quantity} | {shown} |")
    return "\n".join(lines)


def machine() -> dict:
    mace_module._mace()  # mace-torch imported with its side effects undone, before the rest
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    for package in ("cuequivariance", "cuequivariance_torch", "cuequivariance_ops_torch", "mace"):
        try:
            module = __import__(package)
            info[package] = getattr(module, "__version__", "?")
        except Exception as err:  # noqa: BLE001 - recorded, not fatal
            info[package] = f"not importable ({type(err).__name__})"
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--atoms", type=int, nargs="+", default=[864, 19652, 97556])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--calls", type=int, default=5, help="timed calls (median)")
    parser.add_argument(
        "--mace-max-atoms",
        type=int,
        default=100_000,
        help="time mace-torch's own forward up to this many atoms",
    )
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"bench_mace_cueq{args.tag}"
    info = machine()
    print(json.dumps(info), flush=True)
    if args.device.startswith("cuda"):
        try:  # without its CUDA kernels cuEquivariance would time its pure-torch code
            import cuequivariance_ops_torch  # noqa: F401
        except Exception as err:
            raise SystemExit(f"cuequivariance-ops-torch does not import: {err!r}") from err
    with stem.with_suffix(".jsonl").open("w") as stream:
        rows, exact = bench(args, stream)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"machine": info, "settings": settings, "rows": rows, "exactness": exact}
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    text = table(rows) + "\n\n" + exact_table(exact) + "\n"
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
