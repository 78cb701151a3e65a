"""Per-step overhead of ``pair_style mliap unified``: this project's model file against
mace-torch's own ML-IAP class (``LAMMPS_MLIAP_MACE``) on the same random MACE weights.

Both models' ``compute_forces`` are called as KOKKOS ML-IAP calls them, through the stand-in
data object of the tests (``tests/mliap_standin.py``: arrays at raw pointers, ghost rows
refreshed by ``forward_exchange``/``reverse_exchange``), on a jiggled fcc crystal of Ar and
Kr with LAMMPS's ghost shell (cutoff + 2 A skin) on one rank, in ``--variants`` jiggled
copies taken in turn, so that the numbers of ghosts and pairs change from step to step as
in MD. With ``--device cuda`` the arrays are CuPy arrays on the GPU, as in a CUDA KOKKOS
build. The stand-in's own work (its exchanges) is a shared cost; forces are handed back by
pointer and only copied, as LAMMPS's kernel reads them.

    python benchmarks/profile_mliap_step.py --atoms 256 --dtype float64 --kernels e3nn
    python benchmarks/profile_mliap_step.py --device cuda --atoms 864 19652 --dtype float32

Prints, per model: ms/step (median and best of ``--repeats`` runs of ``--steps`` steps,
timed without the profiler, the two models in turns) and the process's CPU ms/step, then from one profiled run
(``torch.profiler``, CPU activities) per step: aten ops called (nested ones too), the
syncing ops (``item``/``_local_scalar_dense``, ``nonzero``: a host sync on a GPU; on the CPU
``one_hot`` adds two ``item`` of its own; ``tolist``/``cpu`` count as copies), copies and
dtype conversions, allocations, gathers and scatters, the CPU time inside aten ops (self
times) and the rest of the step (Python and the stand-in); then the ops whose counts differ
most, and the largest difference of the two models' pair forces.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

#: LAMMPS's default neighbor skin in metal units: ghosts reach cutoff + skin
SKIN = 2.0
LATTICE = 4.3
FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
#: op groups counted per step: name -> aten ops
GROUPS = {
    "syncs": ("aten::item", "aten::_local_scalar_dense", "aten::nonzero"),
    "copies": ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous"),
    "allocations": (
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::zeros",
        "aten::zeros_like",
        "aten::new_zeros",
        "aten::full",
        "aten::new_empty",
    ),
    "gathers/scatters": (
        "aten::index_select",
        "aten::index",
        "aten::index_add_",
        "aten::index_add",
        "aten::index_copy",
        "aten::scatter_add_",
        "aten::scatter_reduce",
        "aten::index_put_",
        "aten::gather",
    ),
}


def crystal(atoms: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions, cubic cell edge and species (0 or 1) of about ``atoms`` fcc atoms, the
    positions jiggled by ``seed``."""
    cells = max(2, round((atoms / 4) ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    frac = (grid[:, None, :] + FCC[None]).reshape(-1, 3) / cells
    edge = cells * LATTICE
    species = np.random.default_rng(0).integers(0, 2, size=len(frac))
    jiggle = np.random.default_rng(seed).normal(0.0, 0.08, size=frac.shape)
    return (frac * edge + jiggle) % edge, edge, species


def rank_arrays(atoms: int, cutoff: float, seed: int = 0):
    """One LAMMPS rank's ML-IAP arrays: owned atoms, then ghosts (periodic images within
    cutoff + skin of the box), pairs within ``cutoff`` into owned atoms in LAMMPS's order
    (by receiver); and each row's owner."""
    from mliap_standin import RankArrays
    from scipy.spatial import cKDTree

    positions, edge, species = crystal(atoms, seed)
    n = len(positions)
    reach = cutoff + SKIN
    shifts = np.array([s for s in np.ndindex(3, 3, 3) if s != (1, 1, 1)]) - 1
    ghosts, owners = [], []
    for shift in shifts:
        image = positions + shift * edge
        near = np.all((image > -reach) & (image < edge + reach), axis=1)
        ghosts.append(image[near])
        owners.append(np.flatnonzero(near))
    rows = np.concatenate([positions, *ghosts])
    owner = np.concatenate([np.arange(n), *owners])
    tree = cKDTree(rows)
    pairs = tree.query_pairs(cutoff, output_type="ndarray")
    pairs = np.concatenate([pairs, pairs[:, ::-1]])
    pairs = pairs[pairs[:, 0] < n]
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    i, j = pairs[:, 0], pairs[:, 1]
    arrays = RankArrays.of(n, species[owner], i, j, rows[j] - rows[i])
    return arrays, owner


class StepData:
    """KOKKOS ML-IAP's data object of one step (the stand-in's), whose forces are copied
    where LAMMPS's kernel would read them, not tallied by the stand-in's slow scatter."""

    def __init__(self, arrays, owner: np.ndarray, cuda: bool) -> None:
        from mliap_standin import KokkosExchangeData, PairState, SelfExchange

        xp = _cupy() if cuda else np
        dev = 1 if cuda else 0
        self.state = PairState(arrays, xp=xp)
        self.data = KokkosExchangeData(
            self.state, SelfExchange(arrays.nlocal, owner, xp=xp), dev=dev
        )
        self.fij = torch.zeros((arrays.npairs, 3), dtype=torch.float64)
        if cuda:
            self.fij = self.fij.cuda()
        self.data.update_pair_forces_gpu = self._take
        # LAMMPS reads raw pointers; the stand-in asks for __cuda_array_interface__, which
        # torch refuses for a tensor that requires grad (mace-torch's LAMMPS_MP passes one)
        for name in ("forward_exchange", "reverse_exchange"):
            setattr(self.data, name, _detaching(getattr(self.data, name)))

    def _take(self, fij: torch.Tensor) -> None:
        self.fij.copy_(fij.reshape(-1, 3))


def _detaching(exchange):
    def detached(src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        exchange(src.detach(), dst.detach(), width)

    return detached


def _cupy():
    import cupy

    return cupy


def models(dtype: str, kernels: str, device: str, hidden: str):
    """This project's model object (the unpickled model file) and mace-torch's class, on
    the same random MACE weights (``hidden`` irreps), both on ``device``."""
    from _mace_models import random_mace

    from nvalchemi_lammps._model_file import model_record
    from nvalchemi_lammps.frontends.mliap import MLIAPModel
    from nvalchemi_lammps.potentials import mace as mace_module

    mace_module._mace()  # mace-torch and e3nn, imported with their side effects undone
    from e3nn import o3
    from mace.calculators.lammps_mliap_mace import LAMMPS_MLIAP_MACE

    mace = random_mace(hidden_irreps=o3.Irreps(hidden))
    ours = mace_module.Mace.from_model(mace, dtype=dtype, kernels=kernels).eval()
    ours = MLIAPModel(model_record(ours))  # what LAMMPS unpickles from the model file
    network = ours.potential.model  # e3nn's form, as the model file holds it
    theirs = copy.deepcopy(network)
    if kernels == "cuequivariance":
        from mace.cli.convert_e3nn_cueq import run as to_cueq

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = to_cueq(theirs, device=device, return_model=True)
    theirs = theirs.to(getattr(torch, dtype))
    theirs.lammps_mliap = True
    theirs = LAMMPS_MLIAP_MACE(theirs)
    # its device is the KOKKOS data's: set here, since the stand-in's module is not named so
    theirs.device = torch.device(device)
    theirs.model = theirs.model.to(device)
    theirs.initialized = True
    ours.potential.to(device)
    return {"nvalchemi": ours, "mace-torch": theirs}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_steps(model, steps: list[StepData], count: int, device: str) -> tuple[float, float]:
    """Wall and process CPU seconds per ``compute_forces`` call over ``count`` calls, on
    ``steps`` in turn (CPU time: what other processes on a shared host inflate least)."""
    _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for k in range(count):
        model.compute_forces(steps[k % len(steps)].data)
    _sync(device)
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def profile(model, steps: list[StepData], count: int, device: str) -> dict:
    """Per-step op counts and CPU times of ``count`` calls under ``torch.profiler``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, _ = run_steps(model, steps, count, device)
    counts, self_us = collections.Counter(), 0.0
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            counts[event.key] += event.count
            self_us += event.self_cpu_time_total
    return {
        "counts": {k: v / count for k, v in counts.items()},
        "aten_ms": self_us / 1e3 / count,
        "profiled_ms": 1e3 * wall,
    }


def summary(result: dict) -> dict[str, float]:
    counts = result["counts"]
    row = {"aten ops": sum(counts.values())}
    row.update({name: sum(counts.get(k, 0) for k in ops) for name, ops in GROUPS.items()})
    row["aten self ms (profiled)"] = result["aten_ms"]
    row["rest ms (profiled)"] = result["profiled_ms"] - result["aten_ms"]
    return row


def compare(args: argparse.Namespace, atoms: int, dtype: str) -> None:
    device = args.device
    both = models(dtype, args.kernels, device, args.hidden)
    cutoff = float(both["nvalchemi"].potential.spec.cutoff)
    variants = [rank_arrays(atoms, cutoff, seed) for seed in range(args.variants)]
    arrays = variants[0][0]
    print(
        f"\n== {arrays.nlocal} atoms ({arrays.ntotal - arrays.nlocal} ghosts, "
        f"{arrays.npairs} pairs), {dtype}, {args.kernels}, {device}, torch {torch.__version__}"
    )
    steps = {name: [StepData(a, owner, device == "cuda") for a, owner in variants] for name in both}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in both}
    for name, model in both.items():
        run_steps(model, steps[name], args.warmup, device)
    for repeat in range(args.repeats):  # in turns, each first every other time: fair on a busy host
        for name in list(both)[:: 1 if repeat % 2 else -1]:
            times[name].append(run_steps(both[name], steps[name], args.steps, device))
    results, forces = {}, {}
    for name, model in both.items():
        wall, cpu = (1e3 * np.array(t) for t in zip(*times[name]))
        results[name] = {
            "ms/step (median)": float(np.median(wall)),
            "ms/step (best)": float(wall.min()),
            "CPU ms/step (median)": float(np.median(cpu)),
        }
        results[name].update(summary(prof := profile(model, steps[name], args.steps, device)))
        results[name]["_counts"] = prof["counts"]
        model.compute_forces(steps[name][0].data)
        forces[name] = steps[name][0].fij.double().cpu()
    names = list(results)
    print(f"{'per step':28s}" + "".join(f"{n:>14s}" for n in names))
    for key in results[names[0]]:
        if not key.startswith("_"):
            print(f"{key:28s}" + "".join(f"{results[n][key]:14.2f}" for n in names))
    a, b = (results[n]["_counts"] for n in names)
    diff = sorted(set(a) | set(b), key=lambda k: -abs(a.get(k, 0) - b.get(k, 0)))
    print(f"ops whose counts differ most ({names[0]} - {names[1]}):")
    for key in diff[: args.top]:
        print(f"  {key:36s}{a.get(key, 0):8.1f}{b.get(key, 0):8.1f}")
    scale = float(forces[names[1]].abs().max()) or 1.0
    worst = float((forces[names[0]] - forces[names[1]]).abs().max()) / scale
    print(f"pair forces: largest difference / largest force = {worst:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    parser.add_argument("--kernels", choices=["e3nn", "cuequivariance"], default="e3nn")
    parser.add_argument("--atoms", type=int, nargs="+", default=[256])
    parser.add_argument("--hidden", default="8x0e+8x1o", help="MACE's hidden irreps")
    parser.add_argument("--steps", type=int, default=10, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", type=int, default=3, help="jiggled copies, in turn")
    parser.add_argument("--top", type=int, default=12, help="ops listed by count difference")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--torchscript-optimized",
        action="store_true",
        help="ours with TorchScript's optimizing executor on, as mace-torch's class runs (off "
        "in the engine; a process that ran a scripted graph optimized keeps running it so)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.torchscript_optimized:
        from nvalchemi_lammps.engine import optimize_torchscript

        optimize_torchscript(True)
    quiet = contextlib.ExitStack()
    quiet.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")  # e3nn's and cuEquivariance's deprecations, once each
    with quiet:
        for atoms in args.atoms:
            for dtype in args.dtype:
                compare(args, atoms, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
