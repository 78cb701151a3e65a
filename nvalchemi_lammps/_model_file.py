"""The model file: one versioned torch archive for both front doors.

``torch.save`` of a :class:`~nvalchemi_lammps.frontends.mliap.MLIAPModel`, which pickles as
the single call ``MLIAPModel(record)``. The record is plain data: format name and version,
the potential's registered name, its spec and constructor arguments, and its tensors (CPU).
Two readers see the same bytes:

- :func:`load_model` (``pair_style nvalchemi``, the tools) reads with
  ``torch.load(weights_only=True)`` and exactly one global allowed: the name
  ``nvalchemi_lammps.frontends.mliap.MLIAPModel``, bound to a function that hands back its
  argument unchanged. Loading never runs code from the file; the record is then checked
  here and the potential's class is looked up by name among the installed potentials.
- LAMMPS's ML-IAP (``pair_style mliap unified model.pt 0``) reads with
  ``torch.load(weights_only=False)``, which calls ``MLIAPModel(record)``: the same checks
  (:func:`potential_from_record`), then a ready ML-IAP model. That trusts the file, as any
  ML-IAP model file must be trusted.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from .potentials import Potential, potential_class

FORMAT = "nvalchemi-lammps-model"
#: Bumped when the layout of the file changes incompatibly (2: the record is wrapped in a
#: call of the ML-IAP model class; 1 was the bare record).
FORMAT_VERSION = 2
#: The one global a model file names: what LAMMPS's ML-IAP unpickles it into.
MLIAP_MODEL_GLOBAL = "nvalchemi_lammps.frontends.mliap.MLIAPModel"


class ModelFileError(ValueError):
    """A model file that is missing, unreadable, or not one we can use."""


def model_record(potential: Potential) -> dict[str, Any]:
    """The plain data a model file holds for ``potential`` (tensors copied to the CPU)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "potential": potential.name,
        "spec": potential.spec.to_dict(),
        "config": potential.config(),
        "state_dict": {k: v.detach().cpu() for k, v in potential.state_dict().items()},
    }


def potential_from_record(record: object, path: str | os.PathLike | None = None) -> Potential:
    """Check a model file's record and rebuild its potential (on the CPU, in eval mode).

    :param path: the file the record came from, for the messages (unknown inside LAMMPS's
        own ``torch.load``)
    :raises ModelFileError: not our format, another format version, or damaged
    """
    where = f"model file {path}" if path is not None else "the model file"
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        name = str(path) if path is not None else "the file"
        raise ModelFileError(f"{name} is not an nvalchemi-lammps model file")
    version = record.get("format_version")
    if version != FORMAT_VERSION:
        advice = (
            "upgrade nvalchemi-lammps"
            if isinstance(version, int) and version > FORMAT_VERSION
            else "export the model again with this version"
        )
        raise ModelFileError(
            f"{where} has format version {version!r}, this nvalchemi-lammps reads "
            f"version {FORMAT_VERSION}: {advice}"
        )
    try:
        potential = potential_class(record["potential"]).from_config(record["config"])
        potential.load_state_dict(record["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        reason = f"missing entry {err}" if isinstance(err, KeyError) else str(err)
        raise ModelFileError(f"{where} is damaged or incomplete: {reason}") from None
    return potential.eval()


def save_model(potential: Potential, path: str | os.PathLike) -> Path:
    """Write ``potential`` to ``path`` (CPU tensors), readable by :func:`load_model` and by
    LAMMPS's ``pair_style mliap unified``."""
    from .frontends.mliap import MLIAPModel  # the class imports this module

    path = Path(path)
    torch.save(MLIAPModel.from_potential(potential), path)
    return path


def _record_argument(*args: object, **kwargs: object) -> object:
    """Stands in for ``MLIAPModel`` while :func:`load_model` unpickles: the record itself."""
    return args[0] if len(args) == 1 and not kwargs else None


def load_model(path: str | os.PathLike) -> Potential:
    """Read a model file written by :func:`save_model` (on the CPU, in eval mode).

    :raises ModelFileError: the file is missing, corrupt, of another format, or of an
        unknown format version
    """
    return potential_from_record(read_record(path), path)


def read_record(path: str | os.PathLike) -> object:
    """The record a model file holds, unchecked, read without running code from the file.

    :raises ModelFileError: the file is missing, not a torch archive, or names any global
        other than the ML-IAP model class
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} not found")
    try:
        with torch.serialization.safe_globals([(_record_argument, MLIAP_MODEL_GLOBAL)]):
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
    return record
