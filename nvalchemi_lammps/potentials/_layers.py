"""Which rows a message-passing layer must update, shared by the message-passing potentials.

An owned atom's energy needs its own features after the last layer and its senders' before
it. Ghost rows' energies are never used, so the last layer updates owned rows only; with
the exchange strategy every layer does, since the next exchange overwrites ghost rows
anyway. Under the widened shell, ghosts compute their own features in every layer but the
last. Under ``torch.compile`` every row is updated: shapes stay fixed.
"""

from __future__ import annotations

import torch

from ..contract import LocalGraph


def updated_rows(graph: LocalGraph, last_layer: bool) -> int:
    """How many leading rows (owned rows come first) a layer must update."""
    if torch.compiler.is_compiling():
        return graph.ntotal
    return graph.nlocal if last_layer or graph.comm.exchange else graph.ntotal


def receiving_pairs(graph: LocalGraph, rows: int) -> torch.Tensor | None:
    """Indices of the pairs whose receiver is one of the first ``rows`` rows, or ``None``
    when all are (a single process; the exchange strategy lists owned receivers only)."""
    if rows == graph.ntotal or graph.comm.exchange:
        return None
    return (graph.pair_i < rows).nonzero()[:, 0]


def with_ghost_rows(x: torch.Tensor, ntotal: int) -> torch.Tensor:
    """``x`` (leading rows) padded with zero rows to ``ntotal``: ghost rows to be
    overwritten by an exchange, or ghost energies nobody reads."""
    if x.shape[0] == ntotal:
        return x
    return torch.cat((x, x.new_zeros((ntotal - x.shape[0], *x.shape[1:]))))
