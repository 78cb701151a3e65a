"""Coulomb energy of point charges by Ewald summation, as LAMMPS's ``pair_style coul/long``
+ ``kspace_style ewald`` compute it (with ``kspace_modify slab`` for a slab).

Real space, self, background and slab terms are :class:`~._coulomb.Coulomb`'s. Reciprocal
space comes from the structure factor ``S(k) = sum_i q_i exp(i k.x_i)`` over every atom
once: each rank sums its owned atoms and ``graph.comm.allreduce`` adds the ranks' parts;
atom ``i`` takes ``(4 pi / V) sum_k f(k) Re(q_i exp(-i k.x_i) S(k))`` over half of k-space
(``f(k) = exp(-k^2 / 4 alpha^2) / k^2``), which sums to the reciprocal energy.

Forces and virial come from the engine's autograd through positions, cell and pair vectors.
The k-vectors depend only on the cell and on global sums, so every rank issues the same
structure-factor all-reduce, also with no atoms.
"""

from __future__ import annotations

import math

import torch

from ..contract import LocalGraph
from . import _capture
from ._base import register_potential
from ._coulomb import (
    QQR2E,
    Coulomb,
    cell_inverse,
    lammps_g_ewald,
    per_direction,
    plane_spacings,
)

__all__ = ["QQR2E", "Ewald", "lammps_g_ewald", "lammps_kmax"]

#: LAMMPS widens the k-space sphere by this factor (``gsqmx *= 1.00001`` in ``ewald.cpp``).
_KSPHERE_SLACK = 1.00001


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
class Ewald(Coulomb):
    """Ewald summation of point charges in a box periodic in x, y and z, or in x and y with
    a slab correction.

    Give ``alpha`` and ``kmax``, or ``accuracy`` to derive whichever of them is left out
    from the current system the way ``kspace_style ewald <accuracy>`` does (``Ewald::init``:
    alpha from the accuracy, the real-space cutoff, the number of atoms and ``sum q^2``;
    ``kmax`` per direction from its RMS error estimate, along z over the slab-extended
    box). K-vectors are the integer combinations ``n`` of the reciprocal lattice with
    ``|n_d| <= kmax_d`` inside the sphere through the largest ``kmax_d`` along a lattice
    direction, the same set as LAMMPS's for an orthogonal box.

    :param kmax: k-vectors per direction (one integer, or three); left out: from ``accuracy``

    The other parameters are :class:`~._coulomb.Coulomb`'s.
    """

    name = "ewald"
    resolution_name = "kmax"

    def __init__(
        self,
        elements: list[str],
        cutoff: float,
        alpha: float | None = None,
        kmax: int | list[int] | None = None,
        accuracy: float | None = None,
        charges: dict[str, float] | None = None,
        slab: float | None = None,
        background: bool = False,
        units: str = "metal",
        dtype: str = "float64",
    ) -> None:
        kmax_list = per_direction(self.name, "kmax", kmax, alpha, accuracy)
        if kmax_list is not None and (len(kmax_list) != 3 or min(kmax_list) < 1):
            raise ValueError(f"kmax must be a positive integer or three of them, got {kmax}")
        super().__init__(elements, cutoff, alpha, accuracy, charges, slab, background, units, dtype)
        self.kmax = None if kmax_list is None else tuple(kmax_list)
        self._config["kmax"] = kmax_list

    @property
    def resolution(self) -> tuple[int, int, int] | None:
        return self.kmax

    def _resolution(
        self, kcell: torch.Tensor, volume: float, natoms: float, q2: float, alpha: float | None
    ) -> tuple[float, tuple[int, int, int]]:
        if alpha is None:
            alpha = lammps_g_ewald(self.accuracy, self.spec.cutoff, natoms, q2, volume, self.qqr2e)
        kmax = self.kmax
        if kmax is None:
            kmax = tuple(
                lammps_kmax(self.accuracy, alpha, d, natoms, q2, self.qqr2e)
                for d in plane_spacings(kcell)
            )
        return alpha, kmax

    def _reciprocal(
        self,
        graph: LocalGraph,
        q_owned: torch.Tensor,
        kcell: torch.Tensor,
        alpha: float,
        kmax: tuple[int, int, int],
    ) -> torch.Tensor:
        dtype, device = q_owned.dtype, q_owned.device
        n = _half_space_vectors(kmax, device)
        inside = _in_sphere(n, kcell.detach().to(torch.float64), kmax)
        captured = _capture.capturing()
        if not captured:  # the k-vectors of LAMMPS's sphere only (about half of the cube)
            n = n[inside]
        determinant, inverse = cell_inverse(kcell)
        k = n.to(dtype) @ (2.0 * math.pi * inverse.T)
        ksq = (k * k).sum(dim=1)
        weight = 4.0 * math.pi / determinant.abs() * torch.exp(-ksq / (4.0 * alpha**2)) / ksq
        if captured:  # the whole cube, those outside the sphere weighing nothing: the shapes
            # of a captured graph cannot follow the cell
            weight = torch.where(inside, weight, 0.0)
        phase = graph.positions[: graph.nlocal] @ k.T
        cos, sin = torch.cos(phase), torch.sin(phase)
        # structure factors, differentiable (the adjoint of a sum over ranks is itself)
        structure = graph.comm.allreduce(torch.stack([q_owned @ cos, q_owned @ sin]))
        return q_owned * ((cos * structure[0] + sin * structure[1]) @ weight)


def _half_space_vectors(kmax: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """Integer k-vectors ``n`` with ``|n_d| <= kmax_d``, one of each ``+-n`` pair, no zero:
    ``n_x > 0``, or ``n_x = 0`` and ``n_y > 0``, or ``n_x = n_y = 0`` and ``n_z > 0``."""
    kx, ky, kz = kmax

    def axis(low: int, high: int) -> torch.Tensor:
        return torch.arange(low, high + 1, device=device)

    zero = axis(0, 0)
    return torch.cat(
        [
            torch.cartesian_prod(axis(1, kx), axis(-ky, ky), axis(-kz, kz)),
            torch.cartesian_prod(zero, axis(1, ky), axis(-kz, kz)),
            torch.cartesian_prod(zero, zero, axis(1, kz)),
        ]
    )


def _in_sphere(n: torch.Tensor, cell: torch.Tensor, kmax: tuple[int, int, int]) -> torch.Tensor:
    """Which k-vectors ``n`` lie within LAMMPS's sphere ``|k|^2 <= 1.00001 max_d (kmax_d
    |b_d|)^2`` (``b_d`` the reciprocal lattice vectors of ``cell``, float64)."""
    recip = 2.0 * math.pi * cell_inverse(cell)[1].T  # rows: reciprocal lattice vectors
    ksq = ((n.to(torch.float64) @ recip) ** 2).sum(dim=1)
    radii = torch.stack([m * recip[d].norm() for d, m in enumerate(kmax)])
    return ksq <= radii.square().max() * _KSPHERE_SLACK
