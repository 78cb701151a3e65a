"""Bad input: every case ends as a clear LAMMPS error on 1 and 2 ranks, never as a hang.

Each run must exit with a non-zero status well before its timeout, and its output must
carry the specific message (pinned fragments, so a vaguer message fails the test).
"""

from __future__ import annotations

import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from nvalchemi_lammps import FORMAT_VERSION, Ewald, save_model
from nvalchemi_lammps._model_file import FORMAT
from nvalchemi_lammps.lammps_run import run_lammps

pytestmark = pytest.mark.lammps

#: A run that fails must fail quickly; one that needs this long is hanging.
TIMEOUT = 120


@dataclass(frozen=True)
class BadInput:
    """:param model: model file: a key of the ``models`` fixture or of :func:`bad_models`
    :param messages: fragments the error output must contain"""

    id: str
    messages: tuple[str, ...]
    model: str = "argon"
    elements: str = "Ar"
    units: str = "metal"
    read_data: str = ""
    style_args: str = ""
    before_box: str = ""
    before_run: str = ""


BAD_INPUTS = [
    BadInput("unknown_element", ("element Xx not in model (Ar)",), elements="Xx"),
    BadInput(
        "unknown_element_of_two",
        ("element Xe not in model (Ne, Ar)",),
        model="argon_neon",
        elements="Ar Xe",
        read_data="extra/atom/types 1",
    ),
    BadInput("missing_model", ("cannot load model", "missing.pt", "not found"), model="missing"),
    BadInput("corrupt_model", ("cannot load model", "cannot read model file"), model="corrupt"),
    BadInput(
        "unknown_format_version",
        ("cannot load model", "format version 999", f"reads version {FORMAT_VERSION}"),
        model="version_999",
    ),
    BadInput(
        "not_a_model_file",
        ("cannot load model", "is not an nvalchemi-lammps model file"),
        model="other_format",
    ),
    BadInput(
        "unknown_keyword",
        ("Unknown pair_style nvalchemi keyword: colour",),
        style_args="colour red",
    ),
    BadInput(
        "charge_not_a_number",
        ("Expected floating point parameter instead of 'minus-one'",),
        style_args="charge minus-one",
    ),
    BadInput("charge_missing", ("pair_style nvalchemi charge",), style_args="charge"),
    BadInput("task_for_lj", ("the lennard_jones model takes no task",), style_args="task omol"),
    BadInput("spin_for_lj", ("the lennard_jones model takes no spin",), style_args="spin 2"),
    BadInput(
        "negative_spin", ("pair_style nvalchemi spin must be >= 0; got -1",), style_args="spin -1"
    ),
    BadInput(
        "compile_mode_unknown",
        ("compile mode must be one of default, reduce-overhead",),
        style_args="compile fast",
    ),
    BadInput(
        "compile_unsupported",
        ("the ewald model cannot be compiled",),
        model="ewald",
        style_args="compile yes",
    ),
    BadInput("newton_off", ("requires newton pair on",), before_box="newton off"),
    BadInput(
        "wrong_number_of_elements",
        ("needs 1 element names", "got 2"),
        elements="Ar Ar",
    ),
    BadInput(
        "units_mismatch",
        ("the model is in units metal but the input uses units real",),
        units="real",
    ),
    # LAMMPS itself stops a NaN position before any pair style sees it (Domain::remap);
    # what matters here is that the run ends with a clear error on every rank.
    BadInput(
        "nan_position",
        ("Non-numeric atom coords",),
        before_run="""
        variable nan atom 1e300*1e300-1e300*1e300
        set atom 1 x v_nan
        """,
    ),
]


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory) -> dict[str, str]:
    workdir = tmp_path_factory.mktemp("bad_models")
    corrupt = workdir / "corrupt.pt"
    corrupt.write_bytes(np.random.default_rng(7).bytes(4096))
    version_999 = workdir / "version_999.pt"
    torch.save({"format": FORMAT, "format_version": 999}, version_999)
    other_format = workdir / "other_format.pt"
    torch.save({"weights": torch.zeros(3)}, other_format)
    ewald = save_model(
        Ewald(["Ar"], cutoff=8.0, accuracy=1e-5, charges={"Ar": 0.0}), workdir / "ewald.pt"
    )
    return {
        "ewald": str(ewald),
        "missing": str(workdir / "missing.pt"),
        "corrupt": str(corrupt),
        "version_999": str(version_999),
        "other_format": str(other_format),
    }


@pytest.mark.parametrize("nprocs", [1, 2], ids=lambda n: f"np{n}")
@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.id)
def test_bad_input_is_a_clear_error(case, nprocs, argon_data, models, bad_models, tmp_path):
    model = {**models, **bad_models}[case.model]
    script = "".join(
        textwrap.dedent(block)
        for block in (
            f"""\
            units {case.units}
            atom_style atomic
            """,
            case.before_box + "\n",
            f"""
            read_data {argon_data} {case.read_data}
            mass * 39.948
            """,
            f"""
            pair_style nvalchemi {model} {case.style_args}
            pair_coeff * * {case.elements}
            """,
            case.before_run,
            "\nrun 0\n",
        )
    )
    run = run_lammps(script, nprocs, tmp_path, timeout=TIMEOUT)
    assert run.returncode != -9, f"hung, killed after {TIMEOUT} s:\n{run.output[-3000:]}"
    assert run.returncode != 0, f"LAMMPS accepted the bad input:\n{run.output[-3000:]}"
    errors = "\n".join(line for line in run.output.splitlines() if "ERROR" in line)
    missing = [m for m in case.messages if m not in errors]
    assert not missing, f"error output lacks {missing}:\n{run.output[-3000:]}"


def _processes_in(directory) -> list[int]:
    """Processes whose working directory is ``directory`` (the ranks of a run there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == Path(directory):
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to look at
                pass
    return found


def test_hung_run_is_killed_with_every_rank(tmp_path):
    """A run past its timeout is reported as killed, and no rank of it is left running."""
    start = time.monotonic()
    run = run_lammps("shell sleep 300\n", 2, tmp_path, timeout=5)
    assert run.returncode == -9
    assert "killed after 5 s" in run.output
    assert time.monotonic() - start < 60
    assert _processes_in(tmp_path) == []


@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_python_error_on_one_rank_ends_every_rank(nprocs, argon_data, tmp_path):
    """A potential that raises on rank 1 only, while the other ranks wait for it in a ghost
    exchange: the run stops with the exception's text, exit != 0, and no rank hangs."""
    from _broken_models import FailingMessagePassing, importable_in_lammps

    from nvalchemi_lammps import save_model

    model = save_model(
        FailingMessagePassing(["Ar"], cutoff=5.0, layers=2, failing_rank=1),
        tmp_path / "failing.pt",
    )
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        read_data {argon_data}
        pair_style nvalchemi {model} strategy exchange
        pair_coeff * * Ar
        run 0
        """
    )
    env = {"PYTHONPATH": importable_in_lammps(tmp_path / "site")}
    run = run_lammps(script, nprocs, tmp_path, timeout=TIMEOUT, env=env)
    assert run.returncode != -9, f"hung, killed after {TIMEOUT} s:\n{run.output[-3000:]}"
    assert run.returncode != 0, f"the failure went unnoticed:\n{run.output[-3000:]}"
    errors = "\n".join(line for line in run.output.splitlines() if "ERROR" in line)
    expected = "Pair style nvalchemi failed at step 0: ValueError: deliberate failure on rank 1"
    assert expected in errors, run.output[-3000:]
    # MPI_Abort kills the other ranks; give the kernel a moment to reap them
    deadline = time.monotonic() + 20
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(tmp_path) == []
