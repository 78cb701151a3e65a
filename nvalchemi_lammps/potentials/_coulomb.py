"""What Ewald and PME share: point charges in a box periodic in x, y and z, or in x and y
only with LAMMPS's slab correction, split per owned atom so that a decomposed run sums to
the whole.

- real space, ``0.5 qqr2e q_i q_j erfc(alpha r) / r`` per directed pair ``r < cutoff``,
  from the rank's own pairs (owned receivers, owned or ghost senders);
- self, ``-qqr2e alpha / sqrt(pi) q_i^2``;
- reciprocal space from the owned atoms, summed over ranks by the subclass (Ewald:
  structure factors; PME: the charge mesh);
- for a net charge ``Q`` (only with ``background = true``), the neutralizing background
  ``-qqr2e pi q_i Q / (2 V alpha^2)``, as LAMMPS adds it;
- with ``slab``, the k-space box is the cell with its third vector ``slab`` times longer
  (LAMMPS's ``kspace_modify slab``), plus the Yeh-Berkowitz correction of LAMMPS's
  ``slabcorr``, ``qqr2e 2 pi / V (M^2 - Q sum q z^2 - Q^2 Lz^2 / 12)`` with the global
  dipole ``M = sum q z``, split per atom as LAMMPS splits it.

Every rank issues the same collectives every step, also with no atoms: one all-reduce of
``(N, sum q, sum q^2, sum q z, sum q z^2)`` (differentiable, so that charges predicted by a
model get their full gradient), then the subclass's reciprocal-space all-reduce. Parameters
derived from ``accuracy`` depend only on the cell and these global sums, so every rank
derives the same ones; every check that raises does so from them too, on every rank.

Captured as a CUDA graph (:meth:`Coulomb.prepare_capture`), with ``alpha`` and the
resolution given: the forward reads nothing back from the GPU (the cell's determinant and
inverse in closed form, the k-vectors and the mesh fixed by the resolution), and the checks
that need the global sums on the host (net charge, the real-space accuracy, a slab's cell)
run when the potential is run outside a capture: at every step eagerly, at every capture
on a GPU (LAMMPS checks them when a run starts). Padding atoms (species -1, no charge,
at the origin) add nothing to any sum; padding pairs lie beyond the cutoff.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contract import LocalGraph, ModelSpec
from . import _capture
from ._base import Potential

#: LAMMPS's ``force->qqr2e`` (``update.cpp``): q^2/r in energy units, per unit style.
QQR2E = {"metal": 14.399645, "real": 332.06371}

#: Net charge (e) above which a system counts as charged: LAMMPS's kspace ``SMALL``, the
#: threshold of its "System is not charge neutral" warning.
NET_CHARGE_LIMIT = 1e-5

#: An explicit alpha is refused when LAMMPS's real-space RMS force error estimate exceeds
#: the requested accuracy by more than this factor (an alpha LAMMPS itself picked, printed
#: to 8 digits, stays well inside it).
REAL_SPACE_SLACK = 2.0


def lammps_g_ewald(
    accuracy: float, cutoff: float, natoms: float, q2: float, volume: float, qqr2e: float
) -> float:
    """Splitting parameter ``alpha`` as ``Ewald::init`` and ``PPPM::set_grid_global``
    first estimate it (``kspace_style ewald|pppm <accuracy>`` without ``kspace_modify
    gewald``).

    :param accuracy: relative force accuracy (LAMMPS multiplies it by the two-charge force
        ``qqr2e`` in metal and real units)
    :param volume: volume of the cell (with a slab: the unextended one, as LAMMPS)
    :param q2: ``qqr2e * sum q_i^2``
    """
    absolute = accuracy * qqr2e
    g = absolute * math.sqrt(natoms * cutoff * volume) / (2.0 * q2)
    if g >= 1.0:
        return (1.35 - 0.15 * math.log(absolute)) / cutoff
    return math.sqrt(-math.log(g)) / cutoff


def real_space_error(alpha: float, cutoff: float, natoms: float, q2: float, volume: float) -> float:
    """LAMMPS's estimate of the RMS force error of truncating the real-space sum at
    ``cutoff`` (``2 q2 exp(-alpha^2 rc^2) / sqrt(N rc V)``, force units)."""
    return 2.0 * q2 * math.exp(-((alpha * cutoff) ** 2)) / math.sqrt(natoms * cutoff * volume)


def cell_inverse(cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Determinant and inverse of a ``(3, 3)`` cell (rows: lattice vectors) by cross
    products, differentiable: ``torch.linalg.inv`` reads its singularity check back to the
    host on a GPU."""
    a, b, c = cell.unbind(0)
    bc, ca, ab = torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)
    det = (a * bc).sum()
    return det, torch.stack([bc, ca, ab], dim=1) / det


def plane_spacings(cell: torch.Tensor) -> list[float]:
    """Distance between lattice planes along each direction: the box lengths ``xprd``,
    ``yprd``, ``zprd`` for an orthogonal box."""
    return [1.0 / float(n) for n in torch.linalg.inv(cell).norm(dim=0)]


def per_direction(
    potential: str,
    what: str,
    value: int | list[int] | None,
    alpha: float | None,
    accuracy: float | None,
) -> list[int] | None:
    """The reciprocal-space resolution ``value`` (Ewald's ``kmax``, PME's ``mesh``) as three
    integers, one per lattice direction (``None``: derived from ``accuracy``).

    :raises ValueError: neither ``alpha`` with ``value`` nor ``accuracy`` given
    """
    if accuracy is None and (alpha is None or value is None):
        raise ValueError(f"{potential} needs alpha and {what}, or accuracy to derive them")
    if value is None:
        return None
    return [int(value)] * 3 if isinstance(value, int) else [int(v) for v in value]


class Coulomb(Potential):
    """Base of :class:`~nvalchemi_lammps.potentials.ewald.Ewald` and
    :class:`~nvalchemi_lammps.potentials.pme.Pme`: charges, real space, self and
    background, slab correction, checks. A subclass derives its reciprocal-space
    resolution (:meth:`_resolution`) and sums reciprocal space (:meth:`_reciprocal`).

    The parameters both take (each subclass adds its resolution parameters):

    :param elements: element names
    :param cutoff: real-space cutoff (length)
    :param alpha: Ewald splitting parameter (1/length); left out: from ``accuracy``
    :param accuracy: relative force accuracy, as in ``kspace_style ewald|pppm <accuracy>``;
        with an explicit ``alpha`` it is checked against the real-space cutoff
    :param charges: fixed charge per element; left out: the per-atom charges LAMMPS has
        (``atom_style charge`` or ``full``); given: LAMMPS's charges are ignored
    :param slab: volume factor of the slab correction (LAMMPS's ``kspace_modify slab``,
        usually 3.0) for a box periodic in x and y only (``boundary p p f``); left out: a
        box periodic in x, y and z
    :param background: a system with a net charge gets the neutralizing background (as
        LAMMPS adds it, which warns only); left out or false, a net charge above
        :data:`NET_CHARGE_LIMIT` is an error
    :param units: ``metal`` (eV, Angstrom, e) or ``real`` (kcal/mol, Angstrom, e)
    :param dtype: ``float64`` or ``float32``
    """

    #: the name of the reciprocal-space resolution in messages (``kmax``, ``mesh``)
    resolution_name = ""

    def __init__(
        self,
        elements: list[str],
        cutoff: float,
        alpha: float | None,
        accuracy: float | None,
        charges: dict[str, float] | None,
        slab: float | None,
        background: bool,
        units: str,
        dtype: str,
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
        if accuracy is not None and not accuracy > 0.0:
            raise ValueError(f"accuracy must be positive, got {accuracy}")
        if alpha is not None and not alpha > 0.0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        if slab is not None and not slab > 1.0:
            raise ValueError(
                f"slab must be a volume factor above 1 (as kspace_modify slab; 3.0 is usual), "
                f"got {slab}"
            )
        if background is not True and background is not False:  # a TOML boolean
            raise ValueError(f"background must be true or false, got {background!r}")
        if charges is not None:
            missing = [e for e in elements if e not in charges]
            if missing:
                raise ValueError(f"charges missing for element(s) {', '.join(missing)}")
        self.alpha = None if alpha is None else float(alpha)
        self.accuracy = None if accuracy is None else float(accuracy)
        self.slab = None if slab is None else float(slab)
        self.background = background
        self.qqr2e = QQR2E[units]
        self._config: dict[str, Any] = {
            "elements": list(elements),
            "cutoff": float(cutoff),
            "alpha": self.alpha,
            "accuracy": self.accuracy,
            "charges": None if charges is None else {e: float(charges[e]) for e in elements},
            "slab": self.slab,
            "background": background,
            "units": units,
            "dtype": dtype,
        }
        table = [0.0 if charges is None else float(charges[e]) for e in elements]
        self.fixed_charges = charges is not None
        self.register_buffer("element_charges", torch.tensor(table, dtype=self.spec.torch_dtype))

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    @property
    def periodicity(self) -> tuple[bool, bool, bool]:
        """The box this potential runs in: periodic in x, y and z, or with a slab in x and
        y only (``boundary p p f``)."""
        return (True, True, self.slab is None)

    # --- what a subclass provides -----------------------------------------------------

    @property
    def resolution(self) -> Any:
        """The reciprocal-space resolution given (``None``: derived from ``accuracy``)."""
        raise NotImplementedError

    def _resolution(
        self, kcell: torch.Tensor, volume: float, natoms: float, q2: float, alpha: float | None
    ) -> tuple[float, Any]:
        """``alpha`` (the given one, or derived) and the reciprocal-space resolution for the
        k-space cell ``kcell`` (float64, detached); ``volume`` is the unextended cell's."""
        raise NotImplementedError

    def _reciprocal(
        self, graph: LocalGraph, q_owned: torch.Tensor, kcell: torch.Tensor, alpha: float, res: Any
    ) -> torch.Tensor:
        """Reciprocal-space energy of each owned atom, without ``qqr2e``; issues one
        all-reduce whose size depends only on ``kcell`` and ``res``."""
        raise NotImplementedError

    # --- shared -----------------------------------------------------------------------

    def kspace_cell(self, cell: torch.Tensor) -> torch.Tensor:
        """The periodic cell of reciprocal space: ``cell``, its third vector ``slab``
        times longer with a slab correction (LAMMPS's ``zprd_slab``)."""
        if self.slab is None:
            return cell
        return torch.cat([cell[:2], cell[2:] * self.slab])

    def prepare_capture(self) -> Coulomb:
        """Itself, with ``alpha`` and the resolution given (module docstring): charges of
        padding atoms are zero, padding pairs lie beyond the cutoff.

        :raises ValueError: ``alpha`` or the resolution derived from ``accuracy``
        """
        if self.alpha is None or self.resolution is None:
            what = self.resolution_name
            raise ValueError(
                f"the {self.name} model cannot be captured with alpha and {what} derived from "
                f"accuracy: they follow the cell and the charges, read back from the GPU at "
                f"every step, and {what} sets the shapes; give alpha and {what} (LAMMPS's log "
                "prints the values it derives) to capture it"
            )
        return self

    def parameters_for(self, cell: torch.Tensor, natoms: float, qsqsum: float) -> tuple[float, Any]:
        """``alpha`` and the reciprocal-space resolution for this cell and these global
        sums (the given ones, or LAMMPS's estimates from ``accuracy``)."""
        q2 = qsqsum * self.qqr2e
        if self.alpha is None and q2 == 0.0:
            raise ValueError(f"{self.name} cannot derive alpha for a system without charges")
        volume = abs(float(torch.linalg.det(cell)))
        return self._resolution(self.kspace_cell(cell), volume, natoms, q2, self.alpha)

    def _charges(self, graph: LocalGraph) -> torch.Tensor:
        present = graph.species >= 0  # atoms of NULL types carry no charge
        if self.fixed_charges:
            q = self.element_charges[graph.species.clamp(min=0)]
        elif graph.charges is None:
            raise ValueError(
                f"{self.name} needs per-atom charges: use an atom style with charges (atom_style "
                "charge or full), or give the model fixed charges per element"
            )
        else:
            q = graph.charges.to(graph.rij.dtype)
        return torch.where(present, q, torch.zeros_like(q))

    def check_box(self, pbc: tuple[bool, bool, bool]) -> None:
        pbc = tuple(bool(p) for p in pbc)
        if self.slab is None and not all(pbc):
            raise ValueError(
                f"{self.name} without slab needs a box periodic in x, y and z, got pbc={pbc}: "
                "for boundary p p f set slab (e.g. slab = 3.0, as kspace_modify slab 3.0)"
            )
        if self.slab is not None and pbc != (True, True, False):
            raise ValueError(
                f"{self.name} with slab needs boundary p p f (x and y periodic, z not), "
                f"got pbc={pbc}: leave slab out for a box periodic in x, y and z"
            )

    def _check_geometry(self, graph: LocalGraph) -> None:
        if graph.positions is None or graph.cell is None or graph.pbc is None:
            raise ValueError(f"{self.name} needs positions, cell and periodicity")
        self.check_box(tuple(graph.pbc))
        if self.slab is not None and bool((graph.cell[:2, 2] != 0.0).any()):
            raise ValueError(
                f"{self.name} with slab needs the first two cell vectors in the xy plane, "
                f"got cell={graph.cell.tolist()}"
            )

    def _check_net_charge(self, qsum: float) -> None:
        if abs(qsum) > NET_CHARGE_LIMIT and not self.background:
            raise ValueError(
                f"{self.name}: the system has a net charge of {qsum:.8g} e; make the charges "
                "sum to zero, or set background = true in the model config to add the "
                "neutralizing background (LAMMPS adds it with a warning)"
            )

    def _check_real_space(self, alpha: float, natoms: float, q2: float, volume: float) -> None:
        """An explicit alpha must let the real-space sum reach the requested accuracy
        within the cutoff (a derived one does by construction)."""
        if self.alpha is None or self.accuracy is None or q2 == 0.0:
            return
        cutoff = self.spec.cutoff
        error = real_space_error(alpha, cutoff, natoms, q2, volume) / self.qqr2e
        if error > REAL_SPACE_SLACK * self.accuracy:
            largest = lammps_g_ewald(self.accuracy, cutoff, natoms, q2, volume, self.qqr2e)
            raise ValueError(
                f"{self.name}: real-space cutoff {cutoff:g} too short for alpha {alpha:g} at "
                f"accuracy {self.accuracy:g}: LAMMPS's estimate of the real-space force error "
                f"is {error:.3g} (relative, erfc(alpha rc) = {math.erfc(alpha * cutoff):.3g}); "
                f"lower alpha to about {largest:.6g} or below, raise the cutoff, or leave "
                "alpha out to derive it from the accuracy"
            )

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        checking = not _capture.capturing()
        if checking:
            self._check_geometry(graph)
        dtype, device = graph.rij.dtype, graph.rij.device
        nlocal = graph.nlocal
        q = self._charges(graph)
        q_owned = q[:nlocal]
        cell = graph.cell
        z = self._heights(graph.positions[:nlocal], cell)
        # collective 1: atom count, charge sums and z moments; q and z keep their gradient
        local = torch.stack(
            [
                q_owned.new_full((), float(nlocal)),
                q_owned.sum(),
                (q_owned**2).sum(),
                (q_owned * z).sum(),
                (q_owned * z * z).sum(),
            ]
        )
        totals = graph.comm.allreduce(local.to(torch.float64)).to(dtype)
        if checking:
            alpha, res = self._checked_parameters(cell, totals)
        else:  # given (prepare_capture)
            alpha, res = self.alpha, self.resolution
        qqr2e = self.qqr2e

        energies = torch.zeros(graph.ntotal, dtype=dtype, device=device)
        energies = energies.index_add(
            0, graph.pair_i, 0.5 * qqr2e * self._real_space(graph, q, alpha)
        )

        kcell = self.kspace_cell(cell)
        # the volume of the background and the slab terms enters as a constant: LAMMPS
        # puts neither term into its virial, and neither do we
        volume = cell_inverse(kcell.detach())[0].abs()
        own = -alpha / math.sqrt(math.pi) * q_owned**2
        own = own - math.pi * q_owned * totals[1] / (2.0 * alpha**2 * volume)
        if self.slab is not None:
            own = own + self._slab_correction(q_owned, z, totals, volume, kcell[2, 2].detach())
        # collective 2: the subclass's reciprocal-space sum
        owned = qqr2e * (self._reciprocal(graph, q_owned, kcell, alpha, res) + own)
        return energies + torch.cat([owned, owned.new_zeros(graph.ntotal - nlocal)])

    def _checked_parameters(self, cell: torch.Tensor, totals: torch.Tensor) -> tuple[float, Any]:
        """``alpha`` and the resolution (:meth:`parameters_for`) from the global sums
        ``totals``, read back to the host, after the checks that need them."""
        natoms, qsum, qsqsum = (float(t) for t in totals[:3].detach().cpu())
        self._check_net_charge(qsum)
        cell64 = cell.detach().to(torch.float64)
        alpha, res = self.parameters_for(cell64, natoms, qsqsum)
        self._check_real_space(
            alpha, natoms, qsqsum * self.qqr2e, abs(float(torch.linalg.det(cell64)))
        )
        return alpha, res

    def _real_space(self, graph: LocalGraph, q: torch.Tensor, alpha: float) -> torch.Tensor:
        """``q_i q_j erfc(alpha r) / r`` of each directed pair inside the cutoff."""
        r = graph.rij.norm(dim=1)
        inside = (r < self.spec.cutoff) & (r > 0.0)
        r_safe = torch.where(inside, r, torch.ones_like(r))
        pair = q[graph.pair_i] * q[graph.pair_j] * torch.special.erfc(alpha * r_safe) / r_safe
        return torch.where(inside, pair, torch.zeros_like(pair))

    def _heights(self, positions: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
        """z of each atom for the slab correction, as a function of the fractional
        coordinates against the cell held constant: equal to ``positions[:, 2]`` with the
        same derivative, but unchanged under a strain of box and atoms together, so that
        the correction puts nothing into the virial (as LAMMPS's ``slabcorr``)."""
        if self.slab is None:
            return positions.new_zeros(positions.shape[0])
        fractional = positions @ cell_inverse(cell)[1]
        return (fractional @ cell.detach())[:, 2]

    def _slab_correction(
        self,
        q_owned: torch.Tensor,
        z: torch.Tensor,
        totals: torch.Tensor,
        volume: torch.Tensor,
        height: torch.Tensor,
    ) -> torch.Tensor:
        """Per-atom share of LAMMPS's ``slabcorr`` energy, without ``qqr2e``:
        ``2 pi / V q_i (z_i M - (sum q z^2 + Q z_i^2) / 2 - Q Lz^2 / 12)``; the shares sum
        to ``2 pi / V (M^2 - Q sum q z^2 - Q^2 Lz^2 / 12)``. ``height`` is ``Lz`` of the
        extended box, ``volume`` its volume."""
        qsum, dipole, second = totals[1], totals[3], totals[4]
        share = z * dipole - 0.5 * (second + qsum * z * z) - qsum * height * height / 12.0
        return 2.0 * math.pi / volume * q_owned * share
