"""Report what this environment can run: LAMMPS, its packages and MPI, whether
``pair_style nvalchemi`` (this package's plugin) and ``pair_style mliap unified`` are
available, and torch with its devices.

LAMMPS is asked from a separate Python process, so that its MPI start-up and the plugin
cannot disturb this one. The exit code is 0 when ``pair_style nvalchemi`` works, else 1.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from ._command import add_switch, subcommand_main

HELP = "report LAMMPS, MPI, torch and whether pair_style nvalchemi works"
#: Seconds the LAMMPS probe may take (it imports torch and runs a two-atom model).
PROBE_TIMEOUT = 300.0
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _lammps_date(version: int) -> str:
    """``20250722`` -> ``22 Jul 2025``, as LAMMPS names its releases."""
    text = str(version)
    if len(text) != 8:
        return text
    return f"{int(text[6:])} {_MONTHS[int(text[4:6]) - 1]} {text[:4]}"


def _mpi_report() -> tuple[str, str]:
    """(launcher path, MPI library version) of this environment."""
    from ..lammps_run import lammps_command

    try:
        mpirun = lammps_command(1)[0]
    except FileNotFoundError as err:
        return "not found", str(err)
    folder = Path(mpirun).parent
    queries = [[str(folder / "mpichversion")], [mpirun, "--version"]]
    for query in queries:
        if not Path(query[0]).exists():
            continue
        try:
            out = subprocess.run(
                query, capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if lines:
            first = lines[0]
            if first.startswith("MPICH Version:"):
                first = "MPICH " + first.split(":", 1)[1].strip()
            return mpirun, first
    return mpirun, "version unknown"


def _probe_lammps(model: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nvalchemi-info-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "nvalchemi_lammps.cli._lammps_probe", str(out)]
        if model is not None:
            cmd.append(str(model))
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            return {"error": f"the LAMMPS probe took longer than {PROBE_TIMEOUT:g} s"}
        if not out.exists():
            tail = (proc.stdout + proc.stderr).strip()[-2000:]
            return {"error": f"the LAMMPS probe died (exit code {proc.returncode}):\n{tail}"}
        return json.loads(out.read_text())


def _smoke_verdict(smoke: dict[str, Any]) -> str:
    """Compare the two-atom run with the default model's Lennard-Jones formula."""
    from .export import default_config_text

    config = tomllib.loads(default_config_text())
    eps, sig = config["epsilon"]["Ar"], config["sigma"]["Ar"]
    r = smoke["distance"]
    sr6 = (sig / r) ** 6
    energy = 4.0 * eps * (sr6 * sr6 - sr6)
    force_on_1 = -24.0 * eps * (2.0 * sr6 * sr6 - sr6) / r  # -dE/dx1, atom 2 at +r
    ok = math.isclose(smoke["energy"], energy, rel_tol=1e-12) and math.isclose(
        smoke["force_x_on_1"], force_on_1, rel_tol=1e-12
    )
    detail = f"two Ar atoms at {r:g} A: E = {smoke['energy']:.12g} eV (expected {energy:.12g})"
    return ("works, " if ok else "WRONG RESULT, ") + detail


#: The command-line switches that put a LAMMPS run on KOKKOS's GPUs (docs/gpus.md).
KOKKOS_SWITCHES = "-k on g {gpus} -sf kk -pk kokkos newton on neigh half"


def kokkos_backends(lammps: dict[str, Any]) -> list[str]:
    """The KOKKOS execution spaces of this LAMMPS (``cuda``, ``hip``, ``openmp``, ``serial``
    ...), none without KOKKOS."""
    return [api.lower() for api in lammps["accelerators"].get("KOKKOS", [])]


def report(lammps: dict[str, Any]) -> tuple[list[str], bool]:
    """The report lines and whether ``pair_style nvalchemi`` works."""
    import torch

    from .. import __file__ as package_file

    lines = [
        f"nvalchemi-lammps  {_dist_version('nvalchemi-lammps')}  ({Path(package_file).parent})",
        f"python            {platform.python_version()}  ({sys.executable})",
    ]
    cuda = "not available"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())]
        cuda = f"{len(names)} device(s): {', '.join(names)}"
    lines.append(f"torch             {torch.__version__}  (CUDA {cuda})")
    lines.append(f"numpy / vesin     {_dist_version('numpy')} / {_dist_version('vesin')}")
    mpirun, mpi_version = _mpi_report()
    lines.append(f"MPI launcher      {mpirun}  ({mpi_version})")

    if "version" not in lammps:
        lines.append(f"LAMMPS            {lammps.get('error', 'unknown error')}")
        lines.append("pair_style nvalchemi      unknown (LAMMPS could not be started)")
        return lines, False
    lines.append(
        f"LAMMPS            {_lammps_date(lammps['version'])}  (lammps package "
        f"{_dist_version('lammps')}, MPI {'yes' if lammps['mpi'] else 'no'}, "
        f"GPU device {'yes' if lammps['gpu_device'] else 'no'})"
    )
    accelerators = [
        f"{k} ({', '.join(a.lower() for a in apis)})"
        for k, apis in lammps["accelerators"].items()
        if apis
    ]
    lines.append(f"  accelerators    {', '.join(accelerators) or 'none'}")
    packages = textwrap.wrap(" ".join(lammps["packages"]), 70, break_on_hyphens=False)
    lines.append(f"  packages        {packages[0] if packages else 'none'}")
    lines += [f"                  {rest}" for rest in packages[1:]]
    if "needs_mpi_preload" in lammps:
        lines.append(
            "  from Python     lammps.lammps() needs the MPI library on the loader path: "
            f"LD_LIBRARY_PATH={lammps.get('mpi_library_dir', '?')}"
        )

    works = False
    if lammps["nvalchemi"]:
        how = "auto-loaded" if lammps["nvalchemi_autoloaded"] else "after plugin load"
        status = f"available ({how}, {lammps.get('plugin_path', '?')})"
        if "smoke" in lammps:
            verdict = _smoke_verdict(lammps["smoke"])
            works = verdict.startswith("works")
            status += f"\n                          {verdict}"
        elif "smoke_error" in lammps:
            status += f"\n                          FAILS: {lammps['smoke_error']}"
    elif "plugin_path" in lammps:
        status = f"not available: {lammps.get('plugin_error', 'the plugin did not register')}"
        status += f" ({lammps['plugin_path']})"
    else:
        status = f"not available: {lammps.get('plugin_error', 'plugin not found')}"
    lines.append(f"pair_style nvalchemi      {status}")

    if lammps["mliap_style"] and lammps["python_package"]:
        mliap = "available (ML-IAP with the PYTHON package)"
        kokkos = kokkos_backends(lammps)
        if kokkos:
            mliap += (
                f"\n                          KOKKOS ({', '.join(kokkos)}): run with "
                f"{KOKKOS_SWITCHES.format(gpus='N') if 'cuda' in kokkos else '-k on -sf kk'}"
                " (docs/gpus.md)"
            )
    else:
        lacks = [
            p
            for p, key in (("ML-IAP", "mliap_package"), ("PYTHON", "python_package"))
            if not lammps[key]
        ]
        mliap = f"not available: this LAMMPS lacks the {' and '.join(lacks)} package"
    lines.append(f"pair_style mliap unified  {mliap}")
    return lines, works


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_switch(
        parser,
        "--check",
        "run two atoms through pair_style nvalchemi with the built-in argon model",
    )


def run(args: argparse.Namespace) -> int:
    model = None
    with tempfile.TemporaryDirectory(prefix="nvalchemi-info-model-") as tmp:
        if args.check:
            from .._model_file import save_model
            from .export import default_config_text, potential_from_config

            model = Path(tmp) / "argon.pt"
            save_model(potential_from_config(tomllib.loads(default_config_text())), model)
        lammps = _probe_lammps(model)
    lines, works = report(lammps)
    print("\n".join(lines))
    return 0 if works or (not args.check and lammps.get("nvalchemi")) else 1


def main(argv: list[str] | None = None) -> int:
    """``nvalchemi-lammps info``; returns the exit code."""
    return subcommand_main(sys.modules[__name__], "info", argv)
