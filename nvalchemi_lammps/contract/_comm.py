from __future__ import annotations

import torch


class Comm:
    """Collectives across the ranks of one LAMMPS run.

    Every rank must call the same sequence of collectives every step, also a rank that owns
    no atoms, or the run deadlocks.
    """

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        """Return a copy of ``src`` (rows = owned + ghost atoms) whose ghost rows hold their
        owners' rows."""
        raise NotImplementedError

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        """Return a copy of ``src`` with ghost rows summed into their owners' rows and ghost
        rows zeroed."""
        raise NotImplementedError

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over all ranks."""
        raise NotImplementedError


class NoOpComm(Comm):
    """A single process whose graph has no ghost atoms: every collective is the identity."""

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return src

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return src

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return x
