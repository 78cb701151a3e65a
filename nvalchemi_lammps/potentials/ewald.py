"""Coulomb energy of point charges in a periodic box by Ewald summation, as LAMMPS's
``pair_style coul/long`` + ``kspace_style ewald`` compute it.

The energy is split per owned atom so that a decomposed run sums to the whole:

- real space, ``0.5 qqr2e q_i q_j erfc(alpha r) / r`` per directed pair ``r < cutoff``,
  from the rank's own pairs (owned receivers, owned or ghost senders);
- self, ``-qqr2e alpha / sqrt(pi) q_i^2``;
- reciprocal space, from the structure factor ``S(k) = sum_i q_i exp(i k.x_i)`` over every
  atom once: each rank sums its owned atoms and ``graph.comm.allreduce`` adds the ranks'
  parts; atom ``i`` takes ``qqr2e (4 pi / V) sum_k f(k) Re(q_i exp(-i k.x_i) S(k))`` over
  half of k-space (``f(k) = exp(-k^2 / 4 alpha^2) / k^2``), which sums to the reciprocal
  energy;
- for a system with net charge ``Q``, the neutralizing background
  ``-qqr2e pi q_i Q / (2 V alpha^2)`` per atom, as LAMMPS's ewald adds it.

Forces and virial come from the engine's autograd through positions, cell and pair vectors.
Every rank issues the same two collectives every step (global charge sums, then the
structure factors), also with no atoms: the k-vectors depend only on the cell and on those
global sums.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contract import LocalGraph, ModelSpec
from ._base import Potential, register_potential

#: LAMMPS's ``force->qqr2e`` (``update.cpp``): q^2/r in energy units, per unit style.
QQR2E = {"metal": 14.399645, "real": 332.06371}

#: LAMMPS widens the k-space sphere by this factor (``gsqmx *= 1.00001`` in ``ewald.cpp``).
_KSPHERE_SLACK = 1.00001


def lammps_g_ewald(
    accuracy: float, cutoff: float, natoms: float, q2: float, volume: float, qqr2e: float
) -> float:
    """Splitting parameter ``alpha`` as ``Ewald::init`` estimates it (``kspace_style ewald
    <accuracy>`` without ``kspace_modify gewald``).

    :param accuracy: relative force accuracy (LAMMPS multiplies it by the two-charge force
        ``qqr2e`` in metal and real units)
    :param q2: ``qqr2e * sum q_i^2``
    """
    absolute = accuracy * qqr2e
    g = absolute * math.sqrt(natoms * cutoff * volume) / (2.0 * q2)
    if g >= 1.0:
        return (1.35 - 0.15 * math.log(absolute)) / cutoff
    return math.sqrt(-math.log(g)) / cutoff


def lammps_kmax(
    accuracy: float, alpha: float, spacing: float, natoms: float, q2: float, qqr2e: float
) -> int:
    """Smallest ``kmax`` along one direction whose RMS force error estimate
    (``Ewald::rms``) is within ``accuracy`` (relative, as :func:`lammps_g_ewald`)."""
    absolute = accuracy * qqr2e
    natoms = max(natoms, 1.0)

    def rms(km: int) -> float:
        return (
            2.0
            * q2
            * alpha
            / spacing
            * math.sqrt(1.0 / (math.pi * km * natoms))
            * math.exp(-(math.pi**2) * km * km / (alpha * alpha * spacing * spacing))
        )

    km = 1
    while rms(km) > absolute:
        km += 1
    return km


@register_potential
class Ewald(Potential):
    """Ewald summation of point charges in a box periodic in all three directions.

    Give ``alpha`` and ``kmax``, or ``accuracy`` to derive whichever of them is left out
    from the current system the way ``kspace_style ewald <accuracy>`` does (``Ewald::init``:
    alpha from the accuracy, the real-space cutoff, the number of atoms and ``sum q^2``;
    ``kmax`` per direction from its RMS error estimate). K-vectors are the integer
    combinations ``n`` of the reciprocal lattice with ``|n_d| <= kmax_d`` inside the sphere
    through the largest ``kmax_d`` along a lattice direction, the same set as LAMMPS's for
    an orthogonal box.

    :param elements: element names
    :param cutoff: real-space cutoff (length)
    :param alpha: Ewald splitting parameter (1/length); left out: from ``accuracy``
    :param kmax: k-vectors per direction (one integer, or three); left out: from ``accuracy``
    :param accuracy: relative force accuracy, as in ``kspace_style ewald <accuracy>``
    :param charges: fixed charge per element; left out: the per-atom charges LAMMPS has
        (``atom_style charge`` or ``full``); given: LAMMPS's charges are ignored
    :param units: ``metal`` (eV, Angstrom, e) or ``real`` (kcal/mol, Angstrom, e)
    :param dtype: ``float64`` or ``float32``
    """

    name = "ewald"

    def __init__(
        self,
        elements: list[str],
        cutoff: float,
        alpha: float | None = None,
        kmax: int | list[int] | None = None,
        accuracy: float | None = None,
        charges: dict[str, float] | None = None,
        units: str = "metal",
        dtype: str = "float64",
    ) -> None:
        super().__init__()
        self.spec = ModelSpec(
            elements=tuple(elements),
            cutoff=float(cutoff),
            units=units,
            dtype=dtype,
            layers=1,
            needs_positions=True,
        )
        if accuracy is None and (alpha is None or kmax is None):
            raise ValueError("ewald needs alpha and kmax, or accuracy to derive them")
        if accuracy is not None and not accuracy > 0.0:
            raise ValueError(f"accuracy must be positive, got {accuracy}")
        if alpha is not None and not alpha > 0.0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        kmax_list = None
        if kmax is not None:
            kmax_list = [int(kmax)] * 3 if isinstance(kmax, int) else [int(k) for k in kmax]
            if len(kmax_list) != 3 or min(kmax_list) < 1:
                raise ValueError(f"kmax must be a positive integer or three of them, got {kmax}")
        if charges is not None:
            missing = [e for e in elements if e not in charges]
            if missing:
                raise ValueError(f"charges missing for element(s) {', '.join(missing)}")
        self.alpha = None if alpha is None else float(alpha)
        self.kmax = None if kmax_list is None else tuple(kmax_list)
        self.accuracy = None if accuracy is None else float(accuracy)
        self.qqr2e = QQR2E[units]
        self._config = {
            "elements": list(elements),
            "cutoff": float(cutoff),
            "alpha": self.alpha,
            "kmax": kmax_list,
            "accuracy": self.accuracy,
            "charges": None if charges is None else {e: float(charges[e]) for e in elements},
            "units": units,
            "dtype": dtype,
        }
        table = [0.0 if charges is None else float(charges[e]) for e in elements]
        self.fixed_charges = charges is not None
        self.register_buffer("element_charges", torch.tensor(table, dtype=self.spec.torch_dtype))

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def _charges(self, graph: LocalGraph) -> torch.Tensor:
        present = graph.species >= 0  # atoms of NULL types carry no charge
        if self.fixed_charges:
            q = self.element_charges[graph.species.clamp(min=0)]
        elif graph.charges is None:
            raise ValueError(
                "ewald needs per-atom charges: use an atom style with charges (atom_style "
                "charge or full), or give the model fixed charges per element"
            )
        else:
            q = graph.charges.to(graph.rij.dtype)
        return torch.where(present, q, torch.zeros_like(q))

    def parameters_for(
        self, cell: torch.Tensor, natoms: float, qsqsum: float
    ) -> tuple[float, tuple[int, int, int]]:
        """``alpha`` and ``kmax`` for this cell and these global sums (the given ones, or
        LAMMPS's estimates from ``accuracy``)."""
        volume = abs(float(torch.linalg.det(cell)))
        # distance between lattice planes: the box length along each direction for an
        # orthogonal box, LAMMPS's xprd, yprd, zprd
        recip_norms = torch.linalg.inv(cell).norm(dim=0)
        spacing = [1.0 / float(n) for n in recip_norms]
        q2 = qsqsum * self.qqr2e
        alpha = self.alpha
        if alpha is None:
            if q2 == 0.0:
                raise ValueError("ewald cannot derive alpha for a system without charges")
            alpha = lammps_g_ewald(self.accuracy, self.spec.cutoff, natoms, q2, volume, self.qqr2e)
        kmax = self.kmax
        if kmax is None:
            kmax = tuple(
                lammps_kmax(self.accuracy, alpha, d, natoms, q2, self.qqr2e) for d in spacing
            )
        return alpha, kmax

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        if graph.positions is None or graph.cell is None or graph.pbc is None:
            raise ValueError("ewald needs positions, cell and periodicity")
        if not all(graph.pbc):
            raise ValueError(
                f"ewald needs a box periodic in all three directions, got pbc={graph.pbc} "
                "(slab geometries are not supported yet)"
            )
        dtype, device = graph.rij.dtype, graph.rij.device
        nlocal = graph.nlocal
        q = self._charges(graph)
        q_owned = q[:nlocal]
        # collective 1: global atom count and charge sums (no gradient)
        local = torch.stack(
            [
                torch.tensor(float(nlocal), dtype=torch.float64),
                *(t.detach().to("cpu", torch.float64) for t in (q_owned.sum(), (q_owned**2).sum())),
            ]
        )
        natoms, qsum, qsqsum = (float(t) for t in graph.comm.allreduce(local.to(device)))
        cell = graph.cell
        alpha, kmax = self.parameters_for(cell.detach().to(torch.float64), natoms, qsqsum)
        qqr2e = self.qqr2e

        energies = torch.zeros(graph.ntotal, dtype=dtype, device=device)

        # real space: half of each directed pair's energy to its receiver
        r = graph.rij.norm(dim=1)
        inside = (r < self.spec.cutoff) & (r > 0.0)
        r_safe = torch.where(inside, r, torch.ones_like(r))
        pair_energy = (
            q[graph.pair_i] * q[graph.pair_j] * torch.special.erfc(alpha * r_safe) / r_safe
        )
        pair_energy = torch.where(inside, pair_energy, torch.zeros_like(pair_energy))
        energies = energies.index_add(0, graph.pair_i, 0.5 * qqr2e * pair_energy)

        # self energy and the neutralizing background (LAMMPS puts no volume derivative of
        # the latter into its virial; neither do we: the volume is a constant there)
        volume = torch.linalg.det(cell).abs()
        own = -qqr2e * alpha / math.sqrt(math.pi) * q_owned**2
        own = own - qqr2e * math.pi * q_owned * qsum / (2.0 * alpha**2 * float(volume.detach()))

        # reciprocal space over half of k-space, k = n @ (2 pi h^-T)
        n = _half_space_vectors(cell.detach().to(torch.float64), kmax).to(device)
        recip = 2.0 * math.pi * torch.linalg.inv(cell).T
        k = n.to(dtype) @ recip
        ksq = (k * k).sum(dim=1)
        weight = 4.0 * math.pi / volume * torch.exp(-ksq / (4.0 * alpha**2)) / ksq
        phase = graph.positions[:nlocal] @ k.T
        cos, sin = torch.cos(phase), torch.sin(phase)
        # collective 2: structure factors, differentiable (its adjoint is itself)
        structure = graph.comm.allreduce(torch.stack([q_owned @ cos, q_owned @ sin]))
        reciprocal = q_owned * ((cos * structure[0] + sin * structure[1]) @ weight)

        owned = qqr2e * reciprocal + own
        return energies + torch.cat([owned, owned.new_zeros(graph.ntotal - nlocal)])


def _half_space_vectors(cell: torch.Tensor, kmax: tuple[int, int, int]) -> torch.Tensor:
    """Integer k-vectors ``n`` (one of each ``+-n`` pair, no zero) with ``|n_d| <= kmax_d``
    and ``|k|^2`` within LAMMPS's sphere ``1.00001 max_d (kmax_d |b_d|)^2``."""
    recip = 2.0 * math.pi * torch.linalg.inv(cell).T  # rows: reciprocal lattice vectors
    kx, ky, kz = kmax
    axes = [torch.arange(-m, m + 1, dtype=torch.int64) for m in (kx, ky, kz)]
    n = torch.cartesian_prod(*axes)
    half = (
        (n[:, 0] > 0)
        | ((n[:, 0] == 0) & (n[:, 1] > 0))
        | ((n[:, 0] == 0) & (n[:, 1] == 0) & (n[:, 2] > 0))
    )
    n = n[half]
    ksq = ((n.to(torch.float64) @ recip) ** 2).sum(dim=1)
    limit = max(float(m * recip[d].norm()) ** 2 for d, m in enumerate(kmax)) * _KSPHERE_SLACK
    return n[ksq <= limit]
