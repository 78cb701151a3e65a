"""The contract's :class:`~nvalchemi_lammps.contract.Comm` over LAMMPS's own communication.

The plugin passes a ``LammpsCollectives`` object (C++, python_bridge.cpp) into each compute
call; its methods work in place on float64 host rows. Here they become differentiable: the
backward of a forward exchange is a reverse exchange and vice versa, and the backward of an
all-reduce is an all-reduce. Tensors on a GPU or in float32 are staged through a float64
host copy (one device-to-host and one host-to-device copy per exchange).

When every ghost is an image of an atom this rank owns (always so on one rank), the pair
style sends each row's owner instead, and the exchanges stay on the model's device: a
gather from the owners and a sum into them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contract import Comm, with_adjoint


def _exchanged(operation: Any, src: torch.Tensor) -> torch.Tensor:
    # the width from the shape, not reshape(-1): a rank without atoms has zero rows
    width = math.prod(src.shape[1:])
    rows = src.detach().reshape(src.shape[0], width)
    rows = rows.to(device="cpu", dtype=torch.float64, copy=True).contiguous()
    operation(memoryview(rows.numpy()), int(rows.shape[1]))
    return rows.to(device=src.device, dtype=src.dtype).reshape(src.shape)


def _summed(collectives: Any, x: torch.Tensor) -> torch.Tensor:
    values = x.detach().reshape(-1).to(device="cpu", dtype=torch.float64, copy=True)
    collectives.allreduce(memoryview(values.contiguous().numpy()))
    return values.to(device=x.device, dtype=x.dtype).reshape(x.shape)


class LammpsComm(Comm):
    """Collectives of one ``pair_style nvalchemi`` compute call.

    :param collectives: the plugin's ``LammpsCollectives`` object
    :param exchange: ``False`` under the widened-shell strategy, where ghost rows are
        computed locally and the exchanges are the identity (the all-reduce stays real)
    :param owner: ``(ntotal,)`` int64 owned row of every row, on the model's device, when
        all ranks' ghosts are images of their own atoms; else ``None`` (through LAMMPS)
    """

    def __init__(
        self, collectives: Any, exchange: bool = True, owner: torch.Tensor | None = None
    ) -> None:
        self.collectives = collectives
        self.exchange = exchange
        self.owner = owner

    def forward_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return with_adjoint(src, self._forward, self._reverse) if self.exchange else src

    def reverse_exchange(self, src: torch.Tensor) -> torch.Tensor:
        return with_adjoint(src, self._reverse, self._forward) if self.exchange else src

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return with_adjoint(x, self._sum, self._sum)

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        if self.owner is not None:
            return src.index_select(0, self.owner.to(src.device))
        return _exchanged(self.collectives.forward_exchange, src)

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        if self.owner is not None:
            # owned rows map to themselves, so ghost rows end up zero
            return torch.zeros_like(src).index_add_(0, self.owner.to(src.device), src)
        return _exchanged(self.collectives.reverse_exchange, src)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return _summed(self.collectives, x)
