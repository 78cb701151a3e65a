from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TensorOp = Callable[[torch.Tensor], torch.Tensor]


class _WithAdjoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, src: torch.Tensor, op: TensorOp, adjoint: TensorOp) -> torch.Tensor:
        ctx.adjoint = adjoint
        return op(src)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.adjoint(grad), None, None


def with_adjoint(src: torch.Tensor, op: TensorOp, adjoint: TensorOp) -> torch.Tensor:
    """``op(src)``, differentiable with ``adjoint`` as its backward.

    The exchanges are each other's adjoints (the backward of a forward exchange is a
    reverse exchange and vice versa) and a sum over ranks is its own: a front door
    implements the raw operations, this makes them differentiable.
    """
    return _WithAdjoint.apply(src, op, adjoint)


class Comm:
    """Collectives across the ranks of one LAMMPS run.

    Every rank must call the same sequence of collectives every step, also a rank that owns
    no atoms, or the run deadlocks.
    """

    #: ``forward_exchange`` overwrites every ghost row with its owner's (the exchange
    #: strategy): a message-passing potential then updates owned rows only. ``False`` where
    #: ghost rows are computed locally (the widened shell) or there are none.
    exchange: bool = False

    #: this is the only rank: :meth:`allreduce` is the identity
    one_rank: bool = False

    def local_owners(self, device: torch.device) -> torch.Tensor | None:
        """``(ntotal,)`` int64 on ``device``: the row each row's forward exchange copies,
        when every ghost's owner is on this rank (one rank); the exchanges are then a
        gather and a sum on the device, which a CUDA graph can hold. ``None`` (the default):
        they cross ranks, or the front door exchanges otherwise."""
        return None

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

    def exchange_into(self, src: torch.Tensor, dst: torch.Tensor, forward: bool) -> None:
        """Write the forward (or reverse) exchange of ``src`` into ``dst`` (same shape),
        outside autograd: for a model that wraps the exchanges in an autograd function of
        its own (mace-torch's ``LAMMPS_MP`` calls it in its forward and backward)."""
        with torch.no_grad():
            dst.copy_(self.forward_exchange(src) if forward else self.reverse_exchange(src))


class AdjointComm(Comm):
    """A :class:`Comm` made differentiable from a front door's raw operations: ``_forward``
    (ghost rows take their owners'), ``_reverse`` (ghost rows summed into their owners) and
    ``_sum`` (over ranks), none of which needs to know autograd. The exchanges are the
    identity when ``exchange`` is ``False`` (the widened shell computes ghost rows)."""

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return with_adjoint(src, self._forward, self._reverse) if self.exchange else src

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return with_adjoint(src, self._reverse, self._forward) if self.exchange else src

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return with_adjoint(x, self._sum, self._sum)

    def exchange_into(self, src: torch.Tensor, dst: torch.Tensor, forward: bool) -> None:
        if not self.exchange:
            dst.copy_(src)
        else:
            dst.copy_((self._forward if forward else self._reverse)(src.detach()))

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class NoOpComm(AdjointComm):
    """A single process whose graph has no ghost atoms: every collective is the identity
    (``exchange`` is ``False``)."""

    one_rank = True

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return x
