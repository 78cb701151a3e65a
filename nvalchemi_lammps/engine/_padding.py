"""One rank's graph padded to fixed capacities: what both the compiled potential
(``torch.compile``) and the captured one (CUDA graphs) run on.

A compiled or captured graph is specialized to its input shapes, and an MD run changes them
all the time: each rank's ghost count and pair count move a little with every neighbor-list
build. Padded to capacities with headroom, of owned rows, of ghost rows and of pairs, the
shapes stay the same from step to step. The padded rows are the owned ones, owned padding up
to the owned capacity, the ghosts, ghost padding: the owned rows stay a leading slice of a
fixed length, so a potential computes energies, and with the exchange strategy every
layer's features, on those rows only, as it does eagerly, instead of on every row. Padding
atoms have species -1; padding pairs join owned padding atoms to themselves (spread over
them: scattering every padding pair into one row would serialize on atomics) with a pair
vector longer than the cutoff. A potential that can run this way
(:meth:`Potential.prepare_compile
<nvalchemi_lammps.potentials.Potential.prepare_compile>`) gives such atoms and pairs zero
energy and zero gradient, so padding changes nothing but the shapes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..contract import Comm, LocalGraph, Potential


def _capacity(count: int, headroom: float, old: int = 0, growth: float = 1.0) -> int:
    # a multiple of 64 rows above count + headroom (at least one padding row), and at least
    # growth x the old capacity
    return 64 * math.ceil(max(count * (1.0 + headroom) + 1, old * growth) / 64)


@dataclasses.dataclass
class Capacities:
    """Rows and pairs the padded graphs hold: the first graph's sizes times ``1 + headroom``
    (a neighbor-list build moves them by a few percent), grown by at least ``growth`` (so
    geometrically: a bounded number of captures or compilations per run) when a graph
    outgrows them, never shrunk.

    There is always one owned padding row (the padding pairs' atom) and one padding pair,
    also on a rank without pairs: every rank's padded graph then reads the rows that it
    exchanges, and none drops an exchange (whose result nothing would read) that the other
    ranks wait for.
    """

    headroom: float = 0.05
    growth: float = 1.25
    owned: int = 0
    ghosts: int = 0
    pairs: int = 0

    @property
    def atoms(self) -> int:
        """Rows of the padded graphs: the owned capacity plus the ghost capacity."""
        return self.owned + self.ghosts

    def fit(self, graph: LocalGraph) -> bool:
        """Grow to hold ``graph``; whether anything grew."""
        nlocal, nghost, npairs = graph.nlocal, graph.ntotal - graph.nlocal, graph.npairs
        before = (self.owned, self.ghosts, self.pairs)
        h, g = self.headroom, self.growth
        if nlocal >= self.owned:
            self.owned = _capacity(nlocal, h, self.owned, g)
        if nghost > self.ghosts:
            self.ghosts = _capacity(nghost, h, self.ghosts, g)
        if npairs >= self.pairs:
            self.pairs = _capacity(npairs, h, self.pairs, g)
        return (self.owned, self.ghosts, self.pairs) != before


def laid_out(t: torch.Tensor, nlocal: int, owned: int, rows: int, fill: float) -> torch.Tensor:
    """Per-atom rows padded: owned rows, ``fill`` up to ``owned``, ghost rows, ``fill`` up to
    ``rows``."""
    ghosts = t.shape[0] - nlocal

    def pad(n: int) -> torch.Tensor:
        return t.new_full((n, *t.shape[1:]), fill)

    return torch.cat((t[:nlocal], pad(owned - nlocal), t[nlocal:], pad(rows - owned - ghosts)))


def padded_owner_rows(owners: torch.Tensor, nlocal: int, capacities: Capacities) -> torch.Tensor:
    """The rows a forward exchange copies (``owners``: ``(ntotal,)``, every one owned, on one
    rank) in the padded layout; padding rows copy themselves."""
    owned, atoms = capacities.owned, capacities.atoms
    rows = torch.arange(atoms, device=owners.device)
    nghost = owners.shape[0] - nlocal
    rows[:nlocal] = owners[:nlocal]
    rows[owned : owned + nghost] = owners[nlocal:]  # owned rows keep their numbers
    return rows


def padded(graph: LocalGraph, capacities: Capacities, cutoff: float, comm: Comm) -> LocalGraph:
    """``graph`` padded to ``capacities`` (which hold it), with ``comm`` as its collectives;
    the pair order is kept (padding pairs come last)."""
    nlocal, nghost, npairs = graph.nlocal, graph.ntotal - graph.nlocal, graph.npairs
    owned, atoms, pairs = capacities.owned, capacities.atoms, capacities.pairs
    shift = owned - nlocal
    padding = nlocal + torch.arange(pairs - npairs, device=graph.pair_i.device) % shift

    def placed(index: torch.Tensor) -> torch.Tensor:
        moved = index + shift * (index >= nlocal) if nghost else index  # ghosts' rows
        return torch.cat((moved, padding))

    def rows(t: torch.Tensor | None, fill: float) -> torch.Tensor | None:
        return None if t is None else laid_out(t, nlocal, owned, atoms, fill)

    far = graph.rij.new_zeros(pairs - npairs, 3)
    far[:, 0] = 2.0 * cutoff + 1.0
    return dataclasses.replace(
        graph,
        nlocal=owned,
        species=rows(graph.species, -1),
        pair_i=placed(graph.pair_i),
        pair_j=placed(graph.pair_j),
        rij=torch.cat((graph.rij, far)),
        comm=comm,
        positions=rows(graph.positions, 0),
        charges=rows(graph.charges, 0),
    )


def unpadded(energies: torch.Tensor, nlocal: int, nghost: int, owned: int) -> torch.Tensor:
    """Per-row energies of a padded graph back in the graph's own rows."""
    return torch.cat((energies[:nlocal], energies[owned : owned + nghost]))


class PaddedPotential(Potential):
    """What a compiled and a captured potential share: the potential they run (``inner``,
    prepared for padded graphs), standing in for it (name, spec, checks), and the
    capacities its graphs are padded to."""

    def __init__(self, inner: Potential, like: Potential, capacities: Capacities) -> None:
        super().__init__()
        self.inner = inner
        self.name = like.name
        self.spec = like.spec
        self.system_state = like.system_state
        self.periodicity = like.periodicity
        self.capacities = capacities

    def config(self) -> dict[str, Any]:
        return self.inner.config()

    def check_system_state(self, spin: int | None, task: str | None) -> None:
        self.inner.check_system_state(spin, task)

    def check_box(self, pbc: tuple[bool, bool, bool]) -> None:
        self.inner.check_box(pbc)

    @property
    def atom_capacity(self) -> int:
        """Rows of the padded graphs."""
        return self.capacities.atoms

    @property
    def pair_capacity(self) -> int:
        """Pairs of the padded graphs."""
        return self.capacities.pairs
