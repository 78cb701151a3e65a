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

A potential that lays each row's pairs side by side (:attr:`Potential.pairs_by_row
<nvalchemi_lammps.contract.Potential.pairs_by_row>`, a neighbor matrix) has one shape more,
the most pairs a row receives: a capacity too (``row_pairs``), which the padded graph
declares (``LocalGraph.row_pairs``). The padding rows may receive more (all the padding
pairs, beyond the cutoff): such a potential drops what does not fit.

A step's graph is written into buffers of those shapes (:class:`PaddedGraph`): new ones
every step for a compiled potential, the same static ones for a captured potential, which
then takes, per step, only the operations what changed needs (a few small kernels, where
building the padded graph anew took a few dozen).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any

import torch

from ..contract import Comm, LocalGraph, NoOpComm, Potential

#: a tensor as it was when seen: a weak reference and torch's count of its in-place writes
Seen = tuple[weakref.ref, int]


def seen(t: torch.Tensor, callback: Any = None) -> Seen | None:
    """``t`` as it is now (``callback`` called when it dies); ``None`` for an inference
    tensor, whose writes torch does not count (never :func:`unchanged`)."""
    return None if t.is_inference() else (weakref.ref(t, callback), t._version)


def unchanged(mark: Seen | None, t: torch.Tensor) -> bool:
    """``t`` is the tensor ``mark`` saw, not written since."""
    return mark is not None and mark[0]() is t and mark[1] == t._version


def _capacity(
    count: int, headroom: float, old: int = 0, growth: float = 1.0, multiple: int = 64
) -> int:
    # a multiple of 64 (rows, pairs; 8 for row_pairs) above count + headroom (at least one
    # padding row), and at least growth x the old capacity
    return multiple * math.ceil(max(count * (1.0 + headroom) + 1, old * growth) / multiple)


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

    ``row_pairs``, the most pairs a row receives (0: not asked for), is a multiple of 8,
    grown the same way when :meth:`fit` is given a count above it.
    """

    headroom: float = 0.05
    growth: float = 1.25
    owned: int = 0
    ghosts: int = 0
    pairs: int = 0
    row_pairs: int = 0

    @property
    def atoms(self) -> int:
        """Rows of the padded graphs: the owned capacity plus the ghost capacity."""
        return self.owned + self.ghosts

    def fit(self, graph: LocalGraph, row_pairs: int | None = None) -> bool:
        """Grow to hold ``graph`` (and rows of ``row_pairs`` pairs, where given); whether
        anything grew."""
        nlocal, nghost, npairs = graph.nlocal, graph.ntotal - graph.nlocal, graph.npairs
        before = (self.owned, self.ghosts, self.pairs, self.row_pairs)
        h, g = self.headroom, self.growth
        if nlocal >= self.owned:
            self.owned = _capacity(nlocal, h, self.owned, g)
        if nghost > self.ghosts:
            self.ghosts = _capacity(nghost, h, self.ghosts, g)
        if npairs >= self.pairs:
            self.pairs = _capacity(npairs, h, self.pairs, g)
        # asked for, it is given also to a rank without pairs (one row of padding)
        if row_pairs is not None and (row_pairs > self.row_pairs or not self.row_pairs):
            self.row_pairs = _capacity(row_pairs, h, self.row_pairs, g, multiple=8)
        return (self.owned, self.ghosts, self.pairs, self.row_pairs) != before


class PaddedGraph:
    """Buffers of one padded graph, which each step's graph is written into in place.

    Rows are laid out as the module says: ``rows`` is the padded row of each of the graph's
    rows. The buffers are written with as few operations as the step allows:

    - the differentiable inputs (pair vectors, positions, cell, and charges where they
      require gradients: another potential's predictions) every step (:meth:`load_values`
      of :meth:`values`), one operation each;
    - the topology (species, pairs, owners, LAMMPS's charges, :meth:`load`) only when it is
      not the tensor written last time: a tensor handed again, the same object at the same
      ``_version`` (torch's count of its in-place writes), holds the same values (a front
      door hands new tensors when LAMMPS's arrays change);
    - the padding only when the counts change: padding rows (and pair padding) when the
      owned or ghost count does, pairs that were real and are padding now when the pair
      count drops.

    :param capacities: the shapes, which hold ``like``
    :param cutoff: the potential's; padding pairs are longer
    :param like: a graph whose optional inputs (positions, charges), dtypes, device and
        system state the padded graph takes; its charges are differentiable inputs if they
        require gradients
    :param owners: a buffer for the rows a forward exchange copies (:meth:`load` takes them)
    :param leaves: the differentiable buffers require gradients (the static inputs of a
        captured potential; then every write must run without autograd)
    """

    def __init__(
        self,
        capacities: Capacities,
        cutoff: float,
        like: LocalGraph,
        owners: bool = False,
        leaves: bool = False,
    ) -> None:
        owned, atoms, pairs = capacities.owned, capacities.atoms, capacities.pairs
        self.owned, self.atoms, self.pairs = owned, atoms, pairs
        index = {"dtype": torch.int64, "device": like.rij.device}
        self.species = torch.empty(atoms, **index)
        # both pair ends in one buffer: a padding pair's ends are written in one operation
        self._ends = torch.empty(2, pairs, **index)
        self.pair_i, self.pair_j = self._ends[0], self._ends[1]
        self._far = like.rij.new_tensor([2.0 * cutoff + 1.0, 0.0, 0.0])
        self.rij = like.rij.new_empty((pairs, 3))
        self.owners = torch.empty(atoms, **index) if owners else None

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.new_empty((atoms, *t.shape[1:]))

        self.positions = rows(like.positions)
        self.cell = None if like.cell is None else like.cell.detach().clone()
        self.charges = rows(like.charges)
        #: the differentiable inputs, by their names in a LocalGraph
        self.names = ["rij"]
        if self.positions is not None:
            self.names += ["positions", "cell"]
        if like.charges is not None and like.charges.requires_grad:
            self.names.append("charges")
        self.leaves = [getattr(self, name) for name in self.names]
        for leaf in self.leaves if leaves else []:
            leaf.requires_grad_(True)
        #: per-row buffers and the value of their padding rows
        self._padding_rows: list[tuple[torch.Tensor, float]] = [(self.species, -1)]
        self._padding_rows += [(t, 0.0) for t in (self.positions, self.charges) if t is not None]
        # the padded graph, but for its collectives (keeps nothing of like's step)
        self._graph = dataclasses.replace(
            like,
            nlocal=owned,
            species=self.species,
            pair_i=self.pair_i,
            pair_j=self.pair_j,
            rij=self.rij,
            comm=NoOpComm(),
            positions=self.positions,
            cell=self.cell,
            charges=self.charges,
            row_pairs=capacities.row_pairs or None,
        )
        self.rows = torch.empty(0, **index)
        #: the owned and ghost rows written (``None``: none yet)
        self.counts: tuple[int, int] | None = None
        self._npairs = pairs  # pairs written (beyond them: padding)
        self._spread = torch.empty(0, **index)
        self._written: dict[str, Seen | None] = {}

    def graph(self, comm: Comm) -> LocalGraph:
        """The padded graph over the buffers, with ``comm`` as its collectives."""
        return dataclasses.replace(self._graph, comm=comm)

    def keep_padding(self, rows: torch.Tensor, fill: float) -> None:
        """Hold ``fill`` in the padding rows of ``rows`` (a buffer of one value per padded
        row, which :meth:`place` writes the graph's rows into), from now on."""
        self._padding_rows.append((rows, fill))
        if self.counts is not None:
            self._pad_rows(rows, fill, *self.counts)

    def load(self, graph: LocalGraph, owners: torch.Tensor | None = None) -> None:
        """``graph``'s topology (and charges) into the buffers, what changed of it only,
        and the padding where the counts changed; ``owners``: the rows each row's forward
        exchange copies, all owned (one rank)."""
        nlocal, nghost, npairs = graph.nlocal, graph.ntotal - graph.nlocal, graph.npairs
        if (nlocal, nghost) != self.counts:
            self._place_rows(nlocal, nghost)
            self._npairs = self.pairs  # every padding pair moves with the owned count
        if npairs < self._npairs:  # pairs that are padding now
            start, end = npairs, self._npairs
            self._ends[:, start:end].copy_(self._spread[start:end].expand(2, -1))
            self.rij[start:end].copy_(self._far.expand(end - start, 3))
        if npairs != self._npairs:
            self._written.clear()
            self._npairs = npairs
        if self._changed("species", graph.species, self.species):
            self.species.index_copy_(0, self.rows, graph.species.long())
        if self._changed("owners", owners):
            self.owners.index_copy_(0, self.rows, owners.long())  # owned rows keep their number
        # receivers too: under the widened shell ghosts receive
        for name, ends, given in (
            ("pair_i", self.pair_i, graph.pair_i),
            ("pair_j", self.pair_j, graph.pair_j),
        ):
            if self._changed(name, given, ends):
                torch.index_select(self.rows, 0, given, out=ends[:npairs])
        if "charges" not in self.names and self._changed("charges", graph.charges):
            self.charges.index_copy_(0, self.rows, graph.charges)

    def values(self, graph: LocalGraph) -> list[torch.Tensor]:
        """``graph``'s differentiable inputs, in the order of :attr:`leaves`."""
        return [getattr(graph, name) for name in self.names]

    def load_values(self, *values: torch.Tensor) -> None:
        """The differentiable inputs (:meth:`values`) of a graph :meth:`load` wrote into
        the buffers."""
        for name, value in zip(self.names, values, strict=True):
            if name == "rij":
                if value.data_ptr() != self.rij.data_ptr():  # else written there in place
                    self.rij[: value.shape[0]].copy_(value)
            elif name == "cell":
                self.cell.copy_(value)
            else:  # per row
                getattr(self, name).index_copy_(0, self.rows, value)

    def gradients(self, grads: list[torch.Tensor], npairs: int) -> list[torch.Tensor]:
        """The gradients of the buffers' :attr:`leaves` as gradients of the graph's
        differentiable inputs (``npairs`` pairs), new tensors."""
        out = []
        for name, grad in zip(self.names, grads, strict=True):
            if name == "rij":
                out.append(grad[:npairs].clone())
            elif name == "cell":
                out.append(grad.clone())
            else:  # per row: index_select copies
                out.append(self.unpadded(grad))
        return out

    def unpadded(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-row values of the padded graph (energies, gradients) in the graph's rows."""
        return rows.index_select(0, self.rows)

    def place(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        """Per-row values of the graph into their padded rows of ``out``."""
        out.index_copy_(0, self.rows, rows)

    def _changed(
        self, name: str, t: torch.Tensor | None, buffer: torch.Tensor | None = None
    ) -> bool:
        # whether t (None: nothing to write) is not the tensor written last time, unchanged,
        # nor the buffer itself (a front door wrote it in place: PairSink)
        if t is None:
            return False
        if buffer is not None and t.data_ptr() == buffer.data_ptr():
            self._written.pop(name, None)
            return False
        if unchanged(self._written.get(name), t):
            return False
        self._written[name] = seen(t)
        return True

    def _place_rows(self, nlocal: int, nghost: int) -> None:
        shift = self.owned - nlocal
        self.rows = torch.arange(nlocal + nghost, device=self.species.device)
        self.rows[nlocal:] += shift
        for rows, fill in self._padding_rows:
            self._pad_rows(rows, fill, nlocal, nghost)
        if self.owners is not None:  # padding rows copy themselves
            self.owners.copy_(torch.arange(self.atoms, device=self.owners.device))
        # padding pairs join owned padding rows to themselves, spread over them (into one
        # row, their sums would serialize on atomics)
        self._spread = nlocal + torch.arange(self.pairs, device=self.species.device) % shift
        self.counts = (nlocal, nghost)
        self._written.clear()

    def _pad_rows(self, rows: torch.Tensor, fill: float, nlocal: int, nghost: int) -> None:
        rows[nlocal : self.owned].fill_(fill)
        rows[self.owned + nghost :].fill_(fill)


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
