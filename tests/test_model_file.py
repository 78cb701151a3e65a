"""The model file: round trip, and every way a file can be unusable."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch
from _systems import triclinic_ar_ne

from nvalchemi_lammps import FORMAT_VERSION, LennardJones, ModelFileError, load_model, save_model
from nvalchemi_lammps._model_file import FORMAT, MLIAP_MODEL_GLOBAL, read_record
from nvalchemi_lammps.frontends.mliap import MLIAPModel
from nvalchemi_lammps.reference import evaluate_reference


def _potential(dtype: str = "float64") -> LennardJones:
    return LennardJones(
        ["Ar", "Ne"],
        {"Ar": 0.0104, "Ne": 0.0031},
        {"Ar": 3.4, "Ne": 2.75},
        cutoff=6.0,
        pairs=[{"elements": ["Ar", "Ne"], "epsilon": 0.006, "cutoff": 5.5}],
        mixing="arithmetic",
        shift=True,
        units="metal",
        dtype=dtype,
    )


def _record(path) -> dict:
    return read_record(path)


class _Wrapped:
    """Pickles as a model file does, ``MLIAPModel(record)``, around any record."""

    def __init__(self, record) -> None:
        self.record = record

    def __reduce__(self):
        return (MLIAPModel, (self.record,))


def _write_record(record, path) -> None:
    torch.save(_Wrapped(record), path)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_round_trip(tmp_path, dtype):
    potential = _potential(dtype)
    path = save_model(potential, tmp_path / "lj.pt")
    assert path == tmp_path / "lj.pt"
    loaded = load_model(str(path))
    assert type(loaded) is LennardJones and not loaded.training
    assert loaded.config() == potential.config()
    assert loaded.spec == potential.spec
    system = triclinic_ar_ne()
    before, after = (
        evaluate_reference(p, system.positions, system.cell, system.pbc, system.species)
        for p in (potential, loaded)
    )
    assert after.energy == before.energy
    assert np.array_equal(after.forces, before.forces)


def test_file_holds_plain_data(tmp_path):
    potential = _potential()
    path = save_model(potential, tmp_path / "lj.pt")
    # one call of one global, the ML-IAP model class, on a record of plain data
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == [MLIAP_MODEL_GLOBAL]
    record = _record(path)
    assert record["format"] == FORMAT and record["format_version"] == FORMAT_VERSION
    assert record["potential"] == "lennard_jones"
    assert record["spec"] == potential.spec.to_dict()
    assert {k: record["spec"][k] for k in ("elements", "cutoff", "units", "dtype")} == {
        "elements": ["Ar", "Ne"],
        "cutoff": 6.0,
        "units": "metal",
        "dtype": "float64",
    }
    assert record["config"] == potential.config()
    assert all(t.device.type == "cpu" for t in record["state_dict"].values())


def test_missing_file(tmp_path):
    path = tmp_path / "nope.pt"
    with pytest.raises(ModelFileError, match=re.escape(f"model file {path} not found")):
        load_model(path)


def _corrupt(tmp_path, kind: str):
    path = tmp_path / f"{kind}.pt"
    if kind == "random-bytes":
        path.write_bytes(np.random.default_rng(0).bytes(512))
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        good = save_model(_potential(), tmp_path / "good.pt").read_bytes()
        path.write_bytes(good[: len(good) // 2])
    return path


@pytest.mark.parametrize("kind", ["random-bytes", "empty", "truncated-zip"])
def test_corrupt_file(tmp_path, kind):
    path = _corrupt(tmp_path, kind)
    message = f"cannot read model file {path}: not a torch archive (corrupt or truncated?)"
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)


RAN = []


def _side_effect():
    RAN.append(True)
    return {}


class _Payload:
    def __reduce__(self):
        return (_side_effect, ())


def test_loading_never_runs_code_from_the_file(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION, "config": _Payload()}, path)
    message = (
        f"model file {path} holds Python objects, not plain data: it was not written by "
        "nvalchemi-lammps export, and is not loaded because that could run code from it"
    )
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)
    assert RAN == []


@pytest.mark.parametrize(
    "content",
    [
        {"weights": torch.zeros(3)},
        {"format": "other-format", "format_version": 1},
        [1, 2, 3],
        torch.ones(2),
    ],
    ids=["plain-dict", "other-format", "list", "tensor"],
)
def test_not_our_format(tmp_path, content):
    path = tmp_path / "other.pt"
    torch.save(content, path)
    with pytest.raises(
        ModelFileError, match=re.escape(f"{path} is not an nvalchemi-lammps model file")
    ):
        load_model(path)


@pytest.mark.parametrize(
    ("version", "advice"),
    [
        (999, "upgrade nvalchemi-lammps"),
        (0, "export the model again with this version"),
        (None, "export the model again with this version"),
    ],
    ids=["newer", "older", "missing"],
)
def test_unknown_format_version(tmp_path, version, advice):
    path = save_model(_potential(), tmp_path / "lj.pt")
    record = _record(path)
    if version is None:
        del record["format_version"]
    else:
        record["format_version"] = version
    _write_record(record, path)
    message = (
        f"model file {path} has format version {version}, this nvalchemi-lammps reads "
        f"version {FORMAT_VERSION}: {advice}"
    )
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)


def test_unknown_potential_name(tmp_path):
    path = save_model(_potential(), tmp_path / "lj.pt")
    record = _record(path)
    record["potential"] = "no_such_potential"
    _write_record(record, path)
    with pytest.raises(
        ValueError, match=re.escape("unknown potential 'no_such_potential' (known: ")
    ) as info:
        load_model(path)
    assert "lennard_jones" in str(info.value)


def test_previous_format_version_is_refused(tmp_path):
    """Version 1 files were the bare record, without the ML-IAP model class around it."""
    record = _record(save_model(_potential(), tmp_path / "lj.pt"))
    record["format_version"] = 1
    path = tmp_path / "v1.pt"
    torch.save(record, path)
    message = (
        f"model file {path} has format version 1, this nvalchemi-lammps reads version "
        f"{FORMAT_VERSION}: export the model again with this version"
    )
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)


class _Evil:
    def __reduce__(self):
        return (_side_effect, ())


@pytest.mark.parametrize(
    "content",
    [
        _Wrapped({"format": FORMAT, "format_version": FORMAT_VERSION, "config": _Payload()}),
        _Wrapped(_Evil()),
        [_Wrapped({}), _Evil()],
    ],
    ids=["payload-in-record", "payload-as-record", "payload-beside-model"],
)
def test_only_the_model_class_is_allowed(tmp_path, content):
    """The file may name the ML-IAP model class and nothing else; even then loading never
    calls it, so no code from the file runs."""
    path = tmp_path / "evil.pt"
    torch.save(content, path)
    with pytest.raises(ModelFileError, match=re.escape("holds Python objects, not plain data")):
        load_model(path)
    assert RAN == []


def test_model_class_around_other_data(tmp_path):
    path = tmp_path / "odd.pt"
    _write_record([1, 2], path)
    with pytest.raises(
        ModelFileError, match=re.escape(f"{path} is not an nvalchemi-lammps model file")
    ):
        load_model(path)


def test_loading_as_mliap_does(tmp_path):
    """LAMMPS's ML-IAP (since PR #4582) calls ``torch.load(path, weights_only=False)`` and
    gets the ML-IAP model, with the same checks of the record."""
    potential = _potential()
    path = save_model(potential, tmp_path / "lj.pt")
    model = torch.load(path, weights_only=False)
    assert type(model) is MLIAPModel
    assert model.potential.config() == potential.config()
    record = _record(path)
    record["format_version"] = FORMAT_VERSION + 1
    _write_record(record, path)
    message = (
        f"the model file has format version {FORMAT_VERSION + 1}, this nvalchemi-lammps reads "
        f"version {FORMAT_VERSION}: upgrade nvalchemi-lammps"
    )
    with pytest.raises(ModelFileError, match=re.escape(message)):
        torch.load(path, weights_only=False)


def test_older_mliap_needs_the_environment_variable(tmp_path, monkeypatch):
    """LAMMPS before PR #4582 (May 2025) calls ``torch.load(path)``: with torch >= 2.6 that
    means ``weights_only=True``, which refuses the model class, unless
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is set."""
    path = save_model(_potential(), tmp_path / "lj.pt")
    with pytest.raises(pickle.UnpicklingError, match=re.escape(MLIAP_MODEL_GLOBAL)):
        torch.load(path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        model = torch.load(path)
    assert type(model) is MLIAPModel
