"""The model file: one versioned torch archive for both front doors.

A pickle of the single call :func:`mliap_model` ``(record)``. The record is plain data:
format name and version, the potential's registered name, its spec and constructor
arguments, and its tensors (CPU). Two readers see the same bytes:

- :func:`load_model` (``pair_style nvalchemi``, the tools) reads with
  ``torch.load(weights_only=True)`` and exactly one global allowed: the name
  ``nvalchemi_lammps._model_file.mliap_model``, bound to a function that hands back its
  argument unchanged. Loading never runs code from the file; the record is then checked
  here and the potential's class is looked up by name among the installed potentials.
- LAMMPS's ML-IAP (``pair_style mliap unified model.pt 0``) reads with
  ``torch.load(weights_only=False)``, which calls :func:`mliap_model`: the same checks
  (:func:`potential_from_record`), then a ready ML-IAP model. That trusts the file, as any
  ML-IAP model file must be trusted.

The global is this module's own function, not a front door's class: the ML-IAP door may be
renamed or moved without breaking a saved file, and this module imports no front door.
Version-2 files name the ML-IAP door's class (``nvalchemi_lammps.frontends.mliap.MLIAPModel``)
and are still read, by both readers.

The record carries a digest of everything else in it (``"digest"``: SHA-256 of a canonical
encoding of the other entries, tensors by dtype, shape and bytes), written by
:func:`save_model` and checked by :func:`potential_from_record`: torch's archive does not
verify its contents, so a flipped bit in a weight would otherwise load as a different model.
Files written before the digest (same format version) still load, with a warning.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._foreign_files import EXPORT, head, is_torchscript, pickled_globals, text_line
from ._mliap_entry import unified_model
from .potentials import Potential, potential_class

FORMAT = "nvalchemi-lammps-model"
#: Bumped when the layout of the file changes incompatibly (3: the record is wrapped in a
#: call of :func:`mliap_model`; 2: of the ML-IAP door's class; 1 was the bare record).
FORMAT_VERSION = 3
#: Versions this reader accepts: 2 differs from 3 only in the global it names.
READABLE_VERSIONS = (2, FORMAT_VERSION)
#: The one global a model file names: what LAMMPS's ML-IAP unpickles it into.
MLIAP_MODEL_GLOBAL = "nvalchemi_lammps._model_file.mliap_model"
#: The global of version-2 files (the ML-IAP door's class, which still takes a record).
MLIAP_MODEL_GLOBAL_V2 = "nvalchemi_lammps.frontends.mliap.MLIAPModel"


#: Every entry of a record (``"digest"`` is absent from files written before it).
RECORD_KEYS = frozenset(
    {"format", "format_version", "potential", "spec", "config", "state_dict", "digest"}
)
#: How to write a model file again, for the messages about damaged files.
REEXPORT = (
    "export it again (nvalchemi-lammps export CONFIG.toml -o FILE.pt, or save_model() in "
    "Python) or copy it again from where it was written"
)


class ModelFileError(ValueError):
    """A model file that is missing, unreadable, or not one we can use."""


class ModelFileWarning(UserWarning):
    """A model file that loads but whose contents cannot be checked (no digest)."""


def content_digest(record: dict[str, Any]) -> str:
    """``sha256:<hex>`` of every entry of ``record`` but ``"digest"``, canonically encoded:
    the same for the same contents whatever the pickle's layout."""
    hasher = hashlib.sha256()
    _feed(hasher, {k: v for k, v in record.items() if k != "digest"})
    return "sha256:" + hasher.hexdigest()


def _feed(hasher: Any, value: object) -> None:
    """Type-tagged, length-prefixed encoding of plain data and tensors into ``hasher``."""

    def put(tag: bytes, payload: bytes) -> None:
        hasher.update(tag + struct.pack("<Q", len(payload)) + payload)

    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (type(kv[0]).__name__, repr(kv[0])))
        put(b"d", struct.pack("<Q", len(items)))
        for key, item in items:
            _feed(hasher, key)
            _feed(hasher, item)
    elif isinstance(value, (list, tuple)):
        put(b"l", struct.pack("<Q", len(value)))
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        put(b"t", f"{flat.dtype}{tuple(value.shape)}".encode())
        put(b"b", flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif isinstance(value, str):
        put(b"s", value.encode("utf-8", "surrogatepass"))
    else:  # None, bool, int, float (repr round-trips floats exactly), anything else
        put(b"v", f"{type(value).__name__}:{value!r}".encode())


def model_record(potential: Potential) -> dict[str, Any]:
    """The plain data a model file holds for ``potential`` (tensors copied to the CPU)."""
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "potential": potential.name,
        "spec": potential.spec.to_dict(),
        "config": potential.config(),
        "state_dict": {k: v.detach().cpu() for k, v in potential.state_dict().items()},
    }
    record["digest"] = content_digest(record)
    return record


@dataclass(frozen=True)
class LoadedModel:
    """A model file's potential and what identifies its contents.

    :param digest: the contents' digest (``sha256:...``), as the file carries it, or
        computed here for a file written before digests
    :param verified: the file carried a digest and the contents match it
    """

    potential: Potential
    digest: str
    verified: bool


def potential_from_record(record: object, path: str | os.PathLike | None = None) -> Potential:
    """Check a model file's record and rebuild its potential (on the CPU, in eval mode).

    :param path: the file the record came from, for the messages (unknown inside LAMMPS's
        own ``torch.load``)
    :raises ModelFileError: not our format, another format version, or damaged
    """
    return _checked(record, path).potential


def _checked(record: object, path: str | os.PathLike | None) -> LoadedModel:
    where = f"model file {path}" if path is not None else "the model file"
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        name = str(path) if path is not None else "the file"
        raise ModelFileError(f"{name} is not an nvalchemi-lammps model file")
    version = record.get("format_version")
    if version is not None and type(version) is not int:  # a bool is no version either
        raise ModelFileError(
            f"{where} has format version {version!r} ({type(version).__name__}), where "
            f"nvalchemi-lammps writes an integer, now {FORMAT_VERSION}: the file is damaged or "
            f"was not written by nvalchemi-lammps; {REEXPORT}"
        )
    if version not in READABLE_VERSIONS:
        advice = (
            "upgrade nvalchemi-lammps"
            if version is not None and version > FORMAT_VERSION
            else "export the model again with this version"
        )
        raise ModelFileError(
            f"{where} has format version {version}, this nvalchemi-lammps reads "
            f"version {FORMAT_VERSION}: {advice}"
        )
    unknown = sorted(map(repr, set(record) - RECORD_KEYS))
    if unknown:  # a renamed key: the digest's would otherwise read as an older file
        raise ModelFileError(
            f"{where} has entries this nvalchemi-lammps does not know ({', '.join(unknown)}): "
            f"it is damaged, or was written by a newer nvalchemi-lammps (then upgrade); "
            f"{REEXPORT}"
        )
    digest = content_digest(record)
    written = record.get("digest")
    if written is None:
        warnings.warn(
            f"{where} carries no digest (written before nvalchemi-lammps checked them): its "
            "contents cannot be verified; export it again to add one",
            ModelFileWarning,
            stacklevel=3,
        )
    elif written != digest:
        raise ModelFileError(
            f"{where} is damaged: its contents do not match the digest written with them "
            f"(written {str(written)[:23]}..., contents {digest[:23]}...); {REEXPORT}"
        )
    try:
        cls = potential_class(record.get("potential"))
    except (ValueError, TypeError) as err:  # not registered here: a name, not damage
        raise ModelFileError(f"{where}: {_first_line(err)}") from None
    try:
        potential = cls.from_config(record["config"])
        potential.load_state_dict(record["state_dict"])
    except ImportError:
        raise  # a missing optional package names itself (e.g. pip install ...[mace])
    except Exception as err:  # noqa: BLE001  (any failure here means a bad record)
        reason = f"missing entry {err}" if isinstance(err, KeyError) else _first_line(err)
        raise ModelFileError(f"{where} is damaged or incomplete: {reason}") from None
    return LoadedModel(potential.eval(), digest, written is not None)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def mliap_model(record: object) -> Any:
    """What a model file unpickles into under ``torch.load(weights_only=False)`` (LAMMPS's
    ML-IAP): the ML-IAP model of ``record``, checked like :func:`load_model` checks it.

    The file's one global, by this name since version 3; the model comes from the class the
    ML-IAP door registers (:mod:`nvalchemi_lammps._mliap_entry`): this module names no door.
    """
    return unified_model(record)


class PickledRecord:
    """Pickles as ``mliap_model(record)``: what :func:`save_model` writes, and what the
    ML-IAP model reduces to."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (mliap_model, (self.record,))


def save_model(potential: Potential, path: str | os.PathLike) -> Path:
    """Write ``potential`` to ``path`` (CPU tensors), readable by :func:`load_model` and by
    LAMMPS's ``pair_style mliap unified``."""
    path = Path(path)
    torch.save(PickledRecord(model_record(potential)), path)
    return path


def _record_argument(*args: object, **kwargs: object) -> object:
    """Stands in for :func:`mliap_model` (or a version-2 file's ``MLIAPModel``) while :func:`load_model` unpickles: the record itself."""
    return args[0] if len(args) == 1 and not kwargs else None


def load_model(path: str | os.PathLike) -> Potential:
    """Read a model file written by :func:`save_model` (on the CPU, in eval mode).

    :raises ModelFileError: the file is missing, corrupt, of another format, or of an
        unknown format version
    """
    return _checked(read_record(path), path).potential


def open_model(path: str | os.PathLike) -> LoadedModel:
    """:func:`load_model`, with the digest of what was loaded (to compare across ranks)."""
    return _checked(read_record(path), path)


def read_record(path: str | os.PathLike) -> object:
    """The record a model file holds, unchecked, read without running code from the file.

    Whatever the file's bytes, this returns or raises :class:`ModelFileError`, and names
    what it was given when that is no model file: a directory, an empty or a text file, a
    TorchScript archive, a pickle that names code (which is refused), or bytes of no known
    kind (torch's reader meets damaged archives with many kinds of exception,
    ``IndexError``, ``KeyError``, ``UnicodeDecodeError``, ``struct.error``, ..., none of
    which is a message for a user).

    :raises ModelFileError: the file is missing, not a torch archive, or names any global
        other than :func:`mliap_model` (or a version-2 file's ML-IAP model class)
    """
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(
            f"model file {path} is a directory: pair_style nvalchemi reads one file, as "
            f"nvalchemi-lammps export writes it; {EXPORT}"
        )
    if not path.exists():
        raise ModelFileError(f"model file {path} not found")
    if not path.is_file():  # a device or a pipe: reading it might never end
        raise ModelFileError(f"model file {path} is not a regular file; {EXPORT}")
    allowed = [(_record_argument, name) for name in (MLIAP_MODEL_GLOBAL, MLIAP_MODEL_GLOBAL_V2)]
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols, not ours
            return torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001  (see the docstring)
        failure = err
    # what the file is, found only now: a model file that loads pays nothing for it
    try:
        start = head(path)
    except OSError as err:
        raise ModelFileError(f"cannot read model file {path}: {err.strerror}") from None
    if is_torchscript(path):
        raise ModelFileError(
            f"model file {path} is a TorchScript model, such as pair_style mace reads, not an "
            f'nvalchemi-lammps model file; {EXPORT} (potential = "mace" takes a mace-torch '
            "checkpoint)"
        )
    # the weights-only reader refuses a global, or meets a pickle it cannot read, with an
    # UnpicklingError; only then is there a pickle to name (damaged archives fail otherwise)
    named = pickled_globals(path) if isinstance(failure, pickle.UnpicklingError) else None
    refused = _refused(path, named or [])
    if refused:
        raise ModelFileError(
            f"model file {path} holds Python objects, not plain data: it asks for "
            f"{', '.join(refused)}, refused because loading that could run code from the "
            f"file; it was not written by nvalchemi-lammps export: {EXPORT}"
        )
    if not start:
        raise ModelFileError(f"model file {path} is empty; {REEXPORT}")
    line = text_line(start)
    if line is not None:
        raise ModelFileError(
            f"model file {path} is a text file, not a torch archive (it begins {line!r}); {EXPORT}"
        )
    if named is not None and not zipfile.is_zipfile(path):
        raise ModelFileError(
            f"model file {path} is a Python pickle, not a torch archive: it was not written "
            f"by nvalchemi-lammps export; {EXPORT}"
        )
    raise ModelFileError(
        f"cannot read model file {path}: not a torch archive (corrupt or truncated?): "
        f"{_torch_reason(failure)}; {REEXPORT}"
    )


def _refused(path: Path, named: list[tuple[str, str]]) -> list[str]:
    """Which of the globals ``named`` in ``path`` the weights-only reader refuses, as ``NAME
    from module MODULE``, a model file's own aside: in a torch archive, those torch does not
    take itself (its own static scan tells; where that cannot read the pickle, those outside
    torch); in a bare pickle, every one."""
    ours = {MLIAP_MODEL_GLOBAL, MLIAP_MODEL_GLOBAL_V2}
    named = [(module, name) for module, name in named if f"{module}.{name}" not in ours]
    if named and zipfile.is_zipfile(path):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
            named = [(module, name) for module, name in named if f"{module}.{name}" in unsafe]
        except Exception:  # noqa: BLE001  (e.g. pickle protocol 4, which torch's scan lacks)
            named = [(m, n) for m, n in named if m != "torch" and not m.startswith("torch.")]
    return [f"{name} from module {module}" for module, name in named]


def _torch_reason(err: BaseException) -> str:
    """What torch's reader met, in whole sentences, without its advice about
    ``weights_only`` (a model file never needs that protection off)."""
    text = str(err).strip()
    if "WeightsUnpickler error:" in text:  # the weights-only reader's own finding
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    line = text.splitlines()[0].strip() if text else ""
    sentence = line.split(". ", 1)[0].rstrip(".")
    if not sentence or "weights_only" in sentence:
        return type(err).__name__
    return f"{type(err).__name__}: {sentence}"
