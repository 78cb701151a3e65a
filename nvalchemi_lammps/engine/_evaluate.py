from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract import Comm, LocalGraph, NoOpComm
from ..potentials import Potential


@dataclass(frozen=True)
class Evaluation:
    """What goes back to LAMMPS for one rank and one step.

    :param energy: sum of ``atom_energies`` (this rank's share of the potential energy)
    :param atom_energies: ``(nlocal,)`` float64 energies of the owned atoms, on the
        potential's device
    :param pair_forces: ``(npairs, 3)`` float64 ``fij = +dE/drij``, on the potential's
        device; the front door applies
        ``f[i] += fij`` and ``f[j] -= fij``
    """

    energy: float
    atom_energies: torch.Tensor
    pair_forces: torch.Tensor


def potential_device(potential: Potential) -> torch.device:
    """Where the potential's weights live (the CPU for one without any)."""
    for tensor in potential.parameters():
        return tensor.device
    for tensor in potential.buffers():
        return tensor.device
    return torch.device("cpu")


def evaluate(
    potential: Potential,
    nlocal: int,
    species: torch.Tensor,
    pair_i: torch.Tensor,
    pair_j: torch.Tensor,
    rij: torch.Tensor,
    comm: Comm | None = None,
) -> Evaluation:
    """Run ``potential`` on one rank's graph and differentiate its owned energy.

    ``rij`` is float64 as LAMMPS stores positions. It is cast to the potential's dtype here
    and nowhere else, so gradients come back in float64 whatever the potential computes in.
    Every rank runs the same forward and backward, also with zero atoms or pairs, because a
    potential may issue collectives in both.
    """
    if rij.dtype != torch.float64:
        raise TypeError(f"pair vectors must be float64, got {rij.dtype}")
    if not bool(torch.isfinite(rij).all()):
        bad = int((~torch.isfinite(rij).all(dim=1)).nonzero()[0, 0])
        raise ValueError(
            f"non-finite pair vector between atoms {int(pair_i[bad])} and {int(pair_j[bad])} "
            "(NaN or infinite positions)"
        )
    dtype = potential.spec.torch_dtype
    device = potential_device(potential)
    leaf = rij.detach().to(device, non_blocking=True).requires_grad_(True)
    graph = LocalGraph(
        nlocal=nlocal,
        species=species.to(device, non_blocking=True),
        pair_i=pair_i.to(device, non_blocking=True),
        pair_j=pair_j.to(device, non_blocking=True),
        rij=leaf.to(dtype),
        comm=comm or NoOpComm(),
    )
    energies = potential(graph)
    if energies.shape != (graph.ntotal,):
        raise ValueError(
            f"potential '{potential.name}' returned energies of shape {tuple(energies.shape)}, "
            f"wanted ({graph.ntotal},)"
        )
    owned = energies[:nlocal]
    total = owned.sum()
    grad = None
    if total.requires_grad:  # energies that do not depend on any pair vector have no graph
        (grad,) = torch.autograd.grad(total, leaf, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(leaf)
    owned = owned.detach().to(torch.float64)
    return Evaluation(energy=float(owned.sum()), atom_energies=owned, pair_forces=grad)
