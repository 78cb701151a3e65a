"""Bad input: every case ends as a clear LAMMPS error on 2 ranks (the position that is not a
number, found while the run steps, on 1 rank too), never as a hang.

Each run must exit with a non-zero status well before its timeout, and its output must
carry the specific message (pinned fragments, so a vaguer message fails the test).
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from _bad_inputs import BAD_INPUTS, TIMEOUT, BadInput, assert_clear_error, bad_input_script

from nvalchemi_lammps import Ewald, MessagePassing, save_model
from nvalchemi_lammps._model_file import FORMAT
from nvalchemi_lammps.lammps_run import lammps_command, run_command, run_lammps

pytestmark = pytest.mark.lammps


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


#: (case, ranks): every case on 2 ranks, where each rank must stop with the message, and the
#: error of a running step on 1 rank too. On 1 rank the input's errors are the same messages
#: from the same checks (pair_style, pair_coeff, the model file, init) that 2 ranks run on
#: each rank; test_lammps_kokkos_plugin.py's test_plugin_errors_hold_for_kokkos runs eight
#: of the cases on 1 rank through nvalchemi/kk
BAD_INPUT_RUNS = [(c, 2) for c in BAD_INPUTS]
BAD_INPUT_RUNS += [(c, 1) for c in BAD_INPUTS if c.id == "nan_position"]


@pytest.mark.parametrize(
    ("case", "nprocs"), BAD_INPUT_RUNS, ids=[f"{c.id}-np{n}" for c, n in BAD_INPUT_RUNS]
)
def test_bad_input_is_a_clear_error(case, nprocs, argon_data, models, bad_models, tmp_path):
    model = {**models, **bad_models}[case.model]
    script = bad_input_script(case, model, argon_data)
    assert_clear_error(case, run_lammps(script, nprocs, tmp_path, timeout=TIMEOUT))


@dataclass(frozen=True)
class RankSetting:
    """A setting given otherwise on rank 1 than on rank 0: ``given`` the pair_style keywords
    and pair_coeff elements of each, ``expected`` the error (``None``: the run goes on)."""

    id: str
    given: tuple[tuple[str, str], tuple[str, str]]
    expected: str | None
    model: str = "argon"  # a key of the ``models`` fixture, or ``message_passing``


def _differs(name: str, rank0: str, rank1: str) -> str:
    return f"the {name} differs between ranks: rank 0 '{rank0}', rank 1 '{rank1}'"


RANK_SETTINGS = [
    # before: ran, energies of both maps mixed
    RankSetting(
        "element_map",
        (("", "Ar Ne"), ("", "Ne Ar")),
        _differs("element map", "Ar Ne", "Ne Ar"),
        "argon_neon",
    ),
    # before: hung (a pair_coeff error on rank 1 alone)
    RankSetting("unknown_element", (("", "Ar"), ("", "Xx")), "element Xx not in model (Ar)"),
    # before: MPICH's "Message truncated" assertion, no LAMMPS error
    RankSetting(
        "strategy",
        (("strategy exchange", "Ar"), ("strategy shell", "Ar")),
        _differs("strategy", "exchange", "shell"),
        "message_passing",
    ),
    RankSetting("charge", (("charge 0", "Ar"), ("charge 1", "Ar")), _differs("charge", "0", "1")),
    RankSetting("spin", (("", "Ar"), ("spin 1", "Ar")), _differs("spin", "not given", "1")),
    RankSetting("task", (("", "Ar"), ("task omol", "Ar")), _differs("task", "not given", "omol")),
    RankSetting(
        "compile",
        (("compile no", "Ar"), ("compile yes", "Ar")),
        _differs("compile", "no", "default"),
    ),
    # the same values written otherwise are the same settings
    RankSetting("same_values", (("charge 0", "Ar"), ("charge 0.0 compile no", "Ar")), None),
]


@pytest.mark.parametrize("case", RANK_SETTINGS, ids=lambda c: c.id)
def test_setting_differing_between_ranks_stops_every_rank(case, argon_data, models, tmp_path):
    """``mpirun -np 1 lmp -var ... : -np 1 lmp -var ...``, one setting that changes what is
    computed given otherwise on rank 1: every rank stops, naming the setting and the ranks
    (and the same setting written otherwise runs)."""
    if case.model == "message_passing":
        model = save_model(MessagePassing(["Ar"], cutoff=5.0, layers=2), tmp_path / "mp.pt")
    else:
        model = models[case.model]
    types = len(case.given[0][1].split())
    (tmp_path / "in.mpmd").write_text(
        textwrap.dedent(
            f"""\
            units metal
            atom_style atomic
            read_data {argon_data} extra/atom/types {types - 1}
            mass * 39.948
            pair_style nvalchemi {model} ${{keywords}}
            pair_coeff * * ${{elements}}
            run 0
            """
        )
    )
    mpirun, lmp = lammps_command(1)[0], lammps_command(1)[-1]
    cmd = [mpirun]
    for separator, (keywords, elements) in zip(([], [":"]), case.given):
        cmd += [*separator, "-np", "1", lmp, "-in", "in.mpmd"]
        cmd += ["-var", "keywords", keywords or "strategy auto", "-var", "elements", elements]
    run = run_command(cmd, tmp_path, timeout=TIMEOUT)
    if case.expected is None:
        assert run.returncode == 0, run.output[-3000:]
    else:
        assert_clear_error(BadInput(case.id, (case.expected,)), run)


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


def test_a_run_killed_leaves_its_log(tmp_path):
    """With ``log``, what a run wrote before it was killed is in the file as well as in the
    output (the benchmark keeps each process's log beside its results)."""
    from nvalchemi_lammps.lammps_run import run_command

    code = "import time; print('set up', flush=True); time.sleep(300)"
    log = tmp_path / "run.log"
    run = run_command([sys.executable, "-c", code], tmp_path, timeout=5, log=log)
    assert run.returncode == -9
    assert log.read_text() == "set up\n"
    assert run.output.startswith("set up\n") and "killed after 5 s" in run.output


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
