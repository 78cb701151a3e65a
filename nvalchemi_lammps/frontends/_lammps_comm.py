"""The contract's :class:`~nvalchemi_lammps.contract.Comm` over LAMMPS's own communication.

The plugin passes a ``LammpsCollectives`` object (C++, python_bridge.cpp) into each compute
call; its methods work in place on float64 host rows. Here they become differentiable: the
backward of a forward exchange is a reverse exchange and vice versa, and the backward of an
all-reduce is an all-reduce. Tensors on a GPU or in float32 are staged through a float64
host copy (one device-to-host and one host-to-device copy per exchange).

Under the pair style the exchanges follow its exchange plan (:class:`ExchangePlan`, made at
each neighbor-list build): a ghost of an atom this rank owns gathers from it on the model's
device, a ghost of a remote atom from one row per distinct remote atom, received from its
rank. Only those rows cross between ranks, staged through pinned host buffers in the
model's own precision (the exchanges copy values, so this is exact).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..contract import AdjointComm


def _exchanged(operation: Any, src: torch.Tensor) -> torch.Tensor:
    # the width from the shape, not reshape(-1): a rank without atoms has zero rows
    width = math.prod(src.shape[1:])
    rows = src.detach().reshape(src.shape[0], width)
    rows = rows.to(device="cpu", dtype=torch.float64, copy=True).contiguous()
    operation(memoryview(rows.numpy()), int(rows.shape[1]))
    return rows.to(device=src.device, dtype=src.dtype).reshape(src.shape)


def gathered(src: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The forward exchange by origin: row ``k`` of the result is ``src[rows[k]]``."""
    return src.index_select(0, rows.to(src.device))


def summed_into(src: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """The reverse exchange by origin: ``count`` rows, row ``rows[k]`` the sum of every
    ``src[k]`` that names it (rows named by none stay zero)."""
    return src.new_zeros((count, *src.shape[1:])).index_add_(0, rows.to(src.device), src)


def exchanged_into(src: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor, forward: bool):
    """:func:`gathered` (``forward``) or :func:`summed_into` of ``src``, written straight
    into ``dst`` of its shape and dtype, outside autograd (:meth:`Comm.exchange_into
    <nvalchemi_lammps.contract.Comm.exchange_into>`)."""
    with torch.no_grad():
        if forward:
            torch.index_select(src, 0, rows.to(src.device), out=dst)
        else:
            dst.zero_().index_add_(0, rows.to(src.device), src)


def summed_over_ranks(collectives: Any, x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over ranks by ``collectives.allreduce``, in float64 on the host."""
    values = x.detach().reshape(-1).to(device="cpu", dtype=torch.float64, copy=True)
    collectives.allreduce(memoryview(values.contiguous().numpy()))
    return values.to(device=x.device, dtype=x.dtype).reshape(x.shape)


@dataclass
class ExchangePlan:
    """Where exchanged rows come from, from the pair style's last neighbor-list build.

    :param nlocal: owned rows
    :param gather: ``(ntotal,)`` int64, on the model's device: the row of ``[owned rows,
        received rows]`` each row copies (owned rows themselves)
    :param send: ``(nsend,)`` int64, on the model's device: the owned rows other ranks
        receive, in the order the transfer sends them
    :param nrecv: rows received from other ranks
    :param remote: more than one rank: the transfer is collective, so every rank calls it
    """

    nlocal: int
    gather: torch.Tensor
    send: torch.Tensor
    nrecv: int
    remote: bool


def _clocked(operation: Any, timings: dict[str, float]) -> Any:
    """``operation``, adding its wall time to ``timings["collectives"]``."""

    def clocked(src: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return operation(src)
        finally:
            timings["collectives"] = timings.get("collectives", 0.0) + time.perf_counter() - start

    return clocked


class PlanComm(AdjointComm):
    """Exchanges by the pair style's :class:`ExchangePlan` (both pair styles): a ghost of an
    atom owned here gathers from it on the model's device, a ghost of a remote atom from
    the one row per distinct remote atom that ``collectives.transfer`` brings from its rank,
    staged through ``buffer``'s host tensors in the model's precision. Without a plan,
    :meth:`_forward_all` and :meth:`_reverse_all` (the door's own communication).

    :param collectives: the pair style's collectives (``transfer``, ``allreduce``, ...)
    :param exchange: ``False`` under the widened-shell strategy, where ghost rows are
        computed locally and the exchanges are the identity (the all-reduce stays real)
    :param plan: the exchange plan of the last neighbor-list build, or ``None``
    :param buffer: ``buffer(name, shape, dtype)``, a reusable (pinned, for a GPU) host tensor
    :param timings: where to add the seconds spent in collectives (``"collectives"``), or
        ``None`` (:attr:`PluginSession.timings <nvalchemi_lammps.frontends.plugin.
        PluginSession.timings>`)
    """

    def __init__(
        self,
        collectives: Any,
        exchange: bool = True,
        plan: ExchangePlan | None = None,
        buffer: Any = None,
        timings: dict[str, float] | None = None,
    ) -> None:
        self.collectives = collectives
        self.exchange = exchange
        self.plan = plan
        self.buffer = buffer
        self.one_rank = plan is not None and not plan.remote
        if timings is not None:  # both directions: each is the other's adjoint
            self._forward, self._reverse, self._sum = (
                _clocked(op, timings) for op in (self._forward, self._reverse, self._sum)
            )

    def local_owners(self, device: torch.device) -> torch.Tensor | None:
        plan = self.plan
        return plan.gather.to(device) if plan is not None and not plan.remote else None

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        if plan is None:
            return self._forward_all(src)
        rows = src[: plan.nlocal]
        if plan.remote:
            sent = src.index_select(0, plan.send.to(src.device))
            rows = torch.cat((rows, self._transfer(sent, plan.nrecv, reverse=False)))
        return gathered(rows, plan.gather)

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        if plan is None:
            return self._reverse_all(src)
        if not plan.remote:  # every row's source is owned here; ghost rows end up zero
            return summed_into(src, plan.gather, src.shape[0])
        rest = src.shape[1:]
        summed = summed_into(src, plan.gather, plan.nlocal + plan.nrecv)
        send = plan.send.to(src.device)
        owned = summed[: plan.nlocal].index_add(
            0, send, self._transfer(summed[plan.nlocal :], send.shape[0], reverse=True)
        )
        return torch.cat((owned, src.new_zeros((src.shape[0] - plan.nlocal, *rest))))

    def _forward_all(self, src: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _reverse_all(self, src: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _transfer(self, rows: torch.Tensor, count: int, reverse: bool) -> torch.Tensor:
        """``rows`` to the ranks the plan names; ``count`` rows come back from them."""
        rest = rows.shape[1:]
        width = math.prod(rest)
        if width == 0:
            return rows.new_zeros((count, *rest))
        # the model's precision on the wire, when MPI has it: the rows are only copied
        wire = rows.dtype if rows.dtype in (torch.float32, torch.float64) else torch.float64
        flat = rows.detach().reshape(rows.shape[0], width).to(wire)
        if self.buffer is None:
            send = flat.to("cpu").contiguous()
            recv = torch.empty((count, width), dtype=wire)
        else:
            send = self.buffer("send", flat.shape, wire)
            send.copy_(flat)
            recv = self.buffer("recv", (count, width), wire)
            if rows.device.type == "cuda":
                # the last transfer's copy out of recv has finished before MPI overwrites it
                torch.cuda.current_stream(rows.device).synchronize()
        self.collectives.transfer(
            memoryview(send.numpy()), memoryview(recv.numpy()), width, reverse
        )
        out = recv.to(rows.device, non_blocking=True) if rows.is_cuda else recv.clone()
        return out.to(rows.dtype).reshape(count, *rest)


class LammpsComm(PlanComm):
    """Collectives of one ``pair_style nvalchemi`` compute call (:class:`PlanComm`'s
    parameters): by the exchange plan, or without one every row through LAMMPS's own
    forward and reverse communication, staged in float64 on the host."""

    def _forward_all(self, src: torch.Tensor) -> torch.Tensor:
        return _exchanged(self.collectives.forward_exchange, src)

    def _reverse_all(self, src: torch.Tensor) -> torch.Tensor:
        return _exchanged(self.collectives.reverse_exchange, src)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return summed_over_ranks(self.collectives, x)
