"""Lennard-Jones 12-6 computed by nvalchemiops's Warp kernels (``nvalchemi-toolkit-ops``).

The physics, parameters and model-file arguments of :class:`LennardJones` (LAMMPS
``lj/cut`` conventions); only the pair energies and their derivatives come from
``nvalchemiops.interactions.lj.lj_energy_forces``.

That kernel takes positions, a cell and a neighbor list, one ``epsilon``/``sigma``/
``cutoff`` per call, and returns per-atom energies and forces. It cannot take pair vectors,
so each directed pair ``k`` becomes two atoms of its own: ``i`` at the origin and ``j`` at
``rij[k]``, one edge ``i -> j`` (full-list mode: half the pair energy and the whole pair
force on ``i``, exactly from ``rij``). A :class:`torch.autograd.Function` hands the pair
energies to autograd and the kernel's forces back as their gradient, so the engine gets
``dE/drij`` as from any potential. Element pairs are separate calls; ``shift`` is added
here (the kernel has none).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..contract import LocalGraph
from ._base import register_potential
from .lennard_jones import LennardJones


def _kernel():
    try:
        import warp as wp
        from nvalchemiops.interactions.lj import lj_energy_forces
    except ImportError as err:
        raise ImportError(
            "potential toolkit_lennard_jones needs nvalchemiops (Warp kernels): "
            f"pip install 'nvalchemi-lammps[toolkit]' ({err})"
        ) from None
    return wp, lj_energy_forces


class _KernelPairEnergies(torch.autograd.Function):
    """Half the LJ energy of each pair vector, by the Warp kernel; backward from its forces."""

    @staticmethod
    def forward(ctx: Any, rij: torch.Tensor, epsilon: float, sigma: float, cutoff: float):
        wp, lj_energy_forces = _kernel()
        n = rij.shape[0]
        f32 = rij.dtype == torch.float32
        index = {"dtype": torch.int32, "device": rij.device}
        # atoms 0..n-1 at the origin, atom n+k at rij[k]; row k has the one edge k -> n+k
        positions = torch.cat([torch.zeros_like(rij), rij]).contiguous()
        pointers = torch.cat([torch.arange(n + 1, **index), torch.full((n,), n, **index)])
        cell = torch.eye(3, dtype=rij.dtype, device=rij.device)[None]
        energies, forces = lj_energy_forces(
            wp.from_torch(positions, dtype=wp.vec3f if f32 else wp.vec3d),
            wp.from_torch(cell, dtype=wp.mat33f if f32 else wp.mat33d),
            epsilon,
            sigma,
            cutoff,
            neighbor_list=wp.from_torch(torch.arange(n, 2 * n, **index)),
            neighbor_ptr=wp.from_torch(pointers),
            neighbor_shifts=wp.from_torch(torch.zeros(n, 3, **index), dtype=wp.vec3i),
            half_neighbor_list=False,
        )
        # the force on i at the origin is -dV/dx_i = +dV/drij of the whole pair energy V
        ctx.save_for_backward(wp.to_torch(forces)[:n])
        return wp.to_torch(energies)[:n].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        (dv_drij,) = ctx.saved_tensors
        return 0.5 * grad[:, None] * dv_drij, None, None, None


@register_potential
class ToolkitLennardJones(LennardJones):
    """:class:`LennardJones` evaluated by nvalchemiops's Warp LJ kernel.

    Same arguments, same model-file configuration, same results to rounding (the kernel
    writes ``4 eps ((sig/r)^12 - (sig/r)^6)``, ``lj/cut`` ``r^-6 (lj3 r^-6 - lj4)``).
    Needs ``nvalchemi-toolkit-ops`` (``pip install 'nvalchemi-lammps[toolkit]'``); the
    kernels are compiled by Warp on first use and cached (``~/.cache/warp``).
    """

    name = "toolkit_lennard_jones"

    def _check_backend(self) -> None:
        _kernel()  # fail at construction, not in the middle of a run

    def prepare_compile(self) -> LennardJones:
        raise ValueError(
            f"the {self.name} model cannot be compiled (Warp kernels; the lennard_jones "
            "model computes the same in torch and can)"
        )

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        si = graph.species[graph.pair_i]
        sj = graph.species[graph.pair_j]
        half_pair = torch.zeros(graph.npairs, dtype=graph.rij.dtype, device=graph.rij.device)
        eps, sig, cut = self.pair_tables
        for a, b in itertools.combinations_with_replacement(range(len(eps)), 2):
            selected = torch.nonzero(((si == a) & (sj == b)) | ((si == b) & (sj == a)))[:, 0]
            if eps[a][b] == 0.0 or selected.numel() == 0:
                continue
            rij = graph.rij[selected]
            energy = _KernelPairEnergies.apply(rij, eps[a][b], sig[a][b], cut[a][b])
            half_pair = half_pair.index_put((selected,), energy)
        # pair_modify shift: the same constant for every pair inside its cutoff
        mapped = (si >= 0) & (sj >= 0)
        si, sj = si.clamp(min=0), sj.clamp(min=0)
        inside = mapped & ((graph.rij * graph.rij).sum(dim=1) < self.cutsq[si, sj])
        half_pair = half_pair - torch.where(inside, 0.5 * self.offset[si, sj], 0.0)
        energies = torch.zeros(graph.ntotal, dtype=graph.rij.dtype, device=graph.rij.device)
        return energies.index_add(0, graph.pair_i, half_pair)
