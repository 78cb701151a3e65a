"""Coulomb energy of point charges by smooth particle-mesh Ewald (PME), for the same series
LAMMPS's ``pair_style coul/long`` + ``kspace_style pppm`` approximates (with
``kspace_modify slab`` for a slab).

Real space, self, background and slab terms are :class:`~._coulomb.Coulomb`'s. Reciprocal
space: each rank spreads its owned charges onto the whole mesh with cardinal B-splines of
order ``p`` (the charge assignment of LAMMPS's ``kspace_modify order p``);
``graph.comm.allreduce`` sums the ranks' meshes; the mesh potential is
``phi = IFFT(G FFT(Q))`` with ``G(k) = (4 pi / V) exp(-k^2 / 4 alpha^2) / k^2 / W(k)^2``,
``W`` the B-spline's Fourier transform ``prod_d sinc(m_d / K_d)^p`` (deconvolution of
spreading and of interpolating back); atom ``i`` takes ``q_i / 2`` times the potential
interpolated at its position with the same weights, and these sum to the reciprocal
energy ``1/2 sum_m Q(m) phi(m)``.

Forces and virial come from the engine's autograd (through the spline weights and the
influence function), so they are the exact derivatives of this energy. The mesh depends
only on the cell and global sums, so every rank issues the same mesh all-reduce, also with
no atoms. Every rank holds and transforms the whole mesh.
"""

from __future__ import annotations

import math

import torch

from ..contract import LocalGraph
from ._base import register_potential
from ._coulomb import (
    Coulomb,
    cell_inverse,
    lammps_g_ewald,
    per_direction,
    plane_spacings,
    real_space_error,
)

#: Spline orders PME accepts: from 3 (smooth forces; order 2 would give piecewise-constant
#: ones) to LAMMPS's ``MAXORDER`` 7, the highest its error estimate covers.
ORDERS = range(3, 8)

#: ``acons`` of ``PPPM::PPPM`` (Deserno and Holm, JCP 109, 7698): coefficients of the ik
#: force error estimate per order.
_ACONS = {
    3: (1.0 / 588.0, 7.0 / 1440.0, 21.0 / 3872.0),
    4: (1.0 / 4320.0, 3.0 / 1936.0, 7601.0 / 2271360.0, 143.0 / 28800.0),
    5: (
        1.0 / 23232.0,
        7601.0 / 13628160.0,
        143.0 / 69120.0,
        517231.0 / 106536960.0,
        106640677.0 / 11737571328.0,
    ),
    6: (
        691.0 / 68140800.0,
        13.0 / 57600.0,
        47021.0 / 35512320.0,
        9694607.0 / 2095994880.0,
        733191589.0 / 59609088000.0,
        326190917.0 / 11700633600.0,
    ),
    7: (
        1.0 / 345600.0,
        3617.0 / 35512320.0,
        745739.0 / 838397952.0,
        56399353.0 / 12773376000.0,
        25091609.0 / 1560084480.0,
        1755948832039.0 / 36229939200000.0,
        4887769399.0 / 37838389248.0,
    ),
}

#: ``PPPM::adjust_gewald``: Newton iterations, stopping residual (force units), and the
#: step of its forward-difference derivative.
_NEWTON_ITERATIONS, _NEWTON_RESIDUAL, _NEWTON_STEP = 10000, 0.00001, 0.000001


def _ik_error(h: float, prd: float, natoms: float, q2: float, alpha: float, order: int) -> float:
    """``PPPM::estimate_ik_error``: RMS force error of mesh spacing ``h`` along a box side
    ``prd`` (force units)."""
    if natoms == 0:
        return 0.0
    series = sum(a * (h * alpha) ** (2 * m) for m, a in enumerate(_ACONS[order]))
    return (
        q2
        * (h * alpha) ** order
        * math.sqrt(alpha * prd * math.sqrt(2.0 * math.pi) * series / natoms)
        / (prd * prd)
    )


def _factorable(n: int) -> bool:
    """``PPPM::factorable``: ``n`` has no prime factors but 2, 3 and 5."""
    for factor in (2, 3, 5):
        while n % factor == 0:
            n //= factor
    return n == 1


def lammps_pppm(
    accuracy: float,
    cutoff: float,
    natoms: float,
    q2: float,
    volume: float,
    spacing: list[float],
    order: int,
    qqr2e: float,
    alpha: float | None = None,
    mesh: tuple[int, int, int] | None = None,
) -> tuple[float, tuple[int, int, int]]:
    """``alpha`` and mesh as ``kspace_style pppm <accuracy>`` chooses them (ik
    differentiation, ``PPPM::set_grid_global`` then ``PPPM::adjust_gewald``), for whichever
    of ``alpha`` and ``mesh`` is not given.

    :param accuracy: relative force accuracy (times ``qqr2e``: LAMMPS's absolute one)
    :param volume: the cell's volume (with a slab: the unextended one, as LAMMPS)
    :param spacing: the k-space cell's plane spacings, ``xprd yprd zprd_slab``
    :param q2: ``qqr2e * sum q_i^2``
    """
    absolute = accuracy * qqr2e
    g = alpha if alpha is not None else lammps_g_ewald(accuracy, cutoff, natoms, q2, volume, qqr2e)
    if mesh is None:
        sizes = []
        for prd in spacing:
            # LAMMPS's loop, which evaluates the error before each refinement
            h = 1.0 / g
            n = int(prd / h) + 1
            error = _ik_error(h, prd, natoms, q2, g, order)
            while error > absolute:
                error = _ik_error(h, prd, natoms, q2, g, order)
                n += 1
                h = prd / n
            while not _factorable(n):
                n += 1
            sizes.append(n)
        mesh = tuple(sizes)
    if alpha is not None:
        return alpha, mesh
    steps = [prd / n for prd, n in zip(spacing, mesh)]

    def residual(g: float) -> float:
        errors = [_ik_error(h, p, natoms, q2, g, order) for h, p in zip(steps, spacing)]
        kspace = math.sqrt(sum(e * e for e in errors) / 3.0)
        return real_space_error(g, cutoff, natoms, q2, volume) - kspace

    for _ in range(_NEWTON_ITERATIONS):
        f = residual(g)
        g -= f / ((residual(g + _NEWTON_STEP) - f) / _NEWTON_STEP)
        if abs(residual(g)) < _NEWTON_RESIDUAL:
            return g, mesh
    raise ValueError(f"pme could not derive alpha for accuracy {accuracy:g} (as LAMMPS's pppm)")


@register_potential
class Pme(Coulomb):
    """Smooth particle-mesh Ewald of point charges in a box periodic in x, y and z, or in x
    and y with a slab correction.

    Give ``alpha`` and ``mesh``, or ``accuracy`` to derive whichever of them is left out
    from the current system as ``kspace_style pppm <accuracy>`` does (its ik error
    estimate: alpha from the accuracy and the real-space cutoff, the mesh per direction
    from the estimate, rounded up to a product of 2, 3 and 5, then alpha balanced between
    real and k-space by Newton's method; along z over the slab-extended box). The same
    accuracy gives the same alpha and mesh as LAMMPS; the error of this method on that mesh
    is not LAMMPS's (docs/electrostatics.md has the measured numbers).

    :param mesh: mesh points per lattice direction (one integer, or three); left out: from
        ``accuracy``
    :param order: B-spline order, 3 to 7 (LAMMPS's ``kspace_modify order``, default 5)

    The other parameters are :class:`~._coulomb.Coulomb`'s.
    """

    name = "pme"
    resolution_name = "mesh"

    def __init__(
        self,
        elements: list[str],
        cutoff: float,
        alpha: float | None = None,
        mesh: int | list[int] | None = None,
        order: int = 5,
        accuracy: float | None = None,
        charges: dict[str, float] | None = None,
        slab: float | None = None,
        background: bool = False,
        units: str = "metal",
        dtype: str = "float64",
    ) -> None:
        mesh_list = per_direction(self.name, "mesh", mesh, alpha, accuracy)
        if order not in ORDERS:
            raise ValueError(
                f"order must be 3 to 7 (B-spline order, as kspace_modify order), got {order}"
            )
        if mesh_list is not None and (len(mesh_list) != 3 or min(mesh_list) < order):
            raise ValueError(
                f"mesh must be one integer or three, each at least the order {order}; got {mesh}"
            )
        super().__init__(elements, cutoff, alpha, accuracy, charges, slab, background, units, dtype)
        self.mesh = None if mesh_list is None else tuple(mesh_list)
        self.order = int(order)
        self._config.update(mesh=mesh_list, order=self.order)

    @property
    def resolution(self) -> tuple[int, int, int] | None:
        return self.mesh

    def _resolution(
        self, kcell: torch.Tensor, volume: float, natoms: float, q2: float, alpha: float | None
    ) -> tuple[float, tuple[int, int, int]]:
        if alpha is not None and self.mesh is not None:
            return alpha, self.mesh
        return lammps_pppm(
            self.accuracy,
            self.spec.cutoff,
            natoms,
            q2,
            volume,
            plane_spacings(kcell),
            self.order,
            self.qqr2e,
            alpha=alpha,
            mesh=self.mesh,
        )

    def _reciprocal(
        self,
        graph: LocalGraph,
        q_owned: torch.Tensor,
        kcell: torch.Tensor,
        alpha: float,
        mesh: tuple[int, int, int],
    ) -> torch.Tensor:
        points, weights = self._stencil(graph.positions[: graph.nlocal], kcell, mesh)
        local = q_owned.new_zeros(math.prod(mesh))
        local = local.index_add(0, points.reshape(-1), (q_owned[:, None] * weights).reshape(-1))
        # the charge mesh summed over ranks, differentiable (its adjoint is itself)
        charge = graph.comm.allreduce(local).reshape(mesh)
        potential = _mesh_potential(charge, kcell, alpha, self.order).reshape(-1)
        return 0.5 * q_owned * (weights * potential[points]).sum(dim=1)

    def _stencil(
        self, positions: torch.Tensor, kcell: torch.Tensor, mesh: tuple[int, int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``order^3`` mesh points (flat indices) each atom spreads onto, and their
        weights ``M_p(u - m)`` per direction multiplied, ``u`` the atom's position in mesh
        units."""
        order = self.order
        fractional = positions @ cell_inverse(kcell)[1]
        u = torch.stack([fractional[:, d] * n for d, n in enumerate(mesh)], dim=1)
        base = torch.floor(u.detach())
        w = bspline_weights(u - base, order)  # (n, 3, order): weight of point base - j
        offsets = torch.arange(order, device=positions.device)
        shifted = base.to(torch.int64)[:, :, None] - offsets
        index = torch.stack([shifted[:, d] % n for d, n in enumerate(mesh)], dim=1)
        _, k2, k3 = mesh
        points = (
            index[:, 0, :, None, None] * (k2 * k3)
            + index[:, 1, None, :, None] * k3
            + index[:, 2, None, None, :]
        )
        weights = w[:, 0, :, None, None] * w[:, 1, None, :, None] * w[:, 2, None, None, :]
        shape = (positions.shape[0], order**3)  # explicit: a rank may own no atoms
        return points.reshape(shape), weights.reshape(shape)


def bspline_weights(f: torch.Tensor, order: int) -> torch.Tensor:
    """Cardinal B-spline ``M_order(f + j)`` for ``j = 0 .. order-1`` (last axis), by the
    recursion ``M_k(x) = (x M_{k-1}(x) + (k - x) M_{k-1}(x - 1)) / (k - 1)``.

    :param f: fractional parts in ``[0, 1)``, any shape
    """
    w = torch.stack([f, 1.0 - f], dim=-1)  # M_2(f), M_2(f + 1)
    zero = torch.zeros_like(w[..., :1])
    for k in range(3, order + 1):
        x = f[..., None] + torch.arange(k, dtype=f.dtype, device=f.device)
        current, shifted = torch.cat([w, zero], dim=-1), torch.cat([zero, w], dim=-1)
        w = (x * current + (k - x) * shifted) / (k - 1)
    return w


def _mesh_potential(
    charge: torch.Tensor, kcell: torch.Tensor, alpha: float, order: int
) -> torch.Tensor:
    """``phi(m) = sum_k G(k) Q^(k) exp(2 pi i k.m / K)``, so that the reciprocal energy is
    ``1/2 sum_m Q(m) phi(m)``."""
    mesh = tuple(charge.shape)
    dtype, device = charge.dtype, charge.device
    freqs = [torch.fft.fftfreq(n, d=1.0 / n, dtype=dtype, device=device) for n in mesh[:2]]
    freqs.append(torch.fft.rfftfreq(mesh[2], d=1.0 / mesh[2], dtype=dtype, device=device))
    grid = torch.stack(torch.meshgrid(*freqs, indexing="ij"), dim=-1)
    determinant, inverse = cell_inverse(kcell)
    k = grid @ (2.0 * math.pi * inverse.T)
    ksq = (k * k).sum(dim=-1)
    nonzero = ksq > 0.0
    ksq_safe = torch.where(nonzero, ksq, torch.ones_like(ksq))
    spline = 1.0
    for d, n in enumerate(mesh):  # the B-spline's transform, once for spreading, once back
        spline = spline * torch.special.sinc(grid[..., d] / n) ** (2 * order)
    volume = determinant.abs()
    green = 4.0 * math.pi / volume * torch.exp(-ksq_safe / (4.0 * alpha**2)) / ksq_safe / spline
    green = torch.where(nonzero, green, torch.zeros_like(green))
    transformed = torch.fft.rfftn(charge)
    return torch.fft.irfftn(green * transformed, s=mesh) * math.prod(mesh)
