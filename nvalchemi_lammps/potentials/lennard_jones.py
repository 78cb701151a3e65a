"""Lennard-Jones 12-6 with LAMMPS ``pair_style lj/cut`` conventions."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from ..contract import LocalGraph, ModelSpec
from ._base import Potential, register_potential

#: ``pair_modify mix`` rules of LAMMPS (``Pair::mix_energy`` / ``Pair::mix_distance``).
MIXING_RULES = ("geometric", "arithmetic", "sixthpower")


def _mix(rule: str, eps_i: float, eps_j: float, sig_i: float, sig_j: float) -> tuple[float, float]:
    if rule == "geometric":
        return math.sqrt(eps_i * eps_j), math.sqrt(sig_i * sig_j)
    if rule == "arithmetic":
        return math.sqrt(eps_i * eps_j), 0.5 * (sig_i + sig_j)
    s6i, s6j = sig_i**6, sig_j**6
    eps = 2.0 * math.sqrt(eps_i * eps_j) * sig_i**3 * sig_j**3 / (s6i + s6j)
    return eps, (0.5 * (s6i + s6j)) ** (1.0 / 6.0)


def _squared_lengths(rij: torch.Tensor) -> torch.Tensor:
    """``|rij|^2`` as lj/cut sums it, column by column: several times faster than
    ``(rij * rij).sum(dim=1)``, whose reduction over rows of three is slow on the CPU, and
    in three passes over the pairs instead of five (``x * x + y * y + z * z``)."""
    x, y, z = rij.unbind(1)
    rsq = x * x
    return rsq.addcmul_(y, y).addcmul_(z, z)


@register_potential
class LennardJones(Potential):
    """``E = sum_{i<j} 4 eps_ij [(sig_ij/r)^12 - (sig_ij/r)^6] - offset_ij`` for r < rc_ij.

    Unlike pairs take ``eps``/``sig`` from the mixing rule unless ``pairs`` sets them, as
    ``pair_coeff`` after ``pair_modify mix`` does in LAMMPS. The pair cutoff is the pair's
    own ``cutoff`` if given, else the global ``cutoff`` (LAMMPS mixes per-type cutoffs; here
    they are per pair). With ``shift`` the energy is shifted to zero at each pair's cutoff
    (``pair_modify shift yes``).

    :param elements: element names
    :param epsilon: well depth per element (energy unit of ``units``)
    :param sigma: zero-crossing distance per element (length unit of ``units``)
    :param cutoff: global cutoff
    :param pairs: explicit parameters for element pairs: dicts with ``elements`` (two
        names) and any of ``epsilon``, ``sigma``, ``cutoff``
    :param mixing: ``geometric`` (LAMMPS default), ``arithmetic`` or ``sixthpower``
    :param shift: shift pair energies to zero at the cutoff
    :param units: ``metal`` (eV, Angstrom) or ``real`` (kcal/mol, Angstrom)
    :param dtype: ``float64`` or ``float32``
    """

    name = "lennard_jones"
    # eps, sig and cutoff of the unordered element pair, a function of |rij|: lj/cut's
    # half neighbor list works as well
    symmetric_pair_terms = True

    def __init__(
        self,
        elements: list[str],
        epsilon: dict[str, float],
        sigma: dict[str, float],
        cutoff: float,
        pairs: list[dict[str, Any]] | None = None,
        mixing: str = "geometric",
        shift: bool = False,
        units: str = "metal",
        dtype: str = "float64",
    ) -> None:
        super().__init__()
        if mixing not in MIXING_RULES:
            raise ValueError(f"mixing must be one of {', '.join(MIXING_RULES)}; got '{mixing}'")
        for table, what in ((epsilon, "epsilon"), (sigma, "sigma")):
            missing = [e for e in elements if e not in table]
            if missing:
                raise ValueError(f"{what} missing for element(s) {', '.join(missing)}")
        pairs = [dict(p) for p in (pairs or [])]
        index = {e: k for k, e in enumerate(elements)}
        n = len(elements)
        eps = [[0.0] * n for _ in range(n)]
        sig = [[0.0] * n for _ in range(n)]
        cut = [[float(cutoff)] * n for _ in range(n)]
        for a, b in itertools.product(range(n), repeat=2):
            ea, eb = elements[a], elements[b]
            eps[a][b], sig[a][b] = _mix(mixing, epsilon[ea], epsilon[eb], sigma[ea], sigma[eb])
        for pair in pairs:
            names = pair.get("elements", ())
            unknown = [e for e in names if e not in index]
            if len(names) != 2 or unknown:
                raise ValueError(f"pair entry {pair} must name two of the elements {elements}")
            extra = set(pair) - {"elements", "epsilon", "sigma", "cutoff"}
            if extra:
                raise ValueError(f"unknown pair parameter(s) {', '.join(sorted(extra))}")
            a, b = index[names[0]], index[names[1]]
            for k, table in (("epsilon", eps), ("sigma", sig), ("cutoff", cut)):
                if k in pair:
                    table[a][b] = table[b][a] = float(pair[k])
        max_cut = max((max(row) for row in cut), default=float(cutoff))
        self.spec = ModelSpec(elements=tuple(elements), cutoff=max_cut, units=units, dtype=dtype)
        self._config = {
            "elements": list(elements),
            "epsilon": {e: float(epsilon[e]) for e in elements},
            "sigma": {e: float(sigma[e]) for e in elements},
            "cutoff": float(cutoff),
            "pairs": pairs,
            "mixing": mixing,
            "shift": bool(shift),
            "units": units,
            "dtype": dtype,
        }
        # Same coefficients as lj/cut's init_one: lj3 = 4 eps sig^12, lj4 = 4 eps sig^6.
        f64 = torch.float64
        eps_t, sig_t, cut_t = (torch.tensor(t, dtype=f64) for t in (eps, sig, cut))
        lj3 = 4.0 * eps_t * sig_t**12
        lj4 = 4.0 * eps_t * sig_t**6
        offset = torch.zeros_like(lj3)
        if shift:
            ratio6 = (sig_t / cut_t) ** 6
            offset = 4.0 * eps_t * (ratio6 * ratio6 - ratio6)
        dt = self.spec.torch_dtype
        self.register_buffer("lj3", lj3.to(dt))
        self.register_buffer("lj4", lj4.to(dt))
        self.register_buffer("offset", offset.to(dt))
        self.register_buffer("cutsq", (cut_t * cut_t).to(dt))
        #: ``epsilon``, ``sigma`` and cutoff of every element pair (mixing rule, then ``pairs``)
        self.pair_tables = (eps, sig, cut)
        self._check_backend()

    def _check_backend(self) -> None:
        """Refuse construction when what evaluates the energy is missing (a subclass's
        kernels); here plain torch, always there."""

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def prepare_compile(self) -> Potential:
        # pairs beyond their cutoff and NULL atoms already carry no energy
        return self

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        rsq = _squared_lengths(graph.rij)
        r2inv = 1.0 / rsq
        r6inv = r2inv * r2inv * r2inv
        lj3, lj4, offset, inside = self._pair_parameters(graph, rsq, single=False)
        pair_energy = torch.where(inside, r6inv * (lj3 * r6inv - lj4) - offset, 0.0)
        # Each directed pair carries half the pair energy to its receiver.
        energies = torch.zeros(graph.ntotal, dtype=graph.rij.dtype, device=graph.rij.device)
        return energies.index_add(0, graph.pair_i, 0.5 * pair_energy)

    def pair_terms(self, graph: LocalGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """Half of lj/cut's pair energy and of its ``-forcelj * r2inv`` per directed pair,
        computed in place: a few passes over the pairs, nothing for autograd."""
        r2inv = _squared_lengths(graph.rij)
        lj3, lj4, offset, inside = self._pair_parameters(graph, r2inv, single=True)
        r2inv.reciprocal_()
        r6inv = r2inv * r2inv
        r6inv *= r2inv
        share = (0.5 * lj3) * r6inv
        share -= 0.5 * lj4
        share *= r6inv
        share -= 0.5 * offset
        # lj/cut's forcelj = r6inv (lj1 r6inv - lj2), lj1 = 12 lj3, lj2 = 6 lj4
        derivative = (-6.0 * lj3) * r6inv
        derivative += 3.0 * lj4
        derivative *= r6inv
        derivative *= r2inv
        if inside is not None:
            share = torch.where(inside, share, 0.0)
            derivative = torch.where(inside, derivative, 0.0)
        return share, derivative

    def _pair_parameters(self, graph: LocalGraph, rsq: torch.Tensor, single: bool) -> tuple:
        """``lj3, lj4, offset`` per pair and which pairs carry energy: those within their
        pair's cutoff whose atoms are both of mapped types (species >= 0). With ``single``
        (eager code only) one element's parameters stay scalars, and ``inside`` is ``None``
        when every pair does: all pairs are within the model's cutoff (the contract), which
        is the element's own, and no atom has species -1."""
        if single and self.lj3.numel() == 1:
            lj3, lj4, offset = self.lj3[0, 0], self.lj4[0, 0], self.offset[0, 0]
            if not bool((graph.species < 0).any()):
                return lj3, lj4, offset, None
            mapped = graph.species >= 0
            return lj3, lj4, offset, mapped[graph.pair_i] & mapped[graph.pair_j]
        si, sj = graph.species[graph.pair_i], graph.species[graph.pair_j]
        lj3, lj4, offset = self.lj3[si, sj], self.lj4[si, sj], self.offset[si, sj]
        inside = (rsq < self.cutsq[si, sj]) & (si >= 0) & (sj >= 0)
        return lj3, lj4, offset, inside
