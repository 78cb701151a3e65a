"""The single-process reference: a potential evaluated on a whole periodic system, no LAMMPS.

Every comparison in this project (tests, ``nvalchemi-lammps validate``) checks a LAMMPS run
against this module. It builds the full directed pair list of the periodic system with
vesin, hands it to :func:`~nvalchemi_lammps.engine.evaluate` as one graph whose atoms are
all owned (``nlocal == ntotal == N``, no ghosts), and turns the pair forces into what LAMMPS
reports: per-atom forces, the virial and the per-atom virial.

Conventions, the same as ``pair_style nvalchemi``:

- a pair ``k`` is directed, ``rij[k] = x[j] + S[k] @ cell - x[i]``; a periodic image of
  ``j`` (also of ``i`` itself, in a cell smaller than the cutoff) is its own pair with its
  own shift ``S[k]``;
- ``fij = +dE/drij``; the force on ``i`` gets ``+fij`` and the force on ``j`` gets ``-fij``;
- virial ``W = -sum_k rij[k] (x) fij[k]`` (energy units, LAMMPS's ``virial[]`` before any
  division by the volume), in LAMMPS's 6-vector order ``xx, yy, zz, xy, xz, yz``;
- per-atom virial: each pair's ``-rij (x) fij`` goes half to ``i`` and half to ``j``, as
  ``Pair::v_tally`` does with ``newton pair on``; the rows sum to ``W``.

LAMMPS's ``compute stress/atom`` reports ``-nktv2p * (W_atom + m v (x) v)`` per atom, in
pressure*volume units; with zero velocities, ``W_atom = -stress_atom / nktv2p``
(:data:`NKTV2P` holds ``nktv2p`` of the unit styles models may use).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import vesin

from ._elements import map_elements
from .contract import LocalGraph
from .engine import evaluate
from .potentials import Potential

if TYPE_CHECKING:  # ase is optional: only evaluate_atoms needs it
    import ase

#: LAMMPS's ``force->nktv2p`` (``update.cpp``): pressure unit per energy/volume unit.
NKTV2P = {"metal": 1.6021765e6, "real": 68568.415}

#: Order of the 6-vector components of a symmetric 3x3 tensor in LAMMPS.
VOIGT = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


def _voigt(tensors: np.ndarray) -> np.ndarray:
    """``(..., 3, 3)`` -> ``(..., 6)`` in LAMMPS order (upper triangle)."""
    return np.stack([tensors[..., a, b] for a, b in VOIGT], axis=-1)


@dataclass(frozen=True)
class PairList:
    """The full directed pair list of a periodic system.

    :param pair_i: ``(npairs,)`` int64 receiving atom
    :param pair_j: ``(npairs,)`` int64 sending atom (its image is ``shifts[k]`` cells away)
    :param shifts: ``(npairs, 3)`` int64 lattice shift of ``j``'s image
    :param rij: ``(npairs, 3)`` float64 ``x[j] + shifts @ cell - x[i]``
    """

    pair_i: np.ndarray
    pair_j: np.ndarray
    shifts: np.ndarray
    rij: np.ndarray


def neighbor_pairs(
    positions: np.ndarray,
    cell: np.ndarray,
    pbc: Sequence[bool],
    cutoff: float,
) -> PairList:
    """Every directed pair ``(i, j, image of j)`` closer than ``cutoff``, periodic images
    included, with vesin.

    Non-periodic directions are supported (vesin takes one flag per direction); the cell
    vector of a non-periodic direction may be zero.

    :param positions: ``(N, 3)`` float64 positions
    :param cell: ``(3, 3)`` lattice vectors as rows
    :param pbc: periodicity of each of the three lattice directions
    :param cutoff: pair cutoff (length)
    """
    positions = np.ascontiguousarray(positions, dtype=np.float64)
    cell = np.ascontiguousarray(cell, dtype=np.float64)
    periodic = [bool(p) for p in pbc]
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must have shape (N, 3), got {positions.shape}")
    if cell.shape != (3, 3):
        raise ValueError(f"cell must have shape (3, 3), got {cell.shape}")
    if len(periodic) != 3:
        raise ValueError(f"pbc must have 3 entries, got {len(periodic)}")
    calculator = vesin.NeighborList(cutoff=float(cutoff), full_list=True, sorted=True)
    i, j, shifts, rij = calculator.compute(positions, cell, periodic, quantities="ijSD")
    return PairList(
        pair_i=i.astype(np.int64),
        pair_j=j.astype(np.int64),
        shifts=shifts.astype(np.int64),
        rij=np.ascontiguousarray(rij, dtype=np.float64),
    )


@dataclass(frozen=True)
class ReferenceResult:
    """A potential on a whole periodic system, in LAMMPS's conventions (module docstring).

    :param energy: total potential energy
    :param atom_energies: ``(N,)`` per-atom energies (LAMMPS ``compute pe/atom``)
    :param forces: ``(N, 3)`` forces
    :param virial: ``(3, 3)`` virial ``W = -sum_k rij (x) fij`` (energy units)
    :param atom_virials: ``(N, 6)`` per-atom virial ``xx, yy, zz, xy, xz, yz`` (energy
        units); ``compute stress/atom`` gives ``-nktv2p`` times this without velocities
    :param pairs: the pair list the potential saw
    :param pair_forces: ``(npairs, 3)`` ``fij = +dE/drij`` of each pair
    """

    energy: float
    atom_energies: np.ndarray
    forces: np.ndarray
    virial: np.ndarray
    atom_virials: np.ndarray
    pairs: PairList
    pair_forces: np.ndarray

    @property
    def virial_voigt(self) -> np.ndarray:
        """The virial as LAMMPS's 6-vector ``xx, yy, zz, xy, xz, yz``."""
        return _voigt(self.virial)

    def pressure(
        self,
        volume: float,
        kinetic: np.ndarray | None = None,
        units: str | None = None,
    ) -> np.ndarray:
        """Pressure tensor ``(K + W) / V`` as LAMMPS's ``compute pressure`` forms it.

        :param volume: system volume (length unit cubed)
        :param kinetic: ``(3, 3)`` kinetic tensor ``sum_i m_i v_i (x) v_i`` in energy units
            (LAMMPS's ``mvv2e`` applied); left out: zero, the virial part alone
        :param units: ``metal`` or ``real`` to scale by LAMMPS's ``nktv2p`` (bar or atm);
            left out: energy per volume
        """
        if not volume > 0.0:
            raise ValueError(f"volume must be positive, got {volume}")
        tensor = self.virial.copy()
        if kinetic is not None:
            kinetic = np.asarray(kinetic, dtype=np.float64)
            if kinetic.shape != (3, 3):
                raise ValueError(f"kinetic tensor must have shape (3, 3), got {kinetic.shape}")
            tensor = tensor + kinetic
        scale = 1.0
        if units is not None:
            if units not in NKTV2P:
                raise ValueError(f"units must be one of {', '.join(NKTV2P)}; got '{units}'")
            scale = NKTV2P[units]
        return tensor * (scale / volume)


def evaluate_reference(
    potential: Potential,
    positions: np.ndarray,
    cell: np.ndarray,
    pbc: Sequence[bool],
    species: np.ndarray,
    charges: np.ndarray | None = None,
    total_charge: float = 0.0,
    spin: int | None = None,
    task: str | None = None,
) -> ReferenceResult:
    """Evaluate ``potential`` on the whole periodic system in one process.

    Atoms whose species is -1 (types mapped to ``NULL``) take part in no pair, as LAMMPS's
    pair style skips them; they keep zero energy and force.

    :param potential: any :class:`~nvalchemi_lammps.potentials.Potential` (float32 ones
        too: the engine casts the pair vectors and returns float64 pair forces)
    :param positions: ``(N, 3)`` positions (float64)
    :param cell: ``(3, 3)`` lattice vectors as rows
    :param pbc: periodicity of each lattice direction
    :param species: ``(N,)`` model element index of every atom, -1 for none
    :param charges: ``(N,)`` per-atom charges, for potentials that read them
    :param total_charge: net charge of the system, for potentials that predict charges
    :param spin: spin multiplicity, :param task: task name, for models that take them

    A potential whose spec ``needs_positions`` also gets positions, cell, periodicity and
    charges; its forces on atoms add to the forces, and its virial (``sum x f`` of those
    forces plus the cell part) to the virial. Per-atom virials hold the pairwise part only.
    """
    positions = np.asarray(positions, dtype=np.float64)
    species = np.asarray(species, dtype=np.int64)
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions must have shape (N, 3), got {positions.shape}")
    natoms = positions.shape[0]
    if species.shape != (natoms,):
        raise ValueError(f"species must have shape ({natoms},) like positions, got {species.shape}")
    nelements = len(potential.spec.elements)
    if species.size and (species.min() < -1 or species.max() >= nelements):
        raise ValueError(
            f"species must lie in [-1, {nelements}) for a model of {nelements} elements, "
            f"got values in [{species.min()}, {species.max()}]"
        )
    pairs = neighbor_pairs(positions, cell, pbc, potential.spec.cutoff)
    keep = (species[pairs.pair_i] >= 0) & (species[pairs.pair_j] >= 0)
    if not keep.all():
        pairs = PairList(*(getattr(pairs, f)[keep] for f in ("pair_i", "pair_j", "shifts", "rij")))

    system = {}
    if potential.spec.needs_positions:
        system = {
            "positions": torch.from_numpy(positions),
            "cell": torch.as_tensor(np.asarray(cell, dtype=np.float64)),
            "pbc": tuple(bool(p) for p in pbc),
            "charges": None if charges is None else torch.as_tensor(charges, dtype=torch.float64),
        }
    # the engine moves the inputs to the potential's device
    graph = LocalGraph(
        natoms,
        torch.from_numpy(species),
        torch.from_numpy(pairs.pair_i),
        torch.from_numpy(pairs.pair_j),
        torch.from_numpy(pairs.rij),
        total_charge=total_charge,
        spin=spin,
        task=task,
        **system,
    )
    result = evaluate(potential, graph)
    _ = result.finite  # a non-finite pair vector is named here, not summed on
    fij = result.pair_forces.detach().cpu().numpy().astype(np.float64, copy=False)
    atom_energies = result.atom_energies.detach().cpu().numpy().astype(np.float64, copy=False)

    forces = np.zeros((natoms, 3))
    np.add.at(forces, pairs.pair_i, fij)
    np.add.at(forces, pairs.pair_j, -fij)

    pair_virials = -pairs.rij[:, :, None] * fij[:, None, :]  # (npairs, 3, 3)
    half = 0.5 * _voigt(pair_virials)
    atom_virials = np.zeros((natoms, 6))
    np.add.at(atom_virials, pairs.pair_i, half)
    np.add.at(atom_virials, pairs.pair_j, half)

    virial = pair_virials.sum(axis=0)
    if result.atom_forces is not None:
        atom_forces = result.atom_forces.detach().cpu().numpy().astype(np.float64, copy=False)
        forces += atom_forces
        # LAMMPS keeps the upper triangle (xy = sum x f_y); the total is symmetric, so
        # the full tensor is the upper triangle mirrored
        upper = (positions.T @ atom_forces)[[0, 1, 2, 0, 0, 1], [0, 1, 2, 1, 2, 2]]
        upper = upper + result.virial.detach().cpu().numpy()
        extra = np.zeros((3, 3))
        extra[[0, 1, 2, 0, 0, 1], [0, 1, 2, 1, 2, 2]] = upper
        extra[[1, 2, 2], [0, 0, 1]] = upper[[3, 4, 5]]
        virial = virial + extra

    return ReferenceResult(
        energy=float(atom_energies.sum()),
        atom_energies=atom_energies,
        forces=forces,
        virial=virial,
        atom_virials=atom_virials,
        pairs=pairs,
        pair_forces=fij,
    )


def evaluate_atoms(
    potential: Potential,
    atoms: ase.Atoms,
    elements: Sequence[str] | None = None,
) -> ReferenceResult:
    """:func:`evaluate_reference` on an :class:`ase.Atoms`.

    :param atoms: positions, cell and periodicity of the system
    :param elements: the element name of every atom, where it is not the atom's chemical
        symbol (``NULL`` for atoms the model leaves out); names map to species with
        :func:`~nvalchemi_lammps.map_elements`, as ``pair_coeff`` names do
    """
    names = list(atoms.get_chemical_symbols()) if elements is None else list(elements)
    if len(names) != len(atoms):
        raise ValueError(f"{len(names)} element names for {len(atoms)} atoms")
    species = np.array(map_elements(names, potential.spec.elements), dtype=np.int64)
    return evaluate_reference(
        potential,
        atoms.get_positions(),
        np.asarray(atoms.get_cell()),
        tuple(bool(p) for p in atoms.get_pbc()),
        species,
    )
