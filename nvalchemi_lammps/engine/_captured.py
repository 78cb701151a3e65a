"""A potential's forward and backward captured as CUDA graphs on padded graphs, replayed
every step.

At the sizes most MD runs at (tens to tens of thousands of atoms per GPU) a model's step is
paced by kernel launches, not by the GPU: hundreds of small kernels, each launched from
Python. Captured once into a CUDA graph, they replay in one launch. A graph holds fixed
addresses and shapes, so each rank's graph is padded to capacities (:mod:`._padding`) and
copied into static buffers every step; the potential is captured again only when a
neighbor-list build outgrows a capacity (they grow geometrically: a bounded number of
captures per run, :attr:`CapturedPotential.captures`). Each step writes into those buffers
only what changed (:class:`~._padding.PaddedGraph`): the pair vectors (positions, cell,
charges that are another potential's predictions) always, the topology when the front door
hands new tensors, the padding when the counts change. A potential that lays each row's
pairs side by side (:attr:`~nvalchemi_lammps.contract.Potential.pairs_by_row`) has the most
pairs a row receives as one capacity more: counted on the host (one read from the GPU,
outside the graphs) when the front door hands new pairs (the doors wrap LAMMPS's pairs
anew every step).

A front door's step (:func:`~._evaluate.evaluate` of a captured potential) is one graph:
the float64 inputs cast to the potential's dtype, the forward, the owned energy's gradient,
and the sums read back with the energy (:meth:`CapturedPotential.evaluation`); outside it,
per step, the buffers' writes, one replay and one read of a few values. A captured
potential that is a part of another (a pipeline's term) is two graphs over one memory pool,
the forward and the backward, replayed by an autograd function (as
``torch.cuda.make_graphed_callables`` does), so that the whole is differentiated as any
other potential. Ghost exchanges on one rank are a gather and a sum by owned
row on the device, inside the graphs. Exchanges and sums across ranks call MPI from the
host, which no graph can hold: each cuts the capture in two (:class:`_Segments`) and runs
between the two graphs at every replay, on the step's own communication (its exchange plan
changes at every neighbor-list build). No collective runs while a rank captures (the
others may not be capturing at that step): every rank calls the same ones every step. A
potential whose capture fails runs eagerly (:attr:`CapturedPotential.eager_reason` says
why), calling the same collectives.

Without CUDA (the CPU, the tests) the same padded buffers are "replayed" by running the
potential on them again: everything but the graphs themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..contract import AdjointComm, Comm, LocalGraph, Potential
from ._evaluation import Evaluation, Readback, check_energies, virial_voigt
from ._padding import Capacities, PaddedGraph, PaddedPotential

#: warm-up runs before a capture: lazy initialization (cuBLAS handles, kernel autotuning,
#: TorchScript's profiling runs) must happen outside the graph
WARMUP = 3


class NotCapturable(RuntimeError):
    """The potential cannot run inside a CUDA graph here (its capture failed)."""


class _StaticComm(AdjointComm):
    """``graph.comm`` inside the captured potential. On one rank the exchanges copy and sum
    rows by the static ``owners`` (padded layout) and a sum over ranks is the identity:
    inside the graphs. Across ranks each is a collective on the step's communication
    (:attr:`live`) on the padded graph's real rows (padding rows pass unchanged): recorded as
    a cut while :attr:`segments` captures, a stand-in (its input) during the other runs of
    a capture (:meth:`capturing`), run where it is called otherwise (the CPU's replays)."""

    def __init__(
        self, exchange: bool, owners: torch.Tensor | None, one_rank: bool, padded: PaddedGraph
    ) -> None:
        self.exchange = exchange
        self.owners = owners
        self.one_rank = one_rank
        self.padded = padded
        #: the step's communication, set before each replay
        self.live: Comm | None = None
        #: the graphs being captured, which a collective cuts
        self.segments: _Segments | None = None
        #: collectives between ranks per run of the potential (forward and backward)
        self.collectives = 0
        self._capturing = False

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Runs of a capture (warm-up, capture): no collective runs."""
        self._capturing = True
        try:
            yield
        finally:
            self._capturing = False

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        if self.owners is not None:
            return src.index_select(0, self.owners)
        return self._between(src, functools.partial(self._exchange, forward=True))

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        if self.owners is not None:
            return torch.zeros_like(src).index_add_(0, self.owners, src)
        return self._between(src, functools.partial(self._exchange, forward=False))

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.one_rank else super().allreduce(x)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return self._between(x, self._allreduce)

    # never traced (MACE's compiled blocks call the exchanges): the compiler would guard on
    # the state of the capture, and compile again inside it
    @torch.compiler.disable
    def _between(
        self, src: torch.Tensor, collective: Callable[[torch.Tensor, torch.Tensor], None]
    ) -> torch.Tensor:
        # dst is written by the collective; at a cut, src and dst stay alive with it, so the
        # pool never hands their memory to another tensor of the graphs
        dst = torch.empty_like(src)
        if self.segments is not None:
            self.collectives += 1
            self.segments.cut(functools.partial(collective, src, dst))
        elif self._capturing:  # a warm-up on a GPU, or the CPU's run in place of a capture
            self.collectives += not src.is_cuda
            dst.copy_(src)
        else:
            collective(src, dst)
        return dst

    @torch.no_grad()
    def _exchange(self, src: torch.Tensor, dst: torch.Tensor, forward: bool) -> None:
        rows = self.padded.rows
        real = src.index_select(0, rows)
        out = torch.empty_like(real)
        self.live.exchange_into(real, out, forward)
        dst.copy_(src)
        dst.index_copy_(0, rows, out)

    @torch.no_grad()
    def _allreduce(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        dst.copy_(self.live.allreduce(src))


class _Segments:
    """CUDA graphs captured one after another on one memory pool and stream, the capture
    cut where the potential calls a collective between ranks (:class:`_StaticComm`),
    replayed in order with each collective between its two graphs. One graph where nothing
    cuts it (one rank)."""

    def __init__(self, pool: Any, stream: torch.cuda.Stream) -> None:
        self.pool, self.stream = pool, stream
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.between: list[Callable[[], None]] = []
        self._open: Any = None

    def capture(self, run: Callable[[], Any], comm: _StaticComm) -> Any:
        """``run()`` captured, cut at ``comm``'s collectives; what it returns."""
        comm.segments = self
        try:
            # around every graph's own: after a failed capture the caller's stream comes back
            with torch.cuda.stream(self.stream):
                self._begin()
                try:
                    result = run()
                except BaseException as failed:
                    with contextlib.suppress(RuntimeError):  # the capture is invalid anyway
                        self._end(failed)
                    raise
                self._end()
        finally:
            comm.segments = None
        return result

    def cut(self, collective: Callable[[], None]) -> None:
        """End the graph being captured here, ``collective`` to run after it, begin the
        next."""
        self._end()
        self.between.append(collective)
        self._begin()

    def _end(self, failed: BaseException | None = None) -> None:
        with warnings.catch_warnings():
            # two collectives in a row leave an empty graph between them, replayed as nothing
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            if failed is None:
                self._open.__exit__(None, None, None)
            else:
                self._open.__exit__(type(failed), failed, failed.__traceback__)

    def _begin(self) -> None:
        graph = torch.cuda.CUDAGraph()
        self._open = torch.cuda.graph(graph, pool=self.pool, stream=self.stream)
        self._open.__enter__()
        self.graphs.append(graph)

    def replay(self) -> None:
        for graph, collective in itertools.zip_longest(self.graphs, self.between):
            graph.replay()
            if collective is not None:
                collective()


@dataclasses.dataclass
class _Key:
    """What a capture is specialized to besides the capacities."""

    step: bool  # the whole evaluation (_Step), or the forward and backward (_Graphs)
    dtype: torch.dtype
    exchange: bool
    one_rank: bool
    positions: bool
    charges: str | None  # LAMMPS's ("constant") or another potential's ("differentiable")
    pbc: tuple[bool, bool, bool] | None
    state: tuple[Any, ...]


def _warm_up(run: Callable[[], object]) -> None:
    """``run`` a few times on a side stream before a capture (:data:`WARMUP`); its autograd
    graphs go with the call, so that no node made on that stream outlives it (a capture on
    another stream would wait for it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(stream)


def _gradients(
    total: torch.Tensor, leaves: list[torch.Tensor], grad_out: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """``total``'s gradients for every leaf, zeros for those it does not depend on."""
    grads: list[torch.Tensor | None] = [None] * len(leaves)
    if total.requires_grad:  # energies that depend on no input have no graph
        with torch.autograd.set_multithreading_enabled(False):
            grads = list(torch.autograd.grad(total, leaves, grad_out, allow_unused=True))
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


class _Step:
    """The whole evaluation of a padded graph whose buffers are float64 (the front door's
    values): cast to the potential's dtype, the forward, the owned energy's gradient for
    every buffer that is a leaf, and the sums read back with the energy, as one CUDA graph
    on a GPU, run again at each replay elsewhere.

    After a replay, :attr:`energies` holds the owned rows' energies (float64; the owned
    padding rows' are zero), :attr:`grads` the leaves' gradients, :attr:`virial` the cell's
    part of the virial (for a potential that needs positions) and :attr:`sums` the energy
    and the sum of each gradient and of the pair vectors: finite iff every term is."""

    def __init__(self, potential: Potential, padded: PaddedGraph, comm: _StaticComm) -> None:
        self.potential, self.padded = potential, padded
        self.graph = padded.graph(comm)
        self.dtype = potential.spec.torch_dtype
        self.cuda = padded.rij.is_cuda
        with comm.capturing():
            if self.cuda:
                _warm_up(self._run)
                self.segments = _Segments(torch.cuda.graph_pool_handle(), torch.cuda.Stream())
                self.segments.capture(self._run, comm)
            else:  # what cannot be captured stops here, as on a GPU
                self._run()

    def replay(self) -> None:
        if self.cuda:
            self.segments.replay()
        else:
            self._run()

    @torch.enable_grad()
    def _run(self) -> None:
        padded, dtype = self.padded, self.dtype

        def cast(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)

        graph = dataclasses.replace(
            self.graph,
            rij=cast(padded.rij),
            positions=cast(padded.positions),
            cell=cast(padded.cell),
            charges=cast(padded.charges),
        )
        energies = self.potential(graph)
        check_energies(self.potential, energies, padded.atoms)
        owned = energies[: padded.owned]
        self.grads = _gradients(owned.sum(), padded.leaves)
        self.energies = owned.detach().to(torch.float64)
        sums = [self.energies.sum(), *(g.sum() for g in self.grads), padded.rij.detach().sum()]
        self.sums = torch.stack(sums)
        self.virial = None
        if padded.positions is not None:
            self.virial = virial_voigt(padded.cell, self.grads[2])


class _Graphs:
    """The forward and backward of ``run`` on static inputs: captured as CUDA graphs on a
    GPU, run again at each replay elsewhere. ``run()`` returns the energies; ``leaves`` are
    the static inputs it is differentiated for, ``grad_out`` the energies' gradient that
    :meth:`backward` reads."""

    def __init__(
        self, run: Callable[[], torch.Tensor], leaves: list[torch.Tensor], comm: _StaticComm
    ) -> None:
        self.run, self.leaves, self.comm = run, leaves, comm
        self.cuda = leaves[0].is_cuda
        self.energies: torch.Tensor | None = None
        #: forward replays so far: a backward belongs to the last one (its activations)
        self.replays = 0
        self.grad_out: torch.Tensor | None = None
        self.grads: list[torch.Tensor] = []
        self._capture()

    def _gradients(self, energies: torch.Tensor, grad_out: torch.Tensor) -> list[torch.Tensor]:
        return _gradients(energies, self.leaves, grad_out)

    @torch.enable_grad()
    def _capture(self) -> None:
        def forward_and_backward() -> None:
            energies = self.run()
            self._gradients(energies, torch.ones_like(energies))

        with self.comm.capturing():
            if not self.cuda:  # a warm-up only: what cannot be captured stops here, as on a GPU
                energies = self.run()
                self._gradients(energies, torch.ones_like(energies))
                self.grad_out = torch.zeros_like(energies)
                return
            _warm_up(forward_and_backward)
            pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            self.forward_graph = _Segments(pool, stream)
            self.energies = self.forward_graph.capture(self.run, self.comm)
            self.grad_out = torch.zeros_like(self.energies)
            self.backward_graph = _Segments(pool, stream)
            self.grads = self.backward_graph.capture(
                lambda: self._gradients(self.energies, self.grad_out), self.comm
            )

    def forward(self) -> torch.Tensor:
        self.replays += 1
        if self.cuda:
            self.forward_graph.replay()
        else:
            with torch.enable_grad():  # called from an autograd function's forward
                self.energies = self.run()
        return self.energies

    def backward(self) -> list[torch.Tensor]:
        """The gradients for the energies' gradient ``grad_out`` (written into it first)."""
        if self.cuda:
            self.backward_graph.replay()
            return self.grads
        return self._gradients(self.energies, self.grad_out)


class _Replay(torch.autograd.Function):
    """The graphs as an autograd function of the graph's differentiable inputs: the step's
    graph written into the static buffers, the graphs replayed, the energies of the
    graph's rows out (a copy: the next replay overwrites the static ones)."""

    @staticmethod
    def forward(
        ctx: Any,
        graphs: _Graphs,
        padded: PaddedGraph,
        graph: LocalGraph,
        owners: torch.Tensor | None,
        *inputs: torch.Tensor,
    ) -> torch.Tensor:
        padded.load(graph, owners)
        padded.load_values(*inputs)
        ctx.graphs, ctx.padded, ctx.npairs = graphs, padded, graph.npairs
        energies = padded.unpadded(graphs.forward())
        ctx.replay = graphs.replays
        return energies

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        graphs, padded = ctx.graphs, ctx.padded
        if ctx.replay != graphs.replays:
            raise RuntimeError(
                "a captured potential's backward must follow its own forward: another forward "
                "replayed the graphs in between (their activations are shared)"
            )
        # the buffers still hold this forward's layout: no other forward ran since
        padded.place(grad_out, graphs.grad_out)
        # copies: the next replay overwrites the static gradients
        back = padded.gradients(graphs.backward(), ctx.npairs)
        return (None, None, None, None, *back)


#: numbers of captures, unique in the process: a PairSink's generation
_GENERATIONS = itertools.count()


@dataclasses.dataclass(frozen=True)
class PairSink:
    """A captured whole evaluation's own input buffers, where its rows are the owned atoms
    (no ghost rows: one rank, each ghost folded into its owner), for a front door's kernels
    to write the next step's pairs into directly: receivers and neighbors as owned rows,
    pair vectors, the owned rows' elements. Passed back to :func:`~._evaluate.evaluate`
    as ``in_place=generation``, the step then copies none of them.

    :param capacity: the most pairs the buffers take without a new capture
    :param nlocal: the owned rows they are laid out for
    :param generation: the capture they belong to, unique in the process (a new capture
        frees them)
    """

    pair_i: torch.Tensor
    pair_j: torch.Tensor
    rij: torch.Tensor
    species: torch.Tensor
    capacity: int
    nlocal: int
    generation: int


class CapturedPotential(PaddedPotential):
    """``potential`` (ready for it: :meth:`~Potential.prepare_capture`) captured as CUDA
    graphs, a drop-in for it in :func:`evaluate`.

    :param potential: a potential whose :meth:`~Potential.prepare_capture` succeeds
    :param headroom: capacities are the first graph's sizes times ``1 + headroom``, and grow
        the same way when a graph outgrows them
    """

    def __init__(self, potential: Potential, headroom: float = 0.05) -> None:
        if potential.symmetric_pair_terms:
            # a closed form (pair_terms) runs a few kernels without autograd, on half the
            # pairs: captured, it would run the forward and backward on every pair
            raise ValueError(
                f"the {potential.name} model has a closed form, which runs eagerly in a few "
                "kernels on a half neighbor list"
            )
        super().__init__(potential.prepare_capture(), potential, Capacities(float(headroom)))
        #: what runs where the graphs do not (:attr:`eager_reason`): the potential as given,
        #: whose prepared copy may hold what only a capture should run (MACE's compiled
        #: blocks, which would compile again for every new shape)
        self.eager = potential
        #: captures so far (one forward and one backward graph each)
        self.captures = 0
        #: wall seconds they took: the warm-up runs, the capture, what torch compiles inside
        #: it (the GPU's work included)
        self.capture_seconds = 0.0
        #: why this potential runs eagerly after all (``None`` while it is captured)
        self.eager_reason: str | None = None
        self._graphs: _Graphs | _Step | None = None
        self._comm: _StaticComm | None = None  # the graphs' collectives
        self._key: _Key | None = None
        self._padded: PaddedGraph | None = None
        #: the pairs whose most pairs per row were counted last, and that count
        self._counted: tuple[weakref.ref, int, int] | None = None
        self._generation = -1  # of the last capture (PairSink)

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        if self.eager_reason is None:
            try:
                owners = self._ready(graph, step=False)
                padded = self._padded
                return _Replay.apply(self._graphs, padded, graph, owners, *padded.values(graph))
            except NotCapturable as reason:
                self._run_eagerly(reason)
        return self.eager(graph)

    def evaluation(
        self,
        graph: LocalGraph,
        checked: list[torch.Tensor],
        readback: Callable[[torch.Tensor], Readback],
    ) -> Evaluation | None:
        """:func:`~._evaluate.evaluate`'s work for ``graph`` as one replay: ``graph`` on the
        potential's device in float64 as the front door gave it, its inputs for the
        potential (positions, cell, charges only where it needs them); ``checked``: tensors
        whose finiteness counts too, summed and read back with the energy (``readback``
        of the sums). The tensors of the evaluation are views of the static buffers, valid
        until the next one. ``None`` where the potential runs eagerly after all
        (:attr:`eager_reason`)."""
        try:
            owners = self._ready(graph, step=True)
        except NotCapturable as reason:
            self._run_eagerly(reason)
            return None
        step, padded = self._graphs, self._padded
        with torch.no_grad():  # into buffers that are leaves
            padded.load(graph, owners)
            padded.load_values(*padded.values(graph))
        step.replay()
        sums = step.sums
        if checked:  # their sums in the one read
            extra = [t.sum().view(1).to(sums.device, sums.dtype) for t in checked]
            sums = torch.cat((sums, *extra))
        atom_forces = virial = None
        if padded.positions is not None:
            atom_forces = -padded.unpadded(step.grads[1])
            virial = step.virial
        return Evaluation(
            readback(sums),
            atom_energies=step.energies[: graph.nlocal],
            pair_forces=step.grads[0][: graph.npairs],
            atom_forces=atom_forces,
            virial=virial,
        )

    def sink(self) -> PairSink | None:
        """The buffers of the current capture of a whole evaluation without ghost rows, for
        the next step's pairs (:class:`PairSink`); ``None`` for any other."""
        padded = self._padded
        if (
            not isinstance(self._graphs, _Step)
            or padded is None
            or padded.counts is None
            or padded.counts[1]  # ghost rows: the rows are not the atoms' own
            or padded.positions is not None
            or self.inner.pairs_by_row
        ):
            return None
        return PairSink(
            padded.pair_i,
            padded.pair_j,
            padded.rij,
            padded.species,
            padded.pairs - 1,  # one padding pair at least
            padded.counts[0],
            self._generation,
        )

    @property
    def collectives(self) -> int:
        """Exchanges and sums between ranks in one step of the graphs, each run between
        two of them (MPI, through the host); 0 on one rank and where it runs eagerly."""
        return 0 if self._comm is None else self._comm.collectives

    def note(self) -> str:
        """For the log at the end of a run: why the potential runs eagerly, or what runs
        between its graphs; "" when neither."""
        if self.eager_reason is not None:
            return f"{self.name} runs eagerly: {self.eager_reason}"
        if self.collectives:
            return (
                f"{self.name}: {self.collectives} exchange(s) or sum(s) between ranks per step, "
                "each between two graphs"
            )
        return ""

    def _run_eagerly(self, reason: NotCapturable) -> None:
        # eagerly, the potential calls the collectives that the graphs' replays call
        self.eager_reason = str(reason)
        self._graphs = None
        self._padded = None
        self._comm = None

    def _ready(self, graph: LocalGraph, step: bool) -> torch.Tensor | None:
        """Capture again if ``graph`` outgrows the capacities or is not of the graphs'
        kind (``step``: :class:`_Step`, else :class:`_Graphs`); the rows each row's forward
        exchange copies (one rank: inside the graphs), or ``None``.

        :raises NotCapturable: the potential cannot run captured on ``graph``
        """
        self.inner.check_graph(graph)  # the forward's own checks do not run at a replay
        comm = graph.comm
        owners = comm.local_owners(graph.rij.device) if comm.exchange else None
        key = _Key(
            step,
            graph.rij.dtype,
            comm.exchange,
            comm.one_rank,
            graph.positions is not None,
            None
            if graph.charges is None
            else ("differentiable" if graph.charges.requires_grad else "constant"),
            graph.pbc,
            (graph.total_charge, graph.spin, graph.task),
        )
        row_pairs = self._row_pairs(graph) if self.inner.pairs_by_row else None
        grown = self.capacities.fit(graph, row_pairs)
        if grown or key != self._key or self._graphs is None:
            self._capture(graph, owners, step)
            self._key = key
        self._comm.live = comm  # what the collectives between ranks run on at this step
        return owners

    def _row_pairs(self, graph: LocalGraph) -> int:
        """The most pairs a row of ``graph`` receives: counted when the pairs are not the
        tensor counted last time, unchanged (one read from the GPU, outside the graphs)."""
        pair_i, last = graph.pair_i, self._counted
        if last is not None and last[0]() is pair_i and last[1] == pair_i._version:
            return last[2]
        counts = torch.zeros(graph.ntotal + 1, dtype=torch.int64, device=pair_i.device)
        count = int(counts.index_add_(0, pair_i, torch.ones_like(pair_i)).max())
        if not pair_i.is_inference():  # no count of its writes: counted every time
            self._counted = (weakref.ref(pair_i), pair_i._version, count)
        return count

    def _capture(self, graph: LocalGraph, owners: torch.Tensor | None, step: bool) -> None:
        """Static buffers of the padded graph (holding ``graph``) and the graphs of the
        potential on them (``step``: of the whole evaluation)."""
        started = time.perf_counter()
        self._graphs = None  # the old graphs' memory goes back before the new capture
        self._padded = None
        padded = PaddedGraph(
            self.capacities, self.spec.cutoff, graph, owners=owners is not None, leaves=True
        )
        with torch.no_grad():
            padded.load(graph, owners)
            padded.load_values(*padded.values(graph))
        comm = _StaticComm(graph.comm.exchange, padded.owners, graph.comm.one_rank, padded)
        inputs = padded.graph(comm)
        try:
            if step:
                graphs = _Step(self.inner, padded, comm)
            else:
                graphs = _Graphs(lambda: self.inner(inputs), padded.leaves, comm)
                # padding rows have no energy to differentiate
                padded.keep_padding(graphs.grad_out, 0.0)
        except RuntimeError as failed:  # an operation CUDA graphs cannot hold (a host sync)
            raise NotCapturable(f"its capture failed: {failed}") from failed
        self._graphs, self._padded, self._comm = graphs, padded, comm
        self.captures += 1
        self._generation = next(_GENERATIONS)
        if padded.rij.is_cuda:
            torch.cuda.synchronize(padded.rij.device)
        self.capture_seconds += time.perf_counter() - started


def capture_potential(potential: Potential, headroom: float = 0.05) -> Potential:
    """``potential`` captured as CUDA graphs on padded graphs, a drop-in for it: wrapped in a
    :class:`CapturedPotential`, or, for a potential made of parts (a pipeline), the parts
    that can be (:meth:`Potential.compiled <nvalchemi_lammps.contract.Potential.compiled>`).

    :raises ValueError: nothing in ``potential`` can run on padded graphs
    """
    return potential.compiled(lambda part: CapturedPotential(part, headroom))
