"""``nvalchemi-lammps validate``: LAMMPS on several rank counts against the single-process
reference.

The pieces are tested without LAMMPS (lattices, data headers, strategies, LAMMPS's log,
the receptive-field probe, the advice); the command itself runs real LAMMPS: correct models
(Lennard-Jones, message passing with strategy exchange and shell) pass on 1, 2 and 4 ranks,
and a message-passing model whose spec declares one layer of its two fails with the
message that says what to change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _broken_models import UnderdeclaredMessagePassing, importable_in_lammps

from nvalchemi_lammps import LennardJones, MessagePassing, lammps_run, save_model, structures
from nvalchemi_lammps import receptive_field as probe
from nvalchemi_lammps.cli import COMMANDS
from nvalchemi_lammps.cli import _comparison as judge
from nvalchemi_lammps.cli import validate as cli
from nvalchemi_lammps.contract import resolve_strategy
from nvalchemi_lammps.lammps_run import write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference

ELEMENTS = ["Ar", "Ne"]
CUTOFF = 5.0
#: 256 atoms, a 16.4 Angstrom box: wider than the 2 x 5 Angstrom a two-layer model reaches
LATTICE = "fcc:4.1:4"
UNDERDECLARED_ADVICE = (
    "the model's energies depend on atoms at least {reach} A away, beyond its declared "
    "receptive field cutoff x layers = 5 x 1 = 5 A: declare layers=2 (or more) in its spec "
    "(ModelSpec.layers), so that pair_style nvalchemi exchanges ghost features or widens the "
    "ghost shell (with layers=1 the pair style treats it as strictly local: ghost atoms get "
    "no pairs and no exchanged features, whatever the ghost cutoff)"
)


def _flat(text: str) -> str:
    """The report with its line wrapping undone."""
    return " ".join(text.split())


def _message_passing(**kwargs) -> MessagePassing:
    return MessagePassing(ELEMENTS, cutoff=CUTOFF, layers=2, features=8, seed=3, **kwargs)


def _underdeclared() -> UnderdeclaredMessagePassing:
    return UnderdeclaredMessagePassing(
        ELEMENTS, cutoff=CUTOFF, layers=2, features=8, seed=3, declared_layers=1
    )


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("validate-models")
    potentials = {
        "lj": LennardJones(
            elements=ELEMENTS,
            epsilon={"Ar": 0.0104, "Ne": 0.00312},
            sigma={"Ar": 3.40, "Ne": 2.74},
            cutoff=6.5,
        ),
        "mp": _message_passing(),
        "underdeclared": _underdeclared(),
    }
    return {name: save_model(p, folder / f"{name}.pt") for name, p in potentials.items()}


def _structure(seed: int = 1):
    lattice = structures.parse_lattice(LATTICE)
    positions, cell, types = structures.build_lattice(lattice, len(ELEMENTS), seed)
    return positions, cell, types - 1


# --- pieces, without LAMMPS -----------------------------------------------------------------


def test_validate_is_a_subcommand():
    assert COMMANDS["validate"] is cli


@pytest.mark.parametrize(
    ("text", "kind", "constant", "cells"),
    [
        ("fcc:4.05:10x10x10", "fcc", 4.05, (10, 10, 10)),
        ("bcc:3.3:2x3x4", "bcc", 3.3, (2, 3, 4)),
        ("sc:2.5:5", "sc", 2.5, (5, 5, 5)),
        ("diamond:5.43:2X2X2", "diamond", 5.43, (2, 2, 2)),
    ],
)
def test_parse_lattice(text, kind, constant, cells):
    assert structures.parse_lattice(text) == structures.Lattice(kind, constant, cells)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hcp:3:4", "lattice kind must be one of sc, bcc, fcc, diamond; got 'hcp'"),
        ("fcc:4.05", "--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got 'fcc:4.05'"),
        ("fcc:a:4", "--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got 'fcc:a:4'"),
        ("fcc:-1:4", "--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got 'fcc:-1:4'"),
        ("fcc:4:2x2", "--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got 'fcc:4:2x2'"),
        ("fcc:4:0x2x2", "--lattice takes KIND:A:NXxNYxNZ (e.g. fcc:4.05:6x6x6), got 'fcc:4:0x2x2'"),
    ],
)
def test_parse_lattice_refuses(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        structures.parse_lattice(text)


@pytest.mark.parametrize(("kind", "per_cell"), [("sc", 1), ("bcc", 2), ("fcc", 4), ("diamond", 8)])
def test_build_lattice(kind, per_cell):
    lattice = structures.Lattice(kind, 4.0, (2, 3, 2))
    positions, cell, types = structures.build_lattice(lattice, 3, seed=5)
    assert positions.shape == (12 * per_cell, 3)
    np.testing.assert_array_equal(cell, np.diag([8.0, 12.0, 8.0]))
    assert positions.min() >= 0.0 and np.all(positions < np.diag(cell))
    assert set(types) == {1, 2, 3}
    # displaced (forces are not zero), seeded, and no two atoms on top of each other
    again = structures.build_lattice(lattice, 3, seed=5)
    np.testing.assert_array_equal(positions, again[0])
    np.testing.assert_array_equal(types, again[2])
    assert not np.array_equal(positions, structures.build_lattice(lattice, 3, seed=6)[0])
    nearest = min(
        np.sort(probe.min_image_distances(positions, cell, positions[k]))[1]
        for k in range(len(positions))
    )
    assert nearest > 0.25 * 4.0


def test_min_image_distances_in_a_skewed_cell():
    cell = np.array([[6.0, 0.0, 0.0], [2.0, 5.0, 0.0], [1.0, -1.5, 7.0]])
    rng = np.random.default_rng(0)
    positions = rng.random((20, 3)) @ cell
    got = probe.min_image_distances(positions, cell, positions[3])
    shifts = np.array([[i, j, k] for i in range(-3, 4) for j in range(-3, 4) for k in range(-3, 4)])
    images = positions[3] + shifts @ cell
    want = np.linalg.norm(positions[:, None, :] - images[None], axis=2).min(axis=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_read_data_header(tmp_path):
    positions, cell, types = _structure()
    data = write_lammps_data(tmp_path / "a.data", positions, cell, types + 1, [39.948, 20.18])
    assert structures.read_data_header(data) == structures.DataHeader(2, True, "atomic")
    charge = tmp_path / "b.data"
    charge.write_text(
        textwrap.dedent(
            """\
            title
            2 atoms
            3 atom types   # comment
            0 10 xlo xhi
            0 10 ylo yhi
            0 10 zlo zhi

            Atoms # charge

            1 1 0.5 0 0 0
            2 3 -0.5 1 1 1
            """
        )
    )
    assert structures.read_data_header(charge) == structures.DataHeader(3, False, "charge")
    (tmp_path / "c.data").write_text("title\n3 atom types\n")
    with pytest.raises(ValueError, match="has no Atoms section"):
        structures.read_data_header(tmp_path / "c.data")


def test_element_masses():
    assert structures.element_masses(["Ar", "Ne"], needed=True) == pytest.approx([39.948, 20.1797])
    assert structures.element_masses(["Xx"], needed=False) == [1.0]
    with pytest.raises(ValueError, match="no mass for element Xx"):
        structures.element_masses(["Xx"], needed=True)


def test_strategy_for():
    """validate asks the plugin's own rule (contract.resolve_strategy)."""
    lj = LennardJones(elements=["Ar"], epsilon={"Ar": 0.01}, sigma={"Ar": 3.4}, cutoff=8.0)
    assert judge.strategy_for(lj, "shell").name == "local"
    mp = _message_passing()
    assert [judge.strategy_for(mp, s).name for s in ("auto", "exchange", "shell")] == [
        "exchange",
        "exchange",
        "shell",
    ]
    assert judge.strategy_for(mp, "exchange").ghost_cutoff == CUTOFF
    assert judge.strategy_for(mp, "shell").ghost_cutoff == 2 * CUTOFF
    mp.spec = dataclasses.replace(mp.spec, strategies=("exchange",))
    message = "the message_passing model does not support strategy shell (it supports: exchange)"
    with pytest.raises(judge.UsageError, match=re.escape(message)):
        judge.strategy_for(mp, "shell")


LOG = """\
Neighbor list info ...
  update: every = 1 steps, delay = 0 steps, check = yes
  master list distance cutoff = 12
  ghost atom cutoff = 12
"""


def test_read_log(tmp_path):
    """The ghost cutoff comes from LAMMPS's log, the strategy from the plugin's reports."""
    mp = _message_passing()
    for pid, asked in ((11, "shell"), (12, "shell")):
        report = resolve_strategy(mp.spec, asked, mp.name).to_dict()
        (tmp_path / f"strategy-{pid}.json").write_text(json.dumps(report))
    assert lammps_run.read_log(LOG, tmp_path) == lammps_run.LogFacts(
        ghost_cutoff=12.0, strategy="shell"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert lammps_run.read_log("nothing", empty) == lammps_run.LogFacts(
        ghost_cutoff=None, strategy="none"
    )


def test_measure_reach():
    """The probe sees a local model stay inside its cutoff, a two-layer one reach past one
    cutoff but not past two, and an underdeclared one reach past what it declares."""
    positions, cell, species = _structure()
    lj = LennardJones(
        elements=ELEMENTS,
        epsilon={"Ar": 0.01, "Ne": 0.003},
        sigma={"Ar": 3.4, "Ne": 2.7},
        cutoff=6.5,
    )
    reach = {}
    for name, potential in (("lj", lj), ("mp", _message_passing()), ("bad", _underdeclared())):
        ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
        atom, reach[name] = probe.measure_reach(potential, positions, cell, species, ref)
        assert atom == 0
    assert 0.8 * 6.5 < reach["lj"] < 6.5
    assert CUTOFF < reach["mp"] < 2 * CUTOFF
    assert reach["bad"] == reach["mp"] > _underdeclared().spec.interaction_range


def test_advice_for_an_underdeclared_model():
    facts = {1: lammps_run.LogFacts(7.0, "local"), 2: lammps_run.LogFacts(7.0, "local")}
    failing = [judge.Row(1, "forces [eV/A]", 0.03, 0.5, 17)]
    problems = judge.advice(
        _underdeclared(), judge.strategy_for(_underdeclared(), "auto"), 9.32, failing, facts, 1e-10
    )
    assert problems == [UNDERDECLARED_ADVICE.format(reach="9.32")]


def test_advice_for_a_two_layer_model_declaring_fewer():
    """Declared 2, reaches 3 cutoffs: more layers, or the shell strategy with a wider
    ghost shell."""
    model = UnderdeclaredMessagePassing(ELEMENTS, cutoff=CUTOFF, layers=3, declared_layers=2)
    facts = {1: lammps_run.LogFacts(12.0, "shell")}
    (problem,) = judge.advice(model, judge.strategy_for(model, "shell"), 13.1, [], facts, 1e-10)
    assert "declare layers=3 (or more) in its spec (ModelSpec.layers)" in problem
    assert problem.endswith(
        "or run it with strategy shell and comm_modify cutoff 17 (layers x cutoff + the "
        "neighbor skin)"
    )


def test_advice_for_lammps_settings():
    mp = _message_passing()
    facts = {
        1: lammps_run.LogFacts(12.0, "shell"),
        2: lammps_run.LogFacts(9.0, "shell"),
        4: lammps_run.LogFacts(None, "exchange"),
    }
    problems = judge.advice(mp, judge.strategy_for(mp, "shell"), 8.0, [], facts, 1e-10)
    assert problems == [
        (
            "on 2 rank(s) LAMMPS's ghost atom cutoff is 9 A, not beyond the 10 A that strategy "
            "shell needs: add comm_modify cutoff 12 to the input"
        ),
        (
            "on 4 rank(s) the pair style ran strategy exchange, where shell was expected from "
            "the model's spec: the installed plugin does not match this nvalchemi_lammps "
            "(reinstall the package)"
        ),
    ]
    failing = [judge.Row(2, "forces [eV/A]", 1e-3, 1e-2, 5)]
    (problem,) = judge.advice(mp, judge.strategy_for(mp, "exchange"), 8.0, failing, {}, 1e-10)
    assert problem.startswith(
        "with strategy exchange the numbers differ at 2 rank(s): the model's forward must call "
        "graph.comm.forward_exchange"
    )
    assert (
        judge.advice(
            mp,
            judge.strategy_for(mp, "exchange"),
            8.0,
            [],
            {2: lammps_run.LogFacts(7.0, "exchange")},
            1e-10,
        )
        == []
    )


def test_difference_names_the_worst_atom():
    ids = np.array([4, 7, 9])
    ref = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, -4.0]])
    got = ref.copy()
    got[1, 2] += 1e-6
    row = judge.difference(2, "forces", got, ref, ids)
    assert row == judge.Row(2, "forces", pytest.approx(1e-6), pytest.approx(2.5e-7), 7)
    got[2, 0] = np.nan
    row = judge.difference(2, "forces", got, ref, ids)
    assert row.worst_id == 9 and not row.within(1.0)


def test_usage_errors(model_files, tmp_path, capsys):
    lj = str(model_files["lj"])
    cases = [
        ([lj, "--lattice", "fcc:4:2", "--ranks", "0,2"], "--ranks takes positive rank counts"),
        ([lj, "--lattice", "hcp:4:2"], "lattice kind must be one of sc, bcc, fcc, diamond"),
        (
            [lj, "--lattice", "fcc:4:2", "--elements", "Ar", "Kr"],
            "--elements must name distinct elements of the model (Ar, Ne); got Ar Kr",
        ),
        ([str(tmp_path / "none.pt"), "--lattice", "fcc:4:2"], "none.pt not found"),
        ([lj, "--data", str(tmp_path / "none.data")], "none.data not found"),
        ([lj, "--lattice", "fcc:4:2", "--seed", "-1"], "--seed must be 0 or more, got -1"),
    ]
    for argv, message in cases:
        assert cli.main(argv + ["--workdir", str(tmp_path / "w")]) == 2
        out = capsys.readouterr().out
        assert "error: " in out and message in out, out


@pytest.mark.parametrize("tolerance", ["-1", "0", "nan", "inf"])
def test_tolerance_must_be_positive(model_files, tmp_path, capsys, tolerance):
    """Before: accepted, and a negative tolerance failed every comparison."""
    argv = [str(model_files["lj"]), "--lattice", "fcc:4:2", "--tolerance", tolerance]
    assert cli.main(argv + ["--workdir", str(tmp_path / "w")]) == 2
    message = f"error: --tolerance must be a number > 0, got {float(tolerance):g}\n"
    assert capsys.readouterr().out == message
    assert not (tmp_path / "w").exists()


def test_workdir_that_cannot_be_made(model_files, tmp_path, capsys):
    """A folder under a regular file (run as root here, so no permission bits would stop
    it): one line and exit code 2; before, a raw NotADirectoryError traceback."""
    workdir = tmp_path / "file" / "w"
    workdir.parent.write_text("")
    argv = [str(model_files["lj"]), "--lattice", "fcc:4:2", "--workdir", str(workdir)]
    assert cli.main(argv) == 2
    message = f"error: --workdir {workdir}: cannot make this folder: Not a directory\n"
    assert capsys.readouterr().out == message


# --- the command, through LAMMPS ---------------------------------------------------------------


def _validate(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().out


def _table(out: str) -> dict[tuple[int, str], tuple[float, str]]:
    """(ranks, quantity) -> (max rel, worst atom ID) of the report's tables."""
    rows = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\d+)  (.+?)\s+(\S+e[-+]\d+)\s+(\S+e[-+]\d+)\s+(\S+)", line)
        if match:
            rows[int(match[1]), match[2]] = (float(match[4]), match[5])
    return rows


@pytest.mark.lammps
def test_lennard_jones_passes_on_1_2_4_ranks_with_md(model_files, tmp_path, capsys):
    code, out = _validate(
        [model_files["lj"], "--lattice", "fcc:5.26:4", "--steps", "20", "--workdir", tmp_path],
        capsys,
    )
    assert code == 0, out
    assert "strictly local (1 layer): ghost shell of one cutoff (6.5 A)" in _flat(out)
    assert "PASS: every step-0 quantity within 1e-10 relative at 1, 2, 4 rank(s)" in out
    rows = _table(out)
    quantities = [
        "energy [eV]",
        "energy per atom [eV]",
        "forces [eV/A]",
        "virial pressure [bar]",
        "virial per atom [bar*A^3]",
    ]
    for ranks in (1, 2, 4):
        for quantity in quantities:
            assert rows[ranks, quantity][0] <= 1e-10, (ranks, quantity)
        for quantity in ("positions [A]", "velocities [A/ps]", "total energy [eV]"):
            assert (ranks, quantity) in rows or ranks == 1
    assert "after 20 NVE steps from the same velocities, against 1 rank(s)" in out
    for n in (1, 2, 4):
        assert (tmp_path / f"np{n}" / "log.lammps").is_file()


@pytest.mark.lammps
@pytest.mark.parametrize("strategy", ["exchange", "shell"])
def test_message_passing_passes_on_1_2_4_ranks(strategy, model_files, tmp_path, capsys):
    code, out = _validate(
        [model_files["mp"], "--lattice", LATTICE, "--strategy", strategy, "--workdir", tmp_path],
        capsys,
    )
    assert code == 0, out
    ghost = {"exchange": 7, "shell": 12}[strategy]  # + the neighbor skin of 2 A
    needed = {"exchange": 5, "shell": 10}[strategy]
    for n in (1, 2, 4):
        assert re.search(rf"^\s+{n}\s+{ghost} A\s+{needed} A  {strategy}$", out, re.MULTILINE), out
    assert "PASS: every step-0 quantity within 1e-10 relative at 1, 2, 4 rank(s)" in out


@pytest.mark.lammps
def test_underdeclared_layers_fail_with_what_to_change(model_files, tmp_path, capsys, monkeypatch):
    """The spec says one layer, the model runs two: the pair style builds a ghost shell of one
    cutoff and no exchange, every rank count is wrong, and validate says to declare 2."""
    path = importable_in_lammps(tmp_path / "site")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))
    )
    code, out = _validate(
        [model_files["underdeclared"], "--lattice", LATTICE, "--ranks", "1,2"], capsys
    )
    assert code == 1, out
    reach = re.search(r"changes the energies of atoms up to (\S+) A away", _flat(out))[1]
    assert CUTOFF < float(reach) <= 2 * CUTOFF
    assert f"PROBLEM: {UNDERDECLARED_ADVICE.format(reach=reach)}" in _flat(out)
    rows = _table(out)
    for n in (1, 2):
        assert rows[n, "forces [eV/A]"][0] > 1e-3
        assert rows[n, "energy [eV]"][0] > 1e-3
    assert re.search(r"^FAIL: largest step-0 difference \S+ relative", out, re.MULTILINE)


@pytest.mark.lammps
def test_data_file_with_shuffled_ids_and_a_skewed_box(model_files, tmp_path, capsys):
    """Atom IDs out of order, the box away from the origin and tilted, atoms outside it, the
    types in the other order than the model's elements, no Masses: compared by ID."""
    positions, cubic, species = _structure(seed=7)
    cell = cubic @ np.array([[1.0, 0.0, 0.0], [0.1, 1.0, 0.0], [-0.15, 0.05, 1.0]])
    positions = positions @ np.linalg.inv(cubic) @ cell
    positions[::7] += cell[0]  # outside the box: LAMMPS wraps them
    rng = np.random.default_rng(8)
    ids = rng.permutation(len(positions)) + 100
    origin = np.array([-3.0, 1.5, 2.0])
    (lx, _, _), (xy, ly, _), (xz, yz, lz) = (map(float, row) for row in cell)
    origin_x, origin_y, origin_z = (float(v) for v in origin)
    types = np.where(species == 0, 2, 1)  # type 1 = Ne, type 2 = Ar
    lines = [
        "shuffled",
        "",
        f"{len(positions)} atoms",
        "2 atom types",
        f"{origin_x!r} {origin_x + lx!r} xlo xhi",
        f"{origin_y!r} {origin_y + ly!r} ylo yhi",
        f"{origin_z!r} {origin_z + lz!r} zlo zhi",
        f"{xy!r} {xz!r} {yz!r} xy xz yz",
        "",
        "Atoms # atomic",
        "",
    ] + [
        f"{i} {t} {float(x)!r} {float(y)!r} {float(z)!r}"
        for i, t, (x, y, z) in zip(ids, types, positions + origin, strict=True)
    ]
    data = tmp_path / "shuffled.data"
    data.write_text("\n".join(lines) + "\n")
    code, out = _validate(
        [
            model_files["mp"],
            "--data",
            data,
            "--elements",
            "Ne",
            "Ar",
            "--ranks",
            "1,2",
            "--strategy",
            "shell",
            "--steps",
            "5",
        ],
        capsys,
    )
    assert code == 0, out
    assert f"system {data} (types 1=Ne, 2=Ar)" in _flat(out)
    rows = _table(out)
    worst_ids = {int(rows[2, q][1]) for q in ("forces [eV/A]", "energy per atom [eV]")}
    assert worst_ids <= set(ids.tolist())
    assert "PASS: every step-0 quantity within 1e-10 relative at 1, 2 rank(s)" in out


@pytest.mark.lammps
def test_a_failing_lammps_run_is_reported(model_files, tmp_path, capsys):
    code, out = _validate(
        [
            model_files["lj"],
            "--lattice",
            "fcc:5.26:2",
            "--ranks",
            "1",
            "--device",
            "gpu",
            "--workdir",
            tmp_path,
        ],
        capsys,
    )
    assert code == 1
    assert "device must be cpu, cuda or cuda:N; got 'gpu'" in out
    assert f"error: LAMMPS failed on 1 rank(s); its input and log are in {tmp_path / 'np1'}" in out
