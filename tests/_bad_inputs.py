"""Bad input for a LAMMPS run and the clear error it must end in: the cases of
tests/test_lammps_errors.py (``pair_style nvalchemi``), which
tests/test_lammps_kokkos_plugin.py runs through ``nvalchemi/kk`` too."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from nvalchemi_lammps import FORMAT_VERSION

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
    # pair_modify asks for what the model alone decides: LAMMPS would accept it and change
    # nothing (an lj/cut input moved over keeps its pressure-changing tail line silently)
    BadInput(
        "pair_modify_tail",
        ("does not support pair_modify tail yes", "the model gives the whole energy"),
        before_run="pair_modify tail yes",
    ),
    BadInput(
        "pair_modify_shift",
        ("does not support pair_modify shift yes", "the model gives the whole energy"),
        before_run="pair_modify shift yes",
    ),
    # geometric is LAMMPS's default: refused too when written, as it is not applied either
    BadInput(
        "pair_modify_mix",
        ("does not support pair_modify mix geometric", "the model gives the whole energy"),
        before_run="pair_modify mix geometric",
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


def bad_input_script(case: BadInput, model, data) -> str:
    """The input of ``case``: ``data`` (the ``argon_data`` fixture) read, ``model`` set
    (``pair_style nvalchemi``, the KOKKOS variant under ``-sf kk``), then ``run 0``."""
    return "".join(
        textwrap.dedent(block)
        for block in (
            f"""\
            units {case.units}
            atom_style atomic
            """,
            case.before_box + "\n",
            f"""
            read_data {data} {case.read_data}
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


def assert_clear_error(case: BadInput, run) -> None:
    """``run`` of :func:`bad_input_script` stopped, before its timeout, with the messages
    of ``case`` on ERROR lines (of its output, or of the log LAMMPS writes in its workdir)."""
    assert run.returncode != -9, f"hung, killed after {TIMEOUT} s:\n{run.output[-3000:]}"
    assert run.returncode != 0, f"LAMMPS accepted the bad input:\n{run.output[-3000:]}"
    errors = "\n".join(line for line in _printed(run).splitlines() if "ERROR" in line)
    missing = [m for m in case.messages if m not in errors]
    assert not missing, f"error output lacks {missing}:\n{run.output[-3000:]}"


def _printed(run) -> str:
    """What ``run`` printed, and LAMMPS's log (``-log log.lammps`` in its workdir): rank 0's
    messages, flushed there as LAMMPS writes them. A run that ends in ``MPI_Abort`` can lose
    the tail of its output on the way through ``mpirun`` (seen once under load, 2026-12-07:
    the output stopped before rank 0's error, which the log still holds)."""
    log = Path(run.workdir) / "log.lammps"
    return run.output + ("\n" + log.read_text(errors="replace") if log.exists() else "")
