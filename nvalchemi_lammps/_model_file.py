"""The model file: a versioned torch archive of plain data, safe to load.

The file holds only strings, numbers, lists, dicts and tensors, read back with
``torch.load(weights_only=True)``: loading a model never runs code from the file. The
potential's class is looked up by name among the installed potentials.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import torch

from .potentials import Potential, potential_class

FORMAT = "nvalchemi-lammps-model"
#: Bumped when the layout of the file changes incompatibly.
FORMAT_VERSION = 1


class ModelFileError(ValueError):
    """A model file that is missing, unreadable, or not one we can use."""


def save_model(potential: Potential, path: str | os.PathLike) -> Path:
    """Write ``potential`` to ``path`` (CPU tensors)."""
    path = Path(path)
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "potential": potential.name,
        "spec": potential.spec.to_dict(),
        "config": potential.config(),
        "state_dict": {k: v.detach().cpu() for k, v in potential.state_dict().items()},
    }
    torch.save(record, path)
    return path


def load_model(path: str | os.PathLike) -> Potential:
    """Read a model file written by :func:`save_model` (on the CPU, in eval mode).

    :raises ModelFileError: the file is missing, corrupt, of another format, or of an
        unknown format version
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} not found")
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not zipfile.is_zipfile(path):
            raise ModelFileError(
                f"cannot read model file {path}: not a torch archive (corrupt or truncated?)"
            ) from None
        raise ModelFileError(
            f"model file {path} holds Python objects, not plain data: it was not written by "
            "nvalchemi-lammps export, and is not loaded because that could run code from it"
        ) from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelFileError(
            f"cannot read model file {path}: not a torch archive (corrupt or truncated?): {reason}"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ModelFileError(f"{path} is not an nvalchemi-lammps model file")
    version = record.get("format_version")
    if version != FORMAT_VERSION:
        advice = (
            "upgrade nvalchemi-lammps"
            if isinstance(version, int) and version > FORMAT_VERSION
            else "export the model again with this version"
        )
        raise ModelFileError(
            f"model file {path} has format version {version!r}, this nvalchemi-lammps reads "
            f"version {FORMAT_VERSION}: {advice}"
        )
    try:
        potential = potential_class(record["potential"]).from_config(record["config"])
        potential.load_state_dict(record["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        reason = f"missing entry {err}" if isinstance(err, KeyError) else str(err)
        raise ModelFileError(f"model file {path} is damaged or incomplete: {reason}") from None
    return potential.eval()
