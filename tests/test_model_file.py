"""The model file: round trip, and every way a file can be unusable."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _systems import triclinic_ar_ne

from nvalchemi_lammps import FORMAT_VERSION, LennardJones, ModelFileError, load_model, save_model
from nvalchemi_lammps._model_file import FORMAT
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
    return torch.load(path, map_location="cpu", weights_only=True)


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
    torch.save(record, path)
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
    torch.save(record, path)
    with pytest.raises(
        ValueError, match=re.escape("unknown potential 'no_such_potential' (known: ")
    ) as info:
        load_model(path)
    assert "lennard_jones" in str(info.value)
