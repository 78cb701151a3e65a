"""``pair_style nvalchemi ... capture yes|no`` (and ``NVALCHEMI_LAMMPS_CAPTURE`` for
``pair_style mliap unified``) through a real LAMMPS on the CPU, where ``capture yes`` runs
the captured step on its padded static buffers without the CUDA graphs themselves (the
graphs: tests/gpu/test_captured_cuda.py; the capture logic alone: tests/test_captured.py).

An MD run whose box is compressed by 15 % (neighbor lists rebuilt, atoms crossing between
ranks, pair counts growing past the capacities) through ``nvalchemi`` on 1 and 2 ranks and
``nvalchemi/kk`` on 2: the end-of-run lines count the captures, and the last configuration
evaluated captured equals it evaluated eagerly per atom by ID to 1e-10. The
message-passing model's ghost exchanges are captured on one rank; on two and four they run
between the captured graphs, which the log counts. ``capture maybe`` and ``capture yes`` with ``compile`` stop every
rank with the reason; ML-IAP takes the setting from the environment. Every LAMMPS run here
is ``slow`` (tests/conftest.py); the setting's parsing stays in ``make check``.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
from _bad_inputs import TIMEOUT, BadInput, assert_clear_error, bad_input_script
from _systems import ar_ne_slab
from lammps_helpers import (
    AR_MASS,
    assert_matches_reference,
    assert_runs_agree,
    atoms_per_rank,
    built_lammps,
    comparison_script,
    neighbor_list_builds,
    read_evaluation,
    run0_evaluation,
)
from test_lammps_kokkos_plugin import kokkos_lammps  # noqa: F401  (nvalchemi/kk's fixture)

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps.frontends.mliap_settings import CAPTURE_ENV, MliapSettings
from nvalchemi_lammps.lammps_run import (
    PRESSURE,
    lammps_command,
    read_dump,
    read_results,
    run_command,
    run_lammps,
    write_lammps_data,
)
from nvalchemi_lammps.reference import evaluate_reference

#: What the pair style prints at the end of a run with ``capture yes`` on the CPU: captures
#: during the run and in all, the capacities on rank 0.
CAPTURED = re.compile(
    r"pair_style nvalchemi: capture on the CPU \(no graphs\): (\d+) captured during this run"
    r"(?: in \d+\.\d\d s)?, (\d+) in all; padded to (\d+) atoms and (\d+) pairs on rank 0"
)
#: the same line's captures during the run and how long they took (" in S s" when any)
CAPTURED_IN = re.compile(r"(\d+) captured during this run( in \d+\.\d\d s)?, ")
#: What the session says at ``capture yes`` on the CPU, for model NAME (the growth of the
#: capacities is the engine's to tune)
CAPTURING = (
    r"capture on the CPU \(padded buffers, no graphs\): {name}, padded to capacities that "
    r"grow by \d+% when outgrown"
)
#: KOKKOS on, Kokkos's Serial space, for ML-IAP's KOKKOS variant
KOKKOS = ["-k", "on", "t", "1", "-sf", "kk", "-pk", "kokkos", "newton", "on", "neigh", "half"]
MASSES = [39.948, 20.1797]


def test_mliap_capture_setting():
    """``NVALCHEMI_LAMMPS_CAPTURE``: ``auto`` unless set, ``yes`` or ``no``; anything else
    is refused with the allowed values."""
    assert MliapSettings.from_environment({}).capture == "auto"
    assert MliapSettings.from_environment({CAPTURE_ENV: "yes"}).capture == "yes"
    assert MliapSettings.from_environment({CAPTURE_ENV: "no"}).capture == "no"
    with pytest.raises(ValueError, match=re.escape(f"{CAPTURE_ENV} must be yes, no or auto")):
        MliapSettings.from_environment({CAPTURE_ENV: "maybe"})


def _md_script(model, processors: str, cells: int, steps: int) -> str:
    """Thermal argon (4 x cells^3 atoms) under ``capture yes`` for ``steps`` steps while the
    box shrinks by 15 %, then its last configuration evaluated captured (:func:`run0_evaluation`
    ``captured``) and by a fresh pair style under ``capture no`` (``eager``)."""
    script = textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        {processors}
        lattice fcc 5.26
        region box block 0 {cells} 0 {cells} 0 {cells}
        create_box 1 box
        create_atoms 1 box
        mass 1 {AR_MASS}
        velocity all create 300 4928459 loop geom
        compute pe all pe/atom
        compute stress all stress/atom NULL virial
        thermo_style custom step pe {" ".join(PRESSURE)}
        thermo {steps}
        pair_style nvalchemi {model} capture yes
        pair_coeff * * Ar
        neighbor 1.0 bin
        neigh_modify every 1 delay 0 check yes
        fix nve all nve
        fix shrink all deform 1 x scale 0.85 y scale 0.85 z scale 0.85 remap x
        timestep 0.005
        run 0
        run {steps}
        unfix shrink
        unfix nve
        """
    )
    script += run0_evaluation("captured")
    script += f"pair_style nvalchemi {model} capture no\npair_coeff * * Ar\n"
    return script + run0_evaluation("eager")


def _mace_compiled_blocks():
    """A small MACE of argon on cuEquivariance's kernels (their CPU fallback here) whose
    blocks are compiled inside the capture (``compile_blocks``)."""
    from _mace_models import random_mace

    from nvalchemi_lammps.potentials.mace import Mace

    # r_max 5 A: fcc argon's second shell (5.26 A) comes inside as the box shrinks
    network = random_mace(atomic_numbers=[18], atomic_energies=np.array([-0.5]), r_max=5.0)
    return Mace.from_model(network, dtype="float64", kernels="cuequivariance", compile_blocks=True)


#: the models of the MD runs, small enough for a few seconds per run on 2 cores (MACE:
#: plus its compilations)
MD_MODELS = {
    "one_layer": lambda: MessagePassing(["Ar"], cutoff=5.0, layers=1, features=8, seed=3),
    "message_passing": lambda: MessagePassing(["Ar"], cutoff=5.0, layers=2, features=8, seed=3),
    "mace_compiled_blocks": _mace_compiled_blocks,
}

#: (door, model, ranks, fcc cells per side, steps): the message-passing model's exchanges
#: inside the captured step (one rank, through both doors: nvalchemi/kk's kernels write the
#: pairs straight into the captured buffers); a one-layer model (no exchanges) on two ranks
#: through both doors (Lennard-Jones's closed form is never captured); MACE with its blocks
#: compiled inside the capture, compiled again when the capacities grow
MD_CASES = [
    ("nvalchemi", "message_passing", 1, 4, 200),
    ("nvalchemi", "message_passing", 2, 5, 200),
    ("nvalchemi", "one_layer", 2, 5, 200),
    ("nvalchemi/kk", "one_layer", 2, 5, 200),
    ("nvalchemi/kk", "message_passing", 1, 4, 200),
    ("nvalchemi/kk", "message_passing", 2, 5, 200),
    ("nvalchemi/kk", "mace_compiled_blocks", 1, 3, 100),
]
#: the end-of-run note of a model whose exchanges between ranks run between its graphs
BETWEEN = re.compile(
    r"pair_style nvalchemi: (\w+): (\d+) exchange\(s\) or sum\(s\) between ranks per step, "
    r"each between two graphs\n"
)


@pytest.mark.lammps
@pytest.mark.parametrize(
    ("door", "model", "nprocs", "cells", "steps"),
    MD_CASES,
    ids=[f"{door.replace('/', '-')}-{model}-np{n}" for door, model, n, _, _ in MD_CASES],
)
def test_md_run_captured_equals_eager(door, model, nprocs, cells, steps, request, tmp_path):
    potential = MD_MODELS[model]()
    path = save_model(potential, tmp_path / "model.pt")
    script = _md_script(path, "processors 2 1 1" if nprocs == 2 else "", cells, steps)
    if door == "nvalchemi/kk":
        run = request.getfixturevalue("kokkos_lammps").run(script, nprocs, tmp_path)
    else:
        run = run_lammps(script, nprocs, tmp_path, timeout=600)
    run.check()
    name = potential.name
    if potential.config().get("compile_blocks"):
        name += r" \(its blocks under torch\.compile\)"
    capturing = "pair_style nvalchemi: " + CAPTURING.format(name=name) + "\n"
    assert re.search(capturing, run.output), run.output[-3000:]
    # run 0, the MD run, the captured evaluation; the eager pair style reports nothing
    counts = [tuple(map(int, m)) for m in CAPTURED.findall(run.output)]
    builds = neighbor_list_builds(run.output)
    print(f"captures per run: {counts}; neighbor-list builds: {builds}")
    assert len(counts) == 3, run.output[-3000:]
    assert counts[0][:2] == (1, 1), "run 0 captures once"
    assert builds[1] >= 10, "the run rebuilt no neighbor lists: the test shows nothing"
    assert counts[1][0] >= 1 and counts[1][3] > counts[0][3], "the capacities never grew"
    # how long the captures took, where any ran
    timed = [(int(n), bool(took)) for n, took in CAPTURED_IN.findall(run.output)]
    assert timed == [(c[0], c[0] > 0) for c in counts], run.output[-3000:]
    assert "runs eagerly" not in run.output
    # two layers on two ranks: an exchange forward and one back; after every run
    notes = BETWEEN.findall(run.output)
    assert notes == ([(name, "2")] * 3 if nprocs > 1 and model == "message_passing" else [])
    ids = range(1, 4 * cells**3 + 1)
    captured = read_evaluation(tmp_path, run.output, "captured", ids)
    eager = read_evaluation(tmp_path, run.output, "eager", ids)
    label = f"capture/{door}/{potential.name}/np{nprocs}"
    assert_runs_agree(label, captured, eager, tol=1e-10, stress=True)


def _slab(workdir):
    positions, cell, species = ar_ne_slab()
    data = write_lammps_data(workdir / "slab.data", positions, cell, species + 1, MASSES)
    return data, positions, cell, species


@pytest.mark.lammps
@pytest.mark.parametrize("door", ["nvalchemi", "nvalchemi/kk"])
def test_exchanges_between_ranks_between_the_graphs(door, request, tmp_path):
    """Ghost features exchanged between four ranks (MPI mid-step, two ranks in the slab's
    vacuum without atoms): each exchange runs between two graphs of the captured step,
    the log says how many per step, and the forces, energies and stress are the
    reference's."""
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=12, seed=7)
    path = save_model(potential, tmp_path / "mp.pt")
    data, positions, cell, species = _slab(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    style = f"nvalchemi {path} strategy exchange capture yes"
    script = comparison_script(data.name, style, "Ar Ne", "processors 1 1 4")
    if door == "nvalchemi/kk":
        run = request.getfixturevalue("kokkos_lammps").run(script, 4, tmp_path)
    else:
        run = run_lammps(script, 4, tmp_path, timeout=600)
    run.check()
    assert atoms_per_rank(run.output)[0][0] == 0, "every rank has atoms: the test shows less"
    assert BETWEEN.findall(run.output) == [("message_passing", "4")], run.output[-3000:]
    assert [m[:2] for m in CAPTURED.findall(run.output)] == [("1", "1")]
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"capture/{door}/between-graphs/np4", atoms, glob, ref, cell)


REFUSED = [
    BadInput(
        "capture_maybe",
        ("pair_style nvalchemi capture must be yes, no or auto; got maybe",),
        style_args="capture maybe",
    ),
    BadInput(
        "capture_with_compile",
        ("capture yes and compile exclude each other",),
        style_args="capture yes compile default",
    ),
]


@pytest.mark.lammps
@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_capture_refused(case, argon_data, models, tmp_path):
    script = bad_input_script(case, models[case.model], argon_data)
    assert_clear_error(case, run_lammps(script, 2, tmp_path, timeout=TIMEOUT))


@pytest.mark.lammps
@pytest.mark.parametrize("nprocs", [1, 2])
def test_mliap_unified_captured(nprocs, tmp_path):
    """``NVALCHEMI_LAMMPS_CAPTURE=yes`` through KOKKOS ML-IAP: the message-passing model's
    exchanges gathered inside the captured step on one rank, through ML-IAP's communication
    between the graphs on two; rank 0 says so once; the reference's numbers."""
    _, lmp, env = built_lammps("NVALCHEMI_LAMMPS_MLIAP")
    potential = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=8, seed=2)
    path = save_model(potential, tmp_path / "mp.pt")
    data, positions, cell, species = _slab(tmp_path)
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    processors = "processors 1 1 2" if nprocs == 2 else ""
    (tmp_path / "in.lammps").write_text(
        comparison_script(data.name, f"mliap unified {path} 0", "Ar Ne", processors)
    )
    cmd = lammps_command(nprocs, lmp) + KOKKOS + ["-in", "in.lammps"]
    run = run_command(cmd, tmp_path, timeout=600, env={**env, CAPTURE_ENV: "yes"}).check()
    line = "nvalchemi-lammps: ML-IAP: " + CAPTURING.format(name="message_passing")
    assert len(re.findall(rf"{line} \({CAPTURE_ENV}\)\n", run.output)) == 1, run.output[-3000:]
    took = (
        r"nvalchemi-lammps: ML-IAP: capture on the CPU \(no graphs\): 1 captured in \d+\.\d\d s\n"
    )
    assert len(re.findall(took, run.output)) == 1, run.output[-3000:]
    between = re.findall(
        r"ML-IAP: message_passing: (\d+) exchange\(s\) or sum\(s\) between", run.output
    )
    assert between == ([] if nprocs == 1 else ["4"]), run.output[-3000:]
    assert "runs eagerly" not in run.output
    atoms, glob = read_dump(tmp_path / "atoms.dump"), read_results(run.output)
    assert_matches_reference(f"capture/mliap-kokkos/np{nprocs}", atoms, glob, ref, cell)
