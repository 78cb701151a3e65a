"""Nothing wrong runs silently (issue 17), through LAMMPS on 1 and 2 ranks: a damaged model
file, different model files on different ranks, non-finite energies or forces, atoms on the
same spot, a model that raises SystemExit or KeyboardInterrupt, a text file as the model,
``NULL`` outside ``hybrid``. Each run ends with its specific error (pinned fragments) well
before its timeout; a run that must go on says its warning once.
"""

from __future__ import annotations

import textwrap

import pytest
from _broken_models import (
    ExitingLennardJones,
    NonFiniteLennardJones,
    WrongReturnLennardJones,
    importable_in_lammps,
)
from lammps_helpers import AR_EPSILON, AR_SIGMA, BASE_EXCEPTIONS, CUTOFF, NE_EPSILON, NE_SIGMA

from nvalchemi_lammps import LennardJones, save_model
from nvalchemi_lammps._model_file import FORMAT_VERSION, read_record
from nvalchemi_lammps.frontends.mliap import MLIAPModel
from nvalchemi_lammps.lammps_run import lammps_command, run_command, run_lammps

pytestmark = pytest.mark.lammps

TIMEOUT = 120
NPROCS = [1, 2]
ARGON = {"elements": ["Ar"], "epsilon": {"Ar": AR_EPSILON}, "sigma": {"Ar": AR_SIGMA}}
AR_NE = {
    "elements": ["Ar", "Ne"],
    "epsilon": {"Ar": AR_EPSILON, "Ne": NE_EPSILON},
    "sigma": {"Ar": AR_SIGMA, "Ne": NE_SIGMA},
}


def _script(data, model, elements: str = "Ar", before_run: str = "", run: str = "run 0") -> str:
    """Thermal argon (one atom type, another per further element in ``elements``)."""
    extra = len(elements.split()) - 1
    return (
        textwrap.dedent(
            f"""\
        units metal
        atom_style atomic
        atom_modify map array
        read_data {data} {f"extra/atom/types {extra}" if extra else ""}
        mass * 39.948
        pair_style nvalchemi {model}
        pair_coeff * * {elements}
        """
        )
        + textwrap.dedent(before_run)
        + f"\n{run}\n"
    )


def _errors(run) -> str:
    return "\n".join(line for line in run.output.splitlines() if "ERROR" in line)


def _assert_fails_with(run, *messages: str) -> None:
    assert run.returncode != -9, f"hung, killed after {TIMEOUT} s:\n{run.output[-3000:]}"
    assert run.returncode != 0, f"the run went on:\n{run.output[-3000:]}"
    errors = _errors(run)
    missing = [m for m in messages if m not in errors]
    assert not missing, f"error output lacks {missing}:\n{run.output[-3000:]}"


def _flip(path, out, xor: int = 0x40):
    """``path`` with one byte of its last tensor's data XORed, as ``out``."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path) as archive:
        info = [
            i for i in archive.infolist() if "/data/" in i.filename and "serial" not in i.filename
        ][-1]
    data = bytearray(path.read_bytes())
    name_length, extra_length = np.frombuffer(
        data[info.header_offset + 26 : info.header_offset + 30], "<u2"
    )
    data[info.header_offset + 30 + int(name_length) + int(extra_length) + info.file_size - 2] ^= xor
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_damaged_model_file_is_refused(nprocs, argon_data, tmp_path):
    """One byte of a weight XORed: before, the run went on with another energy."""
    good = save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "argon.pt")
    damaged = _flip(good, tmp_path / "damaged.pt")
    run = run_lammps(_script(argon_data, damaged, "Ar"), nprocs, tmp_path, timeout=TIMEOUT)
    _assert_fails_with(
        run,
        f"cannot load model {damaged}",
        "is damaged: its contents do not match the digest written with them",
        "export it again",
    )


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
@pytest.mark.parametrize("content", ["units metal\n", "hello world\n"], ids=["units", "hello"])
def test_text_file_as_model_is_one_clean_message(content, nprocs, argon_data, tmp_path):
    """Before: ``IndexError: pop from empty list`` (``KeyError: 101``) and a traceback on
    every rank."""
    text = tmp_path / "text.pt"
    text.write_text(content)
    run = run_lammps(_script(argon_data, text, "Ar"), nprocs, tmp_path, timeout=TIMEOUT)
    _assert_fails_with(run, f"cannot load model {text}", "not a torch archive")
    assert "Traceback" not in run.output, run.output[-3000:]


def test_model_without_digest_warns_once(argon_data, tmp_path):
    """A file written before digests runs, with one warning (not one per rank)."""
    record = read_record(save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "a.pt"))
    del record["digest"]
    old = tmp_path / "old.pt"
    import torch

    torch.save(_Wrapped(record), old)
    run = run_lammps(_script(argon_data, old), 2, tmp_path, timeout=TIMEOUT).check()
    warning = f"Pair style nvalchemi: model file {old} carries no digest"
    assert run.output.count(warning) == 1, run.output[-3000:]


class _Wrapped:
    def __init__(self, record) -> None:
        self.record = record

    def __reduce__(self):
        return (MLIAPModel, (self.record,))


def test_different_models_on_the_ranks_stop_every_rank(argon_data, tmp_path):
    """``mpirun -np 1 lmp -var m a.pt : -np 1 lmp -var m b.pt`` (node-local copies out of
    sync): before, it ran with a mix of both."""
    same = save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "argon.pt")
    copy = save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "argon_copy.pt")
    other = save_model(
        LennardJones(["Ar"], {"Ar": 2 * AR_EPSILON}, {"Ar": AR_SIGMA}, cutoff=CUTOFF),
        tmp_path / "argon_eps.pt",
    )
    (tmp_path / "in.mpmd").write_text(_script(argon_data, "${m}", "Ar"))
    mpirun, lmp = lammps_command(1)[0], lammps_command(1)[-1]

    def mpmd(first, second, workdir):
        workdir.mkdir()
        cmd = [mpirun, "-np", "1", lmp, "-in", str(tmp_path / "in.mpmd"), "-var", "m", str(first)]
        cmd += [":", "-np", "1", lmp, "-in", str(tmp_path / "in.mpmd"), "-var", "m", str(second)]
        return run_command(cmd, workdir, timeout=TIMEOUT)

    run = mpmd(same, other, tmp_path / "differ")
    _assert_fails_with(
        run,
        "the model differs between ranks: rank(s) 1 loaded other contents than rank 0",
        str(same),
    )
    # the same contents under another name are the same model
    run = mpmd(same, copy, tmp_path / "same")
    assert run.returncode == 0, run.output[-3000:]


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_atoms_on_the_same_spot_are_named(nprocs, argon_data, tmp_path):
    """Atom 2 moved onto atom 1: before, inf/NaN and exit 0."""
    model = save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "argon.pt")
    before_run = "set atom 2 x $(x[1]:%.17g) y $(y[1]:%.17g) z $(z[1]:%.17g)\n"
    run = run_lammps(
        _script(argon_data, model, "Ar", before_run), nprocs, tmp_path, timeout=TIMEOUT
    )
    _assert_fails_with(
        run,
        "atoms 1 and 2 are on the same spot",
        f"at step 0, where the lennard_jones model ({model}) gives no finite energy",
    )


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_non_finite_model_output_stops_naming_step_and_atoms(nprocs, argon_data, tmp_path):
    """Energies turn NaN on the neon atoms (IDs 5 and 9) at step 3 of an MD run: before,
    NaN thermo, then LAMMPS's "Non-numeric atom coords", without the model's name."""
    model = save_model(
        NonFiniteLennardJones(**AR_NE, cutoff=CUTOFF, poisoned=1, from_call=3),
        tmp_path / "nan.pt",
    )
    before_run = """
        set atom 5 type 2
        set atom 9 type 2
        fix nve all nve
        """
    script = _script(argon_data, model, "Ar Ne", before_run, run="run 10")
    env = {"PYTHONPATH": importable_in_lammps(tmp_path / "site")}
    run = run_lammps(script, nprocs, tmp_path, timeout=TIMEOUT, env=env)
    _assert_fails_with(
        run,
        f"the test_non_finite_lennard_jones model ({model}) returned non-finite energies or "
        "forces at step 3 on atoms",
    )
    named = _errors(run).split("on atoms", 1)[1].split("(")[0].split()
    assert set(named) <= {"5", "9"} and named, _errors(run)
    assert "Non-numeric" not in run.output


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_non_finite_position_is_named(nprocs, argon_data, tmp_path):
    """Atom 1 given a NaN velocity: from step 1 its position is NaN, it drops out of every
    pair (``r < cutoff`` is false for NaN) and LAMMPS never rebuilds its lists (a NaN
    displacement never passes the skin check). Before: finite energies and exit 0."""
    model = save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "argon.pt")
    before_run = """
        variable nan atom 1e300*1e300-1e300*1e300
        set atom 1 vx v_nan
        fix nve all nve
        """
    script = _script(argon_data, model, "Ar", before_run, run="run 3")
    run = run_lammps(script, nprocs, tmp_path, timeout=TIMEOUT)
    _assert_fails_with(
        run,
        "Pair style nvalchemi: atom 1 with a non-finite position at step 1",
        f"drops out of every pair of the lennard_jones model ({model})",
    )


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
@pytest.mark.parametrize(
    ("returns", "what"),
    [("int64", "a tensor of dtype torch.int64"), ("list", "a list"), ("none", "None")],
    ids=["int64", "list", "none"],
)
def test_wrong_return_of_a_potential_is_named(returns, what, nprocs, argon_data, tmp_path):
    """A potential whose forward returns int64 energies, a list or None: before, pe 0 and
    zero forces with exit 0 (int64), or a raw AttributeError."""
    model = save_model(
        WrongReturnLennardJones(**ARGON, cutoff=CUTOFF, returns=returns), tmp_path / "wrong.pt"
    )
    env = {"PYTHONPATH": importable_in_lammps(tmp_path / "site")}
    run = run_lammps(_script(argon_data, model, "Ar"), nprocs, tmp_path, timeout=TIMEOUT, env=env)
    _assert_fails_with(
        run,
        "Pair style nvalchemi failed at step 0: ValueError: potential "
        f"'test_wrong_return_lennard_jones' returned {what}: its forward must return a "
        "floating-point torch.Tensor of shape",
    )


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
@BASE_EXCEPTIONS
def test_base_exception_in_a_model_is_a_lammps_error(
    raises, failing_rank, message, nprocs, argon_data, tmp_path
):
    """SystemExit or KeyboardInterrupt inside the model: before, exit 4 and no message (at
    2 ranks MPICH's BAD TERMINATION). The traceback goes to the log once."""
    if failing_rank >= nprocs:
        failing_rank = 0  # the one rank there is
    model = save_model(
        ExitingLennardJones(**ARGON, cutoff=CUTOFF, raises=raises, failing_rank=failing_rank),
        tmp_path / "exiting.pt",
    )
    env = {"PYTHONPATH": importable_in_lammps(tmp_path / "site")}
    script = _script(argon_data, model, "Ar")
    run = run_lammps(script, nprocs, tmp_path, timeout=TIMEOUT, env=env)
    _assert_fails_with(run, f"Pair style nvalchemi failed at step 0: {message}")
    # at most once, in the log of rank 0 if rank 0 failed (at 2 ranks rank 1 may abort
    # the run first); never on a screen
    tracebacks = (tmp_path / "log.lammps").read_text().count("Traceback (most recent call")
    assert tracebacks <= (1 if failing_rank <= 0 else 0)
    if nprocs == 1:
        assert tracebacks == 1
    assert "Traceback" not in run.output, run.output[-3000:]


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_null_outside_hybrid_is_a_clear_error(nprocs, argon_data, tmp_path):
    model = save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "argon.pt")
    run = run_lammps(_script(argon_data, model, "Ar NULL"), nprocs, tmp_path, timeout=TIMEOUT)
    _assert_fails_with(
        run,
        "pair_coeff * * for pair style nvalchemi maps atom type 2 to NULL",
        "NULL is for pair_style hybrid",
    )


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_mace_model_needing_cuequivariance_names_the_package(nprocs, argon_data, tmp_path):
    """A MACE model exported where cuequivariance was installed, loaded where it is not
    (cuequivariance hidden from LAMMPS's Python here: packages of its names that fail to
    import come first on its path): before, "model file ... is damaged or incomplete"."""
    import os
    from pathlib import Path

    model = Path(__file__).parent / "data" / "mace_reduced_cg.pt"
    hidden = tmp_path / "without_cuequivariance"
    for name in ("cuequivariance", "cuequivariance_torch"):
        (hidden / name).mkdir(parents=True)
        (hidden / name / "__init__.py").write_text(f"raise ImportError('{name} hidden')\n")
    path = os.pathsep.join(p for p in (str(hidden), os.environ.get("PYTHONPATH")) if p)
    run = run_lammps(
        _script(argon_data, model), nprocs, tmp_path, timeout=TIMEOUT, env={"PYTHONPATH": path}
    )
    _assert_fails_with(run, f"cannot load model {model}", "pip install cuequivariance-torch")
    assert "damaged" not in _errors(run)


@pytest.mark.parametrize("nprocs", NPROCS, ids=lambda n: f"np{n}")
def test_string_format_version_says_what_is_wrong(nprocs, argon_data, tmp_path):
    """Before: "has format version '2', this nvalchemi-lammps reads version 2"."""
    import torch

    record = read_record(save_model(LennardJones(**ARGON, cutoff=CUTOFF), tmp_path / "a.pt"))
    record["format_version"] = str(record["format_version"])
    model = tmp_path / "string_version.pt"
    torch.save(_Wrapped(record), model)
    run = run_lammps(_script(argon_data, model), nprocs, tmp_path, timeout=TIMEOUT)
    _assert_fails_with(
        run,
        f"cannot load model {model}",
        f"has format version '{FORMAT_VERSION}' (str), where nvalchemi-lammps writes an "
        f"integer, now {FORMAT_VERSION}",
    )
