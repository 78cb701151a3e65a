"""Which rows a message-passing layer must update, shared by the message-passing potentials.

Only owned rows' energies are used. An owned atom's energy needs its own features after the
last layer, its senders' after the layer before, and so on: a row ``d`` pairs away from the
owned rows (its depth) is needed up to layer ``layers - 1 - d``. So the last layer updates
owned rows only; with the exchange strategy every layer does, since the next exchange
overwrites ghost rows anyway; under the widened shell each layer updates the ghosts still
needed, and the outermost shell only sends. Under ``torch.compile`` the widened shell
updates every row: shapes stay fixed (the owned rows are a slice of fixed length there).

Owned rows lead (LAMMPS's order), so they are a slice: a view to read and a concatenation
to write back, where an index tensor would cost a gather and, in the backward, an
accumulating scatter per layer.
"""

from __future__ import annotations

import torch

from ..contract import LocalGraph

#: Rows of a layer's update: ascending indices, the owned rows (``slice(0, nlocal)``), or
#: ``None``: all
Rows = torch.Tensor | slice | None


def updated_rows(graph: LocalGraph, layers: int) -> list[Rows]:
    """Per layer, the rows whose update is used."""
    if graph.nlocal == graph.ntotal:
        return [None] * layers
    owned = slice(0, graph.nlocal)
    if graph.comm.exchange:
        return [owned] * layers
    if torch.compiler.is_compiling():  # the shell's rows depend on the pairs
        return [None] * layers
    depth = torch.full_like(graph.species, layers)
    depth[: graph.nlocal] = 0
    for _ in range(layers - 1):  # a sender is one deeper than its receiver
        depth = depth.scatter_reduce(0, graph.pair_j, depth[graph.pair_i] + 1, reduce="amin")
    rows = [(depth <= layers - 1 - layer).nonzero()[:, 0] for layer in range(layers - 1)]
    return [None if len(r) == graph.ntotal else r for r in rows] + [owned]


def energy_rows(graph: LocalGraph) -> int:
    """How many leading rows get energies: the owned ones (under ``torch.compile`` with
    the owned padding rows, engine/_compiled.py)."""
    return graph.nlocal


def receiving_pairs(graph: LocalGraph, rows: Rows) -> torch.Tensor | None:
    """Indices of the pairs whose receiver is one of ``rows``, or ``None`` when all are
    (with the exchange strategy receivers are owned rows only)."""
    if rows is None or graph.comm.exchange:
        return None
    receiving = torch.zeros_like(graph.species, dtype=torch.bool)
    receiving[rows] = True
    return receiving[graph.pair_i].nonzero()[:, 0]


def scattered(rows: Rows, values: torch.Tensor, ntotal: int) -> torch.Tensor:
    """``values`` of ``rows`` in ``(ntotal, ...)`` zeros (rows not updated are never read),
    or ``values`` themselves when they are every row's."""
    if rows is None:
        return values
    if isinstance(rows, slice):
        return with_ghost_rows(values, ntotal)
    return values.new_zeros((ntotal, *values.shape[1:])).index_copy(0, rows, values)


def added(x: torch.Tensor, rows: Rows, update: torch.Tensor) -> torch.Tensor:
    """``x`` with ``update`` added to its ``rows`` (all rows for ``None``)."""
    if rows is None:
        return x + update
    if isinstance(rows, slice):
        return torch.cat((x[rows] + update, x[rows.stop :]))
    return x.index_add(0, rows, update)


def with_ghost_rows(x: torch.Tensor, ntotal: int) -> torch.Tensor:
    """Owned rows' ``x`` padded with zero rows to ``ntotal``: energies of ghost rows, which
    nobody reads."""
    if x.shape[0] == ntotal:
        return x
    return torch.cat((x, x.new_zeros((ntotal - x.shape[0], *x.shape[1:]))))
