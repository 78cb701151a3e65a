"""The model file: round trip, and every way a file can be unusable."""

from __future__ import annotations

import os
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _systems import triclinic_ar_ne

from nvalchemi_lammps import FORMAT_VERSION, LennardJones, ModelFileError, load_model, save_model
from nvalchemi_lammps._model_file import (
    FORMAT,
    MLIAP_MODEL_GLOBAL,
    MLIAP_MODEL_GLOBAL_V2,
    ModelFileWarning,
    content_digest,
    mliap_model,
    model_record,
    open_model,
    read_record,
)
from nvalchemi_lammps.frontends.mliap import MLIAPModel
from nvalchemi_lammps.reference import evaluate_reference

DATA = Path(__file__).parent / "data"


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
    """Pickles as a model file does, ``mliap_model(record)``, around any record."""

    def __init__(self, record) -> None:
        self.record = record

    def __reduce__(self):
        return (mliap_model, (self.record,))


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


def test_reads_a_version_2_file(recwarn):
    """A file written by format version 2 (tests/data/model_format_v2.pt: ``_potential()``
    saved before version 3), whose global is the ML-IAP door's class: both readers still
    take it, and it is the same model."""
    path = DATA / "model_format_v2.pt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == [MLIAP_MODEL_GLOBAL_V2]
    assert read_record(path)["format_version"] == 2
    loaded = open_model(path)
    assert loaded.verified and type(loaded.potential) is LennardJones
    assert loaded.potential.config() == _potential().config()
    system = triclinic_ar_ne()
    expected, got = (
        evaluate_reference(p, system.positions, system.cell, system.pbc, system.species)
        for p in (_potential(), loaded.potential)
    )
    assert got.energy == expected.energy
    assert np.array_equal(got.forces, expected.forces)
    model = torch.load(path, weights_only=False)  # as LAMMPS's ML-IAP reads it
    assert type(model) is MLIAPModel and model.potential.config() == _potential().config()
    # written again, it is a file of this version
    record = model_record(loaded.potential)
    assert record["format_version"] == FORMAT_VERSION == 3
    assert not [w for w in recwarn if issubclass(w.category, ModelFileWarning)]


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


def test_device_is_not_a_model_file():
    """Before: '/dev/null not found'."""
    with pytest.raises(ModelFileError, match=re.escape("model file /dev/null is not a regular")):
        load_model("/dev/null")


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


@pytest.mark.parametrize("kind", ["random-bytes", "truncated-zip"])
def test_corrupt_file(tmp_path, kind):
    path = _corrupt(tmp_path, kind)
    message = f"cannot read model file {path}: not a torch archive (corrupt or truncated?): "
    with pytest.raises(ModelFileError, match=re.escape(message)) as info:
        load_model(path)
    # torch's finding in whole sentences, then how to get a good file; never its advice
    reason = str(info.value)[len(message) :]
    assert re.fullmatch(r"\w+: [^;]*[^.;]; export it again \(.*", reason), reason
    assert "weights_only" not in reason


def test_empty_file(tmp_path):
    path = _corrupt(tmp_path, "empty")
    with pytest.raises(ModelFileError, match=re.escape(f"model file {path} is empty; export it")):
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
        f"model file {path} holds Python objects, not plain data: it asks for _side_effect "
        "from module test_model_file, refused because loading that could run code from the "
        "file; it was not written by nvalchemi-lammps export"
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


def _with_format_version(tmp_path, version) -> Path:
    """A model file whose record says format version ``version`` (``None``: says none)."""
    path = save_model(_potential(), tmp_path / "lj.pt")
    record = _record(path)
    if version is None:
        del record["format_version"]
    else:
        record["format_version"] = version
    _write_record(record, path)
    return path


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
    path = _with_format_version(tmp_path, version)
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
    record["digest"] = content_digest(record)  # a valid file, of a potential not installed
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


# --- integrity: the digest, damaged bytes, files from before the digest --------------------


def _member_data(path, suffix: str) -> tuple[int, int]:
    """(offset, size) of the bytes of the archive member ending in ``suffix``."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = np.frombuffer(f.read(4), dtype="<u2")
    return info.header_offset + 30 + int(name_length) + int(extra_length), info.file_size


def test_file_carries_the_digest_of_its_contents(tmp_path):
    path = save_model(_potential(), tmp_path / "lj.pt")
    record = _record(path)
    assert record["digest"] == content_digest(record)
    assert record["digest"].startswith("sha256:") and len(record["digest"]) == 7 + 64
    loaded = open_model(path)
    assert loaded.verified and loaded.digest == record["digest"]
    # another model: another digest; the same model saved again: the same digest
    other = _potential()
    other.load_state_dict({k: v * 1.5 for k, v in other.state_dict().items()})
    assert open_model(save_model(other, tmp_path / "other.pt")).digest != loaded.digest
    assert open_model(save_model(_potential(), tmp_path / "again.pt")).digest == loaded.digest


def test_flipped_byte_in_a_weight_is_refused(tmp_path):
    """The issue's case: one byte of a tensor XORed with 0x40 loaded as another model."""
    path = save_model(_potential(), tmp_path / "lj.pt")
    offset, size = _member_data(path, "data/0")
    data = bytearray(path.read_bytes())
    data[offset + size - 2] ^= 0x40
    path.write_bytes(bytes(data))
    message = f"model file {path} is damaged: its contents do not match the digest written"
    with pytest.raises(ModelFileError, match=re.escape(message)) as info:
        load_model(path)
    assert "export it again (nvalchemi-lammps export" in str(info.value)


def test_file_without_digest_loads_with_a_warning(tmp_path):
    """Files written before the digest (same format version) load, and say they are not
    checked; their digest is computed from what they hold."""
    potential = _potential()
    record = _record(save_model(potential, tmp_path / "lj.pt"))
    digest = record.pop("digest")
    path = tmp_path / "old.pt"
    _write_record(record, path)
    with pytest.warns(ModelFileWarning) as caught:
        loaded = open_model(path)
    assert len(caught) == 1
    assert str(caught[0].message) == (
        f"model file {path} carries no digest (written before nvalchemi-lammps checked "
        "them): its contents cannot be verified; export it again to add one"
    )
    assert not loaded.verified and loaded.digest == digest
    assert loaded.potential.config() == potential.config()


def test_string_format_version(tmp_path):
    path = _with_format_version(tmp_path, str(FORMAT_VERSION))
    message = (
        f"model file {path} has format version '{FORMAT_VERSION}' (str), where "
        f"nvalchemi-lammps writes an integer, now {FORMAT_VERSION}: the file is damaged"
    )
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)


@pytest.mark.parametrize(
    ("content", "begins"),
    [("units metal\n", "units metal"), ("\nhello world\n", "hello world"), (".", ".")],
    ids=["IndexError", "KeyError", "stop"],
)
def test_text_file_as_model(tmp_path, content, begins):
    """torch's legacy reader raised IndexError or KeyError on these."""
    path = tmp_path / "text.pt"
    path.write_text(content)
    message = (
        f"model file {path} is a text file, not a torch archive (it begins {begins!r}); "
        "write a model file with nvalchemi-lammps export CONFIG.toml -o FILE.pt"
    )
    with pytest.raises(ModelFileError, match=f"^{re.escape(message)}$"):
        load_model(path)


# --- files that are something else: each named for what it is ----------------------------

#: What ``_foreign`` builds, and the message each gets (``{path}`` filled in).
FOREIGN = {
    "torchscript": (
        "model file {path} is a TorchScript model, such as pair_style mace reads, not an "
        "nvalchemi-lammps model file; write a model file with nvalchemi-lammps export"
    ),
    "os-system": (
        "model file {path} holds Python objects, not plain data: it asks for system from "
        "module posix, refused because loading that could run code from the file"
    ),
    "text": "model file {path} is a text file, not a torch archive (it begins 'units metal')",
    "directory": "model file {path} is a directory: pair_style nvalchemi reads one file",
}


class _System:
    """Pickles as ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Doubling(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * x


def _foreign(kind: str, folder: Path) -> Path:
    """A file of ``kind`` (see :data:`FOREIGN`) named ``<kind>.pt`` in ``folder``; the
    pickle's command would create ``folder/ran``."""
    path = folder / f"{kind}.pt"
    if kind == "torchscript":
        with warnings.catch_warnings():  # deprecated in torch 2.10, still what MACE writes
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(_Doubling()), path)
    elif kind == "os-system":
        torch.save({"weights": torch.ones(2), "run": _System(f"touch {folder / 'ran'}")}, path)
    elif kind == "text":
        path.write_text("units metal\natom_style atomic\n")
    else:
        path.mkdir()
    return path


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_other_files_are_named_for_what_they_are(tmp_path, kind):
    """Before: 'not a torch archive (corrupt or truncated?)' with torch's text cut at
    'Re-running torch.load with weights_only set to False', or 'not found' (a directory)."""
    path = _foreign(kind, tmp_path)
    with pytest.raises(ModelFileError, match=re.escape(FOREIGN[kind].format(path=path))) as info:
        load_model(path)
    assert "weights_only" not in str(info.value) and "corrupt" not in str(info.value)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "write",
    [
        lambda obj, path: torch.save(obj, path, pickle_protocol=4),
        lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=4)),
        lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=0)),
    ],
    ids=["torch-protocol-4", "bare-pickle", "bare-pickle-protocol-0"],
)
def test_pickles_asking_for_code_name_it(tmp_path, write):
    """Also where torch's own scan of the pickle cannot read it, and outside an archive."""
    path = tmp_path / "evil.pt"
    write([_System(f"touch {tmp_path / 'ran'}"), {"a": 1}], path)
    message = (
        f"model file {path} holds Python objects, not plain data: it asks for system from "
        "module posix, refused"
    )
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)
    assert not (tmp_path / "ran").exists()


def test_bare_pickle_of_plain_data(tmp_path):
    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"weights": [1.0, 2.0]}, protocol=4))
    message = f"model file {path} is a Python pickle, not a torch archive: it was not written"
    with pytest.raises(ModelFileError, match=re.escape(message)):
        load_model(path)


@pytest.mark.lammps
@pytest.mark.parametrize(
    ("kind", "nprocs"),
    [*((kind, 2) for kind in FOREIGN), ("torchscript", 1)],
    ids=lambda v: f"np{v}" if isinstance(v, int) else v,
)
def test_other_files_through_lammps(tmp_path, kind, nprocs):
    """``pair_style nvalchemi`` on each: one clear LAMMPS error, exit != 0, no hang, no
    traceback, and the pickle's command never ran. Every kind on 2 ranks (each rank reads
    the file), one on 1 rank (LAMMPS's single-rank path; the message is the same Python)."""
    from nvalchemi_lammps.lammps_run import run_lammps

    path = _foreign(kind, tmp_path)
    script = (
        "units metal\nregion box block 0 10 0 10 0 10\ncreate_box 1 box\n"
        f"pair_style nvalchemi {path}\n"
    )
    run = run_lammps(script, nprocs, tmp_path / "run", timeout=120)
    assert run.returncode not in (0, -9), run.output[-3000:]
    errors = [line for line in run.output.splitlines() if "ERROR" in line]
    expected = f"Pair style nvalchemi cannot load model {path}: " + FOREIGN[kind].format(path=path)
    assert errors and all(expected in line for line in errors), run.output[-3000:]
    assert "Traceback" not in run.output and "weights_only" not in run.output
    assert not (tmp_path / "ran").exists()


#: Mutations of real model files per kind; with the seed below they take a few seconds.
FUZZ_CASES = {"truncate": 100, "byte": 200, "bit": 200}


def _fuzz_models(tmp_path) -> list:
    from nvalchemi_lammps import MessagePassing

    return [
        save_model(_potential(), tmp_path / "lj.pt"),
        save_model(
            MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=2, features=8, seed=1),
            tmp_path / "mp.pt",
        ),
    ]


def test_fuzzed_model_files_never_load_changed(tmp_path):
    """Random truncations, byte replacements and bit flips of real model files: each load
    ends in a ModelFileError (never a raw IndexError, KeyError, UnicodeDecodeError,
    struct.error, ...) or loads exactly the original contents (a byte torch never reads,
    such as zip padding or the archive's own bookkeeping). No damaged contents load."""
    rng = np.random.default_rng(20261130)
    refused = unchanged = 0
    changed: list[str] = []
    for original in _fuzz_models(tmp_path):
        good = original.read_bytes()
        digest = open_model(original).digest
        for kind, count in FUZZ_CASES.items():
            for case in range(count):
                data = bytearray(good)
                if kind == "truncate":
                    data = data[: int(rng.integers(0, len(good)))]
                else:
                    at = int(rng.integers(0, len(good)))
                    if kind == "byte":
                        data[at] = (data[at] + int(rng.integers(1, 256))) % 256
                    else:
                        data[at] ^= 1 << int(rng.integers(0, 8))
                path = tmp_path / f"fuzz-{original.stem}-{kind}-{case}.pt"
                path.write_bytes(bytes(data))
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ModelFileWarning)  # digest key hit
                        loaded = open_model(path)
                except ModelFileError:
                    refused += 1
                    continue
                if loaded.digest == digest:
                    unchanged += 1
                else:
                    changed.append(path.name)
                path.unlink()
    total = sum(FUZZ_CASES.values()) * 2
    assert changed == [], f"{len(changed)} of {total} damaged files loaded changed: {changed}"
    assert refused + unchanged == total
    # most bytes matter (on this seed 713 of 1000 mutations are refused); the rest are
    # bytes torch skips, and the contents load bit-identical
    assert refused >= total // 2, f"only {refused} of {total} refused"
