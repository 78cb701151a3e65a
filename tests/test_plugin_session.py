"""``frontends.plugin``, driven exactly as cpp_bridge/python_bridge.cpp drives it.

The C++ side hands every array as a writable, byte-format memoryview over memory it owns
(``PyMemoryView_FromMemory(ptr, nbytes, PyBUF_WRITE)``; a zero-byte view for an empty
array) and a collectives object. Here the memory is numpy arrays, viewed the same way.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from _systems import (
    RankCollectives,
    RankGraph,
    ThreadWorld,
    byte_view,
    decompose,
    decompose_shell,
    fcc_argon_222,
    gather,
    host_step,
    lennard_jones,
    triclinic_ar_ne,
)

from nvalchemi_lammps import MessagePassing, ModelFileError, save_model
from nvalchemi_lammps.frontends.plugin import PluginSession, open_session
from nvalchemi_lammps.reference import evaluate_reference


def _solo(graph: RankGraph) -> RankCollectives:
    """Collectives of a one-rank run."""
    return ThreadWorld([graph], graph.ntotal).collectives(0)


def _bare(nlocal: int, species: np.ndarray, pair_i, pair_j, rij) -> RankGraph:
    """A one-rank graph whose ghost rows are copies of nobody (unused by local models)."""
    return RankGraph(nlocal, species, pair_i, pair_j, rij, np.arange(len(species)))


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The session sets torch's thread count for the whole process: put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model_path(tmp_path):
    system = fcc_argon_222()
    return str(save_model(lennard_jones(system), tmp_path / "ar_ne.pt"))


def _call_compute(session: PluginSession, nlocal, species, pair_i, pair_j, rij, comm):
    """One step of the host path (:func:`_systems.host_step`)."""
    step = host_step(nlocal, species, pair_i, pair_j, rij, comm)
    result = session.compute(step.record)
    assert result.npairs == len(pair_i) and not result.atom_forces_written
    return result.energy, step.atom_energies, step.pair_forces


def test_session_describes_the_model(model_path):
    session = open_session(model_path, 1)
    assert isinstance(session, PluginSession)
    assert session.cutoff == 8.5 and isinstance(session.cutoff, float)
    assert session.units == "metal"
    assert session.layers == 1
    assert session.describe().startswith(
        "lennard_jones model: elements Ar Ne, cutoff 8.5, units metal, float64, on cpu, opened in "
    )
    assert re.search(r", opened in \d+\.\d\d s, BLAS of ", session.describe())
    assert torch.get_num_threads() == 1


def test_session_maps_types(model_path):
    session = open_session(model_path, 1)
    assert session.map_types(["Ne", "NULL", "Ar", "Ar"]) == [1, -1, 0, 0]
    with pytest.raises(ValueError, match=re.escape("element Xx not in model (Ar, Ne)")):
        session.map_types(["Ar", "Xx"])


def test_missing_model_file(tmp_path):
    path = tmp_path / "missing.pt"
    with pytest.raises(ModelFileError, match=re.escape(f"model file {path} not found")):
        open_session(str(path), 1)


def test_a_pair_style_made_again_takes_the_same_model(tmp_path, model_path):
    """A pair style made again on the same unchanged file (a script's second pair_style, the
    benchmark's turns) takes the potential already loaded, and what torch compiled for it;
    a file rewritten in between is read anew, and only the last file opened is kept."""
    first = open_session(model_path, 1).potential
    assert open_session(model_path, 1).potential is first
    other = str(save_model(lennard_jones(fcc_argon_222(), cutoff=6.0), tmp_path / "other.pt"))
    assert open_session(other, 1).cutoff == 6.0
    again = open_session(model_path, 1)
    assert again.potential is not first and again.cutoff == 8.5
    save_model(lennard_jones(fcc_argon_222(), cutoff=7.0), model_path)  # rewritten in place
    assert open_session(model_path, 1).cutoff == 7.0


def _run_world(session_of, system, graphs):
    """Every rank's ``compute`` in its own thread, as ``mpirun -np len(graphs)`` would."""
    world = ThreadWorld(graphs, system.natoms)

    def work(rank):
        g = graphs[rank]
        return _call_compute(
            session_of(rank),
            g.nlocal,
            g.species,
            g.pair_i,
            g.pair_j,
            g.rij,
            world.collectives(rank),
        )

    results = world.run(work)
    for energy, e, f in results:
        assert isinstance(energy, float)
        assert not np.isnan(e).any() and not np.isnan(f).any()
        assert energy == pytest.approx(e.sum(), rel=1e-13, abs=1e-300)
    gathered = gather(system, graphs, [r[1] for r in results], [r[2] for r in results])
    return world, gathered, sum(r[0] for r in results)


def _assert_matches(got, total, ref):
    assert total == pytest.approx(ref.energy, rel=1e-12)
    for name in ("atom_energies", "forces", "virial", "atom_virials"):
        expected = getattr(ref, name)
        np.testing.assert_allclose(
            getattr(got, name), expected, rtol=0, atol=1e-12 * np.abs(expected).max(), err_msg=name
        )


@pytest.mark.parametrize("nranks", [1, 2, 3], ids=["np1", "np2", "np3"])
def test_compute_matches_reference(model_path, nranks):
    system = fcc_argon_222()
    sessions = [open_session(model_path, 1) for _ in range(nranks)]
    potential = sessions[0].potential
    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    graphs = decompose(system, potential.spec.cutoff, nranks)
    world, got, total = _run_world(sessions.__getitem__, system, graphs)
    _assert_matches(got, total, ref)
    assert world.calls == [[] for _ in graphs]  # a local model needs no communication


@pytest.mark.parametrize(
    ("nranks", "nslabs"),
    [(1, None), (2, None), (3, None), (3, 2)],
    ids=["np1", "np2", "np3", "np3-one-empty"],
)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_message_passing_exchange_matches_reference(tmp_path, nranks, nslabs, dtype):
    """Three layers, a ghost shell of one cutoff: ghost features come from their owners
    through forward_exchange after each layer, and their gradients go back through
    reverse_exchange; the result is the single-process one."""
    system = fcc_argon_222()
    model = MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=8, dtype=dtype)
    path = str(save_model(model, tmp_path / "mp.pt"))
    sessions = [open_session(path, 1) for _ in range(nranks)]
    assert all(s.layers == 3 and s.uses_exchange for s in sessions)
    ref = evaluate_reference(
        MessagePassing(["Ar", "Ne"], cutoff=5.0, layers=3, features=8),
        system.positions,
        system.cell,
        system.pbc,
        system.species,
    )
    graphs = decompose(system, 5.0, nranks, nslabs)
    world, got, total = _run_world(sessions.__getitem__, system, graphs)
    if dtype == "float64":
        _assert_matches(got, total, ref)
    else:
        assert total == pytest.approx(ref.energy, rel=1e-5)
        np.testing.assert_allclose(
            got.forces, ref.forces, rtol=0, atol=1e-4 * np.abs(ref.forces).max()
        )
    # same collective sequence on every rank, the empty one included
    assert all(calls == world.calls[0] for calls in world.calls)
    assert world.calls[0].count("forward_exchange") == 2
    assert world.calls[0].count("reverse_exchange") == 2


@pytest.mark.parametrize(
    ("nranks", "nslabs"), [(1, None), (2, None), (3, 2)], ids=["np1", "np2", "np3-one-empty"]
)
def test_message_passing_shell_matches_reference(tmp_path, nranks, nslabs):
    """Widened shell: ghosts ``layers`` cutoffs deep with their own pairs, no exchange."""
    system = fcc_argon_222()
    model = MessagePassing(["Ar", "Ne"], cutoff=4.0, layers=2, features=8)
    path = str(save_model(model, tmp_path / "mp.pt"))
    sessions = [open_session(path, 1) for _ in range(nranks)]
    for session in sessions:
        session.set_strategy("shell")
    ref = evaluate_reference(model, system.positions, system.cell, system.pbc, system.species)
    graphs = decompose_shell(system, 4.0, 2, nranks, nslabs)
    assert any(np.any(g.pair_i >= g.nlocal) for g in graphs)  # ghosts receive too
    world, got, total = _run_world(sessions.__getitem__, system, graphs)
    _assert_matches(got, total, ref)
    assert world.calls == [[] for _ in graphs]
    # the same graphs with a one-cutoff view of the ghosts' own features would be wrong:
    # drop the ghost receivers and the owned energies change
    g = graphs[0]
    keep = g.pair_i < g.nlocal
    _, short, _ = _call_compute(
        sessions[0], g.nlocal, g.species, g.pair_i[keep], g.pair_j[keep], g.rij[keep], _solo(g)
    )
    _, full, _ = _call_compute(
        sessions[0], g.nlocal, g.species, g.pair_i, g.pair_j, g.rij, _solo(g)
    )
    assert np.abs(short - full).max() > 1e-6 * np.abs(full).max()


def test_set_strategy(tmp_path, model_path):
    local = open_session(model_path, 1)
    for strategy in ("auto", "exchange", "shell"):
        local.set_strategy(strategy)
        assert local.strategy == "local" and not local.uses_exchange
    path = save_model(MessagePassing(["Ar"], cutoff=4.0, layers=2), tmp_path / "mp.pt")
    session = open_session(str(path), 1)
    assert session.strategy == "exchange" and session.uses_exchange  # auto: first supported
    session.set_strategy("shell")
    assert session.strategy == "shell" and not session.uses_exchange
    session.set_strategy("exchange")
    assert session.uses_exchange
    message = (
        "the message_passing model does not support strategy bogus (it supports: exchange, shell)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        session.set_strategy("bogus")


def test_inputs_are_left_untouched(model_path):
    system = triclinic_ar_ne()
    session = open_session(model_path, 1)
    g = decompose(system, session.cutoff, 2)[0]
    arrays = [np.ascontiguousarray(a).copy() for a in (g.species, g.pair_i, g.pair_j, g.rij)]
    _call_compute(session, g.nlocal, *arrays, _solo(g))
    for before, after in zip((g.species, g.pair_i, g.pair_j, g.rij), arrays):
        assert np.array_equal(before, after)


@pytest.mark.parametrize(
    ("nlocal", "nghost"),
    [(0, 0), (0, 5), (3, 0), (2, 4)],
    ids=["nothing", "ghosts-only", "owned-only", "owned-and-ghosts"],
)
def test_compute_without_pairs(model_path, nlocal, nghost):
    """A rank with no pairs (or no atoms at all) takes the same path with zero-byte views."""
    session = open_session(model_path, 1)
    species = np.zeros(nlocal + nghost, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    graph = _bare(nlocal, species, none, none, np.zeros((0, 3)))
    energy, energies, forces = _call_compute(
        session, nlocal, species, none, none, graph.rij, _solo(graph)
    )
    assert energy == 0.0
    assert energies.shape == (nlocal,) and np.all(energies == 0.0)
    assert forces.shape == (0, 3)


def test_float32_model_writes_float64(tmp_path):
    system = triclinic_ar_ne()
    path = save_model(lennard_jones(system, dtype="float32"), tmp_path / "f32.pt")
    session = open_session(str(path), 2)
    assert torch.get_num_threads() == 2
    ref = evaluate_reference(
        lennard_jones(system), system.positions, system.cell, system.pbc, system.species
    )
    p = ref.pairs
    graph = _bare(system.natoms, system.species, p.pair_i, p.pair_j, p.rij)
    energy, _energies, forces = _call_compute(
        session, system.natoms, system.species, p.pair_i, p.pair_j, p.rij, _solo(graph)
    )
    assert energy == pytest.approx(ref.energy, rel=1e-5)
    np.testing.assert_allclose(
        forces, ref.pair_forces, rtol=0, atol=1e-5 * np.abs(ref.pair_forces).max()
    )
    assert not np.array_equal(forces, ref.pair_forces)


def test_non_finite_positions_raise(model_path):
    """The C++ side turns this exception into ``error->one`` with its text."""
    session = open_session(model_path, 1)
    rij = np.array([[1.0, 0.0, 0.0], [np.nan, 0.0, 0.0]])
    message = "non-finite pair vector between atoms 1 and 0 (NaN or infinite positions)"
    with pytest.raises(ValueError, match=re.escape(message)):
        graph = _bare(2, np.zeros(2, np.int64), np.array([0, 1]), np.array([1, 0]), rij)
        _call_compute(session, 2, graph.species, graph.pair_i, graph.pair_j, rij, _solo(graph))


@pytest.mark.parametrize("want_atom_energies", [True, False], ids=["eatom", "no-eatom"])
def test_pair_scalars_come_back_in_their_slots(model_path, want_atom_energies):
    """Given scalar slots (the pair style's ``pair_scalars``), a closed-form potential
    writes ``s`` with ``fij = s * rij`` there and says so; ``pair_forces`` stay unwritten.
    Without per-atom energies wanted, they stay unwritten too and the energy is the same."""
    system = fcc_argon_222()
    g = decompose(system, 6.0, 1)[0]
    vectors = host_step(g.nlocal, g.species, g.pair_i, g.pair_j, g.rij, _solo(g))
    expected = open_session(model_path, 1).compute(vectors.record)
    step = host_step(g.nlocal, g.species, g.pair_i, g.pair_j, g.rij, _solo(g))
    scalars = np.full(len(g.pair_i), np.nan)
    record = dataclasses.replace(
        step.record, pair_scalars=byte_view(scalars), want_atom_energies=want_atom_energies
    )
    result = open_session(model_path, 1).compute(record)
    assert result.pair_scalars_written and not expected.pair_scalars_written
    assert result.npairs == len(g.pair_i)
    np.testing.assert_array_equal(scalars[:, None] * g.rij, vectors.pair_forces)
    assert np.isnan(step.pair_forces).all()
    assert result.energy == pytest.approx(expected.energy, rel=1e-14)
    assert np.isnan(step.atom_energies).all() != want_atom_energies


def test_cutoff_filter_in_chunks_is_bit_identical(monkeypatch):
    """Past FILTER_CHUNK candidates the filter runs chunk by chunk (bounded memory at
    millions of atoms) and builds rij for the kept pairs only: the same pairs, in the same
    order, and the same bits as one pass."""
    from nvalchemi_lammps.frontends import plugin

    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.uniform(0.0, 12.0, size=(300, 3)))
    pair_i = torch.from_numpy(rng.integers(0, 300, size=5000)).to(torch.int32)
    pair_j = torch.from_numpy(rng.integers(0, 300, size=5000)).to(torch.int32)
    whole = plugin._within_cutoff(x, pair_i, pair_j, 5.0)
    monkeypatch.setattr(plugin, "FILTER_CHUNK", 777)
    chunked = plugin._within_cutoff(x, pair_i, pair_j, 5.0)
    assert 0 < whole[0].shape[0] < pair_i.shape[0]
    for a, b in zip(whole, chunked, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
