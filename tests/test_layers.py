"""Which rows a message-passing layer updates (``potentials/_layers.py``): the owned rows in
the last layer and, with the exchange, in every layer; under the widened shell the ghosts
still needed, never the outermost shell. The tests of the potentials check that the numbers
stay the reference's; these check that the work really shrinks."""

from __future__ import annotations

from collections import defaultdict, deque

import torch
from _systems import decompose, decompose_shell, fcc_argon

from nvalchemi_lammps import LocalGraph
from nvalchemi_lammps.contract import Comm
from nvalchemi_lammps.potentials._layers import updated_rows

CUTOFF, LAYERS = 4.0, 3


class Exchanging(Comm):
    exchange = True


def _hops(rank) -> torch.Tensor:
    """Pair hops from the owned rows to every row (receiver to sender) by a plain
    breadth-first search, independent of the scatter in ``_layers``."""
    senders = defaultdict(list)
    for i, j in zip(rank.pair_i.tolist(), rank.pair_j.tolist()):
        senders[i].append(j)
    hops = dict.fromkeys(range(rank.nlocal), 0)
    queue = deque(hops)
    while queue:
        i = queue.popleft()
        for j in senders[i]:
            if j not in hops:
                hops[j] = hops[i] + 1
                queue.append(j)
    return torch.tensor([hops.get(k, LAYERS) for k in range(rank.ntotal)])


def test_shell_updates_only_the_ghosts_still_needed():
    rank = decompose_shell(fcc_argon(), CUTOFF, LAYERS, 2)[0]
    plan = updated_rows(rank.local_graph(), LAYERS)
    hops = _hops(rank)
    for layer, rows in enumerate(plan):
        wanted = (hops <= LAYERS - 1 - layer).nonzero()[:, 0]
        got = torch.arange(rank.ntotal)[rows]  # indices or the owned rows' slice
        assert rows is not None and torch.equal(got, wanted), layer
    assert len(plan[0]) < rank.ntotal  # the outermost shell only sends
    assert plan[-1] == slice(0, rank.nlocal)  # owned rows lead: a view, not a gather


def test_exchange_updates_owned_rows_only():
    rank = decompose(fcc_argon(), CUTOFF, 2)[0]
    assert rank.ntotal > rank.nlocal
    plan = updated_rows(rank.local_graph(Exchanging()), LAYERS)
    assert plan == [slice(0, rank.nlocal)] * LAYERS


def test_single_process_updates_every_row():
    rank = decompose(fcc_argon(), CUTOFF, 1)[0]
    graph = rank.local_graph()
    graph = LocalGraph(graph.ntotal, graph.species, graph.pair_i, graph.pair_j, graph.rij)
    assert updated_rows(graph, LAYERS) == [None] * LAYERS
