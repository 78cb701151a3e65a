"""The step record: what the pair style (cpp_bridge/python_bridge.cpp, ``PythonSession::
compute``) hands :meth:`PluginSession.compute <nvalchemi_lammps.frontends.plugin.
PluginSession.compute>` for one step on one rank, field by field, by name.

Arrays are writable memoryviews over buffers the pair style owns, sized in the record (no
size is inferred from a byte count). The fields and their meaning are versioned by
:data:`STEP_PROTOCOL`: the pair style refuses, at load, a Python side of another protocol
(a plugin and a package of different versions), rather than misreading a step.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bumped with every change of the record's fields or of what ``compute`` (or another call
#: of the pair style's, such as ``compile_status``) returns; the same number is compiled into
#: the pair style (``STEP_PROTOCOL`` in python_bridge.cpp).
STEP_PROTOCOL = 5


@dataclass(frozen=True)
class StepRecord:
    """One step on one rank. Atoms are rows as LAMMPS stores them (owned, then ghosts).

    :param nlocal: owned atoms
    :param ntotal: owned and ghost atoms
    :param positions: ``3 * ntotal`` float64, every step
    :param species: ``ntotal`` int64 model element indices, when LAMMPS rebuilt its list
        (on the host: every step), else ``None``: the session keeps the last
    :param owner: the exchange plan (strategy exchange, with ``species``), else ``None``:
        ``ntotal`` int64, the row of [owned rows, ``nrecv`` rows received] each row copies
    :param send_rows: ``nsend`` int64, the owned rows other ranks receive
    :param nsend: rows sent
    :param nrecv: rows received
    :param remote: more than one rank, so transfers happen
    :param npairs: pairs given with ``species``: with ``filtered`` those within the cutoff
        (``rij`` filled), else the neighbor list's candidates, which the session keeps,
        filters and builds ``rij`` for each step
    :param filtered: see ``npairs``
    :param capacity: pair slots in ``pair_i``, ``pair_j`` (int64), ``rij`` and
        ``pair_forces`` (3 float64 each); pairs may come back in them
    :param want_pairs: per-pair forces wanted back (per-atom virial) even when per-atom
        forces are cheaper
    :param half_pairs: the pairs are a half neighbor list (each pair once, LAMMPS's newton
        rule), asked for because the session's :attr:`~nvalchemi_lammps.frontends.plugin.
        PluginSession.half_pairs` said so
    :param want_atom_energies: per-atom energies wanted (``compute pe/atom``); else
        ``atom_energies`` may be left unwritten
    :param pair_scalars: ``capacity`` float64 slots for one scalar ``s`` per pair, which
        the pair style takes instead of ``pair_forces`` as ``fij = s * rij`` (a pair
        potential's closed form), else ``None``: the pair style takes vectors only
    :param atom_energies: ``ntotal`` float64 slots; written: the ``nlocal`` owned rows, or
        with ``half_pairs`` every row (ghost rows go to their owners by LAMMPS's reverse
        communication, as for ``lj/cut``)
    :param atom_forces: ``3 * ntotal`` float64, ``-dE/dx`` of every row, when written
    :param collectives: the step's collectives (valid during the call only)
    :param charges: ``ntotal`` float64 per-atom charges, for a model that
        ``needs_positions`` and a LAMMPS with charges, else ``None``
    :param cell: 9 float64, lattice vectors as rows (``needs_positions``), else ``None``
    :param periodic: periodicity of each lattice direction (``needs_positions``)
    :param tags: ``ntotal`` atom IDs (LAMMPS's ``tagint``, ``tag_bytes`` each), read only
        to name atoms in a report
    :param tag_bytes: the size of one atom ID, 4 or 8
    :param timestep: LAMMPS's step, for reports
    :param virial: 6 float64 written, xx yy zz xy xz yz, the part ``sum x . f`` misses
        (``needs_positions``), else ``None``
    """

    nlocal: int
    ntotal: int
    positions: memoryview
    species: memoryview | None
    owner: memoryview | None
    send_rows: memoryview | None
    nsend: int
    nrecv: int
    remote: bool
    npairs: int
    filtered: bool
    capacity: int
    pair_i: memoryview
    pair_j: memoryview
    rij: memoryview
    pair_forces: memoryview
    want_pairs: bool
    atom_energies: memoryview
    atom_forces: memoryview
    collectives: object
    tags: memoryview
    tag_bytes: int
    timestep: int
    charges: memoryview | None = None
    cell: memoryview | None = None
    periodic: tuple[bool, bool, bool] | None = None
    virial: memoryview | None = None
    pair_scalars: memoryview | None = None
    half_pairs: bool = False
    want_atom_energies: bool = True


@dataclass(frozen=True)
class StepResult:
    """What ``compute`` returns to the pair style.

    :param energy: this rank's energy, NaN when any energy, force or position is not
        finite (``nonfinite`` then says which atoms, and the pair style stops with it)
    :param npairs: pairs written back into the slots (``pair_i``, ``pair_j``, ``rij``,
        ``pair_forces``), or 0
    :param atom_forces_written: ``atom_forces`` holds the forces
    :param pair_scalars_written: the pairs' forces came back as ``pair_scalars`` (``fij =
        s * rij``), not in ``pair_forces``
    :param nonfinite: with a NaN ``energy``, the report naming the atoms and the step
        (:func:`~._write_back.nonfinite_report`); else empty
    """

    energy: float
    npairs: int
    atom_forces_written: bool
    pair_scalars_written: bool = False
    nonfinite: str = ""
