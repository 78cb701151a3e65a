"""A pipeline (Lennard-Jones + a 2-layer message-passing term + Ewald with fixed charges)
through ``pair_style nvalchemi`` on 1, 2 and 4 ranks, both strategies and compiled, against
the same pipeline on the whole periodic system without LAMMPS; exported from a TOML file.
The runs on one rank count are segments of one LAMMPS process, ``clear`` between them.

Per-atom stress is not compared: the reference's per-atom virial holds the pairwise part
only, and Ewald's reciprocal part has no per-atom split.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from _pipeline_terms import ELEMENTS, system, terms
from lammps_helpers import (
    NPROCS,
    PRESSURE,
    assert_matches_reference,
    print_results,
    run_segments,
)

from nvalchemi_lammps import Pipeline
from nvalchemi_lammps.cli import main as cli_main
from nvalchemi_lammps.lammps_run import read_dump, read_results, write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference

pytestmark = pytest.mark.lammps

MASSES = [39.948, 83.798]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> tuple[Path, Path, object, np.ndarray]:
    workdir = tmp_path_factory.mktemp("pipeline")
    positions, cell, species = system(cells=3, seed=5)
    data = write_lammps_data(workdir / "system.data", positions, cell, species + 1, MASSES)
    pipeline = Pipeline(terms())
    ref = evaluate_reference(pipeline, positions, cell, (True, True, True), species)
    # the model file comes from a TOML configuration, as a user would write it
    lj, mp, ew = (t.config() for t in pipeline.terms)
    toml = workdir / "pipeline.toml"
    toml.write_text(
        textwrap.dedent(
            f"""\
            potential = "pipeline"

            [[terms]]
            potential = "lennard_jones"
            elements = {lj["elements"]}
            cutoff = {lj["cutoff"]}
            epsilon = {{ Ar = {lj["epsilon"]["Ar"]}, Kr = {lj["epsilon"]["Kr"]} }}
            sigma = {{ Ar = {lj["sigma"]["Ar"]}, Kr = {lj["sigma"]["Kr"]} }}

            [[terms]]
            potential = "message_passing"
            elements = {mp["elements"]}
            cutoff = {mp["cutoff"]}
            layers = {mp["layers"]}
            features = {mp["features"]}
            seed = {mp["seed"]}

            [[terms]]
            potential = "ewald"
            elements = {ew["elements"]}
            cutoff = {ew["cutoff"]}
            alpha = {ew["alpha"]}
            kmax = {ew["kmax"]}
            charges = {{ Ar = 0.4, Kr = -0.4 }}
            """
        ).replace("'", '"')
    )
    model = workdir / "pipeline.pt"
    assert cli_main(["export", str(toml), "-o", str(model)]) == 0
    return data, model, ref, cell


EAGER = [("exchange", "exchange", "no"), ("shell", "shell", "no")]
COMPILED = ("compiled", "exchange", "yes")
#: The runs on each rank count: (name, strategy, compile); compiled at 4 ranks:
#: tests/test_lammps_compile.py (message passing and MACE)
RUNS = {1: [*EAGER, COMPILED], 2: [*EAGER, COMPILED], 4: EAGER}


def _evaluation(data: Path, model: Path, name: str, strategy: str, compile: str) -> str:
    return textwrap.dedent(
        f"""\
        units metal
        atom_style atomic
        atom_modify map array
        read_data {data}
        pair_style nvalchemi {model} strategy {strategy} compile {compile}
        pair_coeff * * {" ".join(ELEMENTS)}
        compute pe all pe/atom
        thermo_style custom step pe {" ".join(PRESSURE)}
        dump d all custom 1 {name}.dump id fx fy fz c_pe
        dump_modify d sort id format float "%.17g"
        run 0
        """
    ) + print_results("RESULT", {"pe": "pe", **{p: p for p in PRESSURE}})


@pytest.fixture(scope="module")
def runs(case, tmp_path_factory):
    """The :data:`RUNS` of one rank count in one LAMMPS process, ``clear`` between them (the
    ranks start and import torch once), made when a test first asks: ``runs(nprocs) ->
    {name: (dump, printed results, output)}``."""
    data, model, _, _ = case
    cache = {}

    def run(nprocs: int):
        if nprocs not in cache:
            workdir = tmp_path_factory.mktemp(f"np{nprocs}")
            scripts = {name: _evaluation(data, model, name, *how) for name, *how in RUNS[nprocs]}
            outputs = run_segments(scripts, nprocs, workdir, timeout=1200)
            cache[nprocs] = {
                name: (read_dump(workdir / f"{name}.dump"), read_results(output), output)
                for name, output in outputs.items()
            }
        return cache[nprocs]

    return run


@pytest.mark.parametrize("nprocs", NPROCS, ids=[f"np{n}" for n in NPROCS])
def test_pipeline_equals_reference(case, nprocs, runs):
    _, _, ref, cell = case
    for strategy in ("exchange", "shell"):
        atoms, glob, _ = runs(nprocs)[strategy]
        label = f"pipeline/{strategy}/np{nprocs}"
        assert_matches_reference(label, atoms, glob, ref, cell, stress=False)


@pytest.mark.parametrize("nprocs", [1, 2], ids=["np1", "np2"])
def test_compiled_pipeline_equals_reference(case, nprocs, runs):
    """``compile yes``: Lennard-Jones and the message-passing term compiled, each on its own
    padded graph, Ewald eager between them; the same numbers."""
    _, _, ref, cell = case
    atoms, glob, log = runs(nprocs)["compiled"]
    summary = "torch.compile (default): lennard_jones, message_passing; eager: ewald"
    assert summary in log, "the pair style did not say what it compiled"
    assert "2 graph(s) compiled during this run" in log
    label = f"pipeline/compiled/np{nprocs}"
    assert_matches_reference(label, atoms, glob, ref, cell, stress=False)
