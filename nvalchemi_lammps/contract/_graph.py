from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._comm import Comm, NoOpComm


@dataclass(frozen=True)
class LocalGraph:
    """One rank's atoms and pairs for one step, in LAMMPS's own order.

    Rows ``[0, nlocal)`` are the atoms this rank owns, rows ``[nlocal, ntotal)`` its ghosts.
    ``rij[k] = x[pair_j[k]] - x[pair_i[k]]`` with periodic images already applied, so a
    potential never needs the cell. Every directed pair within the cutoff is listed: an
    owned-owned pair appears twice (i->j and j->i), an owned-ghost pair once on this rank.
    (A potential that declares ``symmetric_pair_terms`` may get each pair once instead,
    LAMMPS's half list: its ``pair_terms`` cannot tell.)

    :param nlocal: number of owned atoms
    :param species: ``(ntotal,)`` int64, model element index of every atom, -1 for atoms
        whose LAMMPS type is mapped to ``NULL``
    :param pair_i: ``(npairs,)`` int64, receiving atom (owned)
    :param pair_j: ``(npairs,)`` int64, sending atom (owned or ghost)
    :param rij: ``(npairs, 3)`` pair vectors, in the potential's dtype
    :param comm: collectives across ranks (:class:`NoOpComm` on a single process)
    :param positions: ``(ntotal, 3)`` positions (ghosts as periodic images), in the
        potential's dtype; only for a potential whose spec ``needs_positions``
    :param cell: ``(3, 3)`` lattice vectors as rows, likewise
    :param pbc: periodicity of each lattice direction, likewise
    :param charges: ``(ntotal,)`` per-atom charges from LAMMPS (``atom_style charge``),
        if it has them, likewise
    :param total_charge: net charge of the whole system in e (``pair_style nvalchemi ...
        charge Q``), for potentials that predict charges under that constraint
    :param spin: spin multiplicity of the whole system (``... spin S``), or ``None`` for the
        model's own default
    :param task: the task (dataset) a multi-task model is to be evaluated for (``... task
        NAME``), or ``None`` for the model's own default
    :param row_pairs: at least the most pairs any row receives, where the caller fixes it
        (the engine's padded graphs, for a potential that lays each row's pairs side by
        side: :attr:`Potential.pairs_by_row <nvalchemi_lammps.contract.Potential.pairs_by_row>`);
        a padding row may receive more, all longer than the cutoff. ``None``: not given
    """

    nlocal: int
    species: torch.Tensor
    pair_i: torch.Tensor
    pair_j: torch.Tensor
    rij: torch.Tensor
    comm: Comm = field(default_factory=NoOpComm)
    positions: torch.Tensor | None = None
    cell: torch.Tensor | None = None
    pbc: tuple[bool, bool, bool] | None = None
    charges: torch.Tensor | None = None
    total_charge: float = 0.0
    spin: int | None = None
    task: str | None = None
    row_pairs: int | None = None

    @property
    def ntotal(self) -> int:
        return int(self.species.shape[0])

    @property
    def npairs(self) -> int:
        return int(self.pair_i.shape[0])
