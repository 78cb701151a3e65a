"""The Python side of ``pair_style nvalchemi/kk`` (``frontends/kokkos.py``) without LAMMPS:
arrays laid out as the pair style hands them over (DLPack capsules: positions, atom IDs,
each atom's element, the pairs within the cutoff and their ``rij``, LAMMPS's force and
per-atom arrays), one rank whose ghosts are periodic images, and collectives that fold
ghosts as LAMMPS's communication does. Forces, per-atom energies and per-atom virials,
added in place into the arrays, against the single-process reference, to 1e-10 relative.
The same code runs on a GPU, where the capsules are CUDA's. The pair style's own kernels
(the pairs from KOKKOS's neighbor list, NULL types left out) run in
tests/test_lammps_kokkos_plugin.py, in a KOKKOS LAMMPS.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
import torch
from _systems import decompose, fcc_argon_222, lennard_jones, triclinic_ar_ne
from lammps_helpers import assert_all_close
from torch.utils.dlpack import to_dlpack

from nvalchemi_lammps import MessagePassing, save_model
from nvalchemi_lammps.frontends.kokkos import (
    KokkosStepRecord,
    check_device,
    compute,
    finish,
)
from nvalchemi_lammps.frontends.session import Session
from nvalchemi_lammps.reference import evaluate_reference


class OneRank:
    """KOKKOS's collectives on one rank: a ghost row is an image of ``source[row]``."""

    def __init__(self, source: np.ndarray, nlocal: int) -> None:
        self.source, self.nlocal = source, nlocal
        self.calls: list[str] = []

    def _rows(self, address: int, nrows: int, width: int) -> np.ndarray:
        buffer = (ctypes.c_double * (nrows * width)).from_address(address)
        return np.frombuffer(buffer, dtype=np.float64).reshape(nrows, width)

    def forward_exchange(self, address: int, nrows: int, width: int) -> None:
        self.calls.append("forward")
        rows = self._rows(address, nrows, width)
        rows[self.nlocal :] = rows[self.source[self.nlocal :]]

    def reverse_exchange(self, address: int, nrows: int, width: int) -> None:
        self.calls.append("reverse")
        rows = self._rows(address, nrows, width)
        np.add.at(rows, self.source[self.nlocal :], rows[self.nlocal :])
        rows[self.nlocal :] = 0.0

    def allreduce(self, values: memoryview) -> None:
        self.calls.append("allreduce")


def _rank_arrays(system, cutoff: float):
    """One rank's rows (owned, then periodic images), its pairs within ``cutoff`` and the
    rows' positions."""
    (graph,) = decompose(system, cutoff, 1)
    positions = np.zeros((graph.ntotal, 3))
    positions[: graph.nlocal] = system.positions[graph.owner[: graph.nlocal]]
    positions[graph.pair_j] = positions[graph.pair_i] + graph.rij
    return graph, positions


def _step(graph, positions, collectives, cell, owners=None, read_later=False, timestep=0):
    arrays = {
        "positions": torch.from_numpy(positions.copy()),
        "tags": torch.from_numpy(graph.owner.astype(np.int32) + 1),
        "species": torch.from_numpy(graph.species.astype(np.int64)),
        "pair_i": torch.from_numpy(graph.pair_i.astype(np.int64)),
        "pair_j": torch.from_numpy(graph.pair_j.astype(np.int64)),
        "rij": torch.from_numpy(graph.rij.copy()),
        "forces": torch.zeros((graph.ntotal, 3), dtype=torch.float64),
        "atom_energies": torch.zeros(graph.nlocal, dtype=torch.float64),
        "atom_virials": torch.zeros((graph.ntotal, 6), dtype=torch.float64),
    }
    record = KokkosStepRecord(
        nlocal=graph.nlocal,
        ntotal=graph.ntotal,
        **{name: to_dlpack(t) for name, t in arrays.items()},
        pair_virial=not read_later,
        global_virial=not read_later,
        read_later=read_later,
        timestep=timestep,
        sink=-1,
        charges=None,
        cell=tuple(float(v) for v in cell.reshape(-1)),
        periodic=(True, True, True),
        collectives=collectives,
        one_rank=True,
        owners=None if owners is None else to_dlpack(torch.from_numpy(owners)),
        send_rows=None,
        nrecv=0,
    )
    return record, arrays


CASES = {
    "lj": (fcc_argon_222, lambda s: lennard_jones(s, cutoff=6.0), "local"),
    "mp-exchange": (
        triclinic_ar_ne,
        lambda s: MessagePassing(list(s.elements), cutoff=5.0, layers=3, features=8, seed=3),
        "exchange",
    ),
}


@pytest.mark.parametrize("exchange", ["gather", "comm"])
@pytest.mark.parametrize("case", CASES)
def test_one_rank_equals_reference(case, exchange, tmp_path):
    """Both ways of exchanging on one rank: by the owned rows the pair style hands over
    (``gather``, its default there), and through KOKKOS's communication (``comm``)."""
    make_system, make_potential, strategy = CASES[case]
    system = make_system()
    potential = make_potential(system)
    session = Session(str(save_model(potential, tmp_path / "model.pt")), 1)
    session.set_strategy(strategy)
    graph, positions = _rank_arrays(system, potential.spec.cutoff)
    collectives = OneRank(graph.owner, graph.nlocal)
    owned_row = np.empty(len(system.species), dtype=np.int64)  # atom -> its owned row
    owned_row[graph.owner[: graph.nlocal]] = np.arange(graph.nlocal)
    owners = owned_row[graph.owner] if exchange == "gather" else None
    record, arrays = _step(graph, positions, collectives, system.cell, owners)

    result = compute(session, record)

    ref = evaluate_reference(potential, system.positions, system.cell, system.pbc, system.species)
    n = len(system.species)
    forces, virials = np.zeros((n, 3)), np.zeros((n, 6))
    np.add.at(forces, graph.owner, arrays["forces"].numpy())  # LAMMPS's reverse comm
    np.add.at(virials, graph.owner, arrays["atom_virials"].numpy())
    energies = np.zeros(n)
    energies[graph.owner[: graph.nlocal]] = arrays["atom_energies"].numpy()
    voigt = ref.virial[[0, 1, 2, 0, 0, 1], [0, 1, 2, 1, 2, 2]]
    assert_all_close(
        f"kokkos-frontend/{case}",
        {
            "energy": (np.array([result.energy]), np.array([ref.energy])),
            "energy_per_atom": (energies, ref.atom_energies),
            "force": (forces, ref.forces),
            "virial": (np.array(result.virial), voigt),
            "virial_per_atom": (virials, ref.atom_virials),
        },
    )
    through_comm = strategy == "exchange" and exchange == "comm"
    assert ("forward" in collectives.calls) == through_comm
    assert ("reverse" in collectives.calls) == through_comm


def test_a_model_elsewhere_than_the_kokkos_arrays_is_refused():
    """An explicit device keyword that is not where KOKKOS keeps the arrays stops the step
    with the way out (checked on device objects: no GPU needed)."""
    check_device(torch.device("cuda", 1), torch.device("cuda", 1))
    for model in (torch.device("cpu"), torch.device("cuda", 0)):
        with pytest.raises(ValueError, match=r"arrays are on cuda:1 .* give device cuda:1"):
            check_device(torch.device("cuda", 1), model)


def test_model_on_another_device_than_the_arrays_is_an_error(tmp_path):
    """LAMMPS's KOKKOS arrays in one memory, the model on another device (here a model
    said to be on CUDA, arrays on the host): the step stops, naming the keyword that fixes
    it, before anything is read or written."""
    system = fcc_argon_222()
    session = Session(str(save_model(lennard_jones(system, 6.0), tmp_path / "m.pt")), 1)
    session.device = torch.device("cuda", 0)  # where `device cuda` would have put it
    graph, positions = _rank_arrays(system, 6.0)
    record, arrays = _step(graph, positions, None, system.cell)
    message = "LAMMPS's KOKKOS arrays are on cpu but the model is on cuda:0: leave out the "
    with pytest.raises(ValueError, match=re.escape(message) + ".* give device cpu"):
        compute(session, record)
    assert not arrays["forces"].any()


def test_non_finite_position_is_named(tmp_path):
    """An owned atom at a NaN position (in LAMMPS it then drops out of every pair, the pairs
    here stay finite): the step stops naming the atom by ID. Before: it went on."""
    system = fcc_argon_222()
    session = Session(str(save_model(lennard_jones(system, 6.0), tmp_path / "m.pt")), 1)
    graph, positions = _rank_arrays(system, 6.0)
    positions[0] = np.nan
    record, _arrays = _step(graph, positions, OneRank(graph.owner, graph.nlocal), system.cell)
    message = f"atom {graph.owner[0] + 1} with a non-finite position (NaN or infinite"
    with pytest.raises(ValueError, match=re.escape(message)):
        compute(session, record)


def test_atoms_on_the_same_spot_are_named(tmp_path):
    """Atom 2 moved onto atom 1: the report all doors share names both by ID (before, door
    C said only that energies or forces were not finite on them)."""
    system = fcc_argon_222()
    system.positions[1] = system.positions[0]
    session = Session(str(save_model(lennard_jones(system, 6.0), tmp_path / "m.pt")), 1)
    graph, positions = _rank_arrays(system, 6.0)
    record, _arrays = _step(graph, positions, OneRank(graph.owner, graph.nlocal), system.cell)
    with pytest.raises(ValueError, match=r"atoms [12] and [12] are on the same spot \("):
        compute(session, record)


def test_a_step_read_later_stops_the_next(tmp_path):
    """A step LAMMPS reads nothing of (``read_later``: no energy, virial or output) is not
    read back at once: its forces are written, and its finiteness is read when the next step
    comes in. A finite one lets that step run; one that was not finite (an atom's NaN
    position) stops it before anything of it is written, naming the step and the atom."""
    system = fcc_argon_222()
    session = Session(str(save_model(lennard_jones(system, 6.0), tmp_path / "m.pt")), 1)
    graph, positions = _rank_arrays(system, 6.0)
    collectives = OneRank(graph.owner, graph.nlocal)

    record, arrays = _step(graph, positions, collectives, system.cell, read_later=True, timestep=4)
    assert compute(session, record).virial is None
    assert arrays["forces"].abs().sum() > 0
    record, arrays = _step(graph, positions, collectives, system.cell, timestep=5)
    assert np.isfinite(compute(session, record).energy)

    positions[0] = np.nan
    record, arrays = _step(graph, positions, collectives, system.cell, read_later=True, timestep=6)
    compute(session, record)  # left unread: no error yet
    record, arrays = _step(graph, positions, collectives, system.cell, timestep=7)
    message = (
        "returned non-finite energies or forces at step 6 (read at the next step: LAMMPS "
        f"read nothing of step 6); atom {graph.owner[0] + 1} with a non-finite position at step 7"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        compute(session, record)
    assert not arrays["forces"].any()
    assert session.unread is None  # read once: the run stops there

    # the run's end reads a step no step came after (fix halt, timer timeout)
    finish(session)  # nothing unread
    record, arrays = _step(graph, positions, collectives, system.cell, read_later=True, timestep=8)
    compute(session, record)
    message = "non-finite energies or forces at step 8 (read at the end of the run: LAMMPS"
    with pytest.raises(ValueError, match=re.escape(message)):
        finish(session)
    assert session.unread is None
