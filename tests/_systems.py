"""Small structures and helpers shared by the unit tests.

Every periodic system here is smaller than its potential's cutoff in at least one
direction, so atoms see their own periodic images: the case a minimum-image code gets
wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nvalchemi_lammps import LennardJones, LocalGraph
from nvalchemi_lammps.contract import AdjointComm
from nvalchemi_lammps.reference import neighbor_pairs

ARGON = {"epsilon": 0.0104, "sigma": 3.40}
NEON = {"epsilon": 0.0031, "sigma": 2.75}


@dataclass(frozen=True)
class System:
    name: str
    positions: np.ndarray  # (N, 3) float64
    cell: np.ndarray  # (3, 3) rows = lattice vectors
    pbc: tuple[bool, bool, bool]
    species: np.ndarray  # (N,) int64
    elements: tuple[str, ...]

    @property
    def natoms(self) -> int:
        return int(self.positions.shape[0])

    @property
    def volume(self) -> float:
        return abs(float(np.linalg.det(self.cell)))

    def strained(self, strain: np.ndarray) -> System:
        """The system under the homogeneous deformation ``x -> x (1 + strain)``."""
        deform = np.eye(3) + strain
        return System(
            self.name,
            self.positions @ deform,
            self.cell @ deform,
            self.pbc,
            self.species,
            self.elements,
        )


def _rattled(frac: np.ndarray, cell: np.ndarray, amount: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return frac @ cell + rng.uniform(-amount, amount, size=(len(frac), 3))


FCC = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])


def fcc_argon() -> System:
    """The 4-atom conventional fcc cell of argon (a = 5.26 < cutoff 8.5), rattled."""
    cell = 5.26 * np.eye(3)
    positions = _rattled(FCC, cell, 0.15, seed=1)
    return System("fcc_argon", positions, cell, (True, True, True), np.zeros(4, np.int64), ("Ar",))


def fcc_argon_222() -> System:
    """2x2x2 conventional fcc argon cells (32 atoms), rattled; two species mixed in."""
    shifts = np.array([[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)], float)
    frac = (FCC[None, :, :] + shifts[:, None, :]).reshape(-1, 3) / 2.0
    cell = 10.52 * np.eye(3)
    positions = _rattled(frac, cell, 0.2, seed=2)
    species = np.random.default_rng(3).integers(0, 2, size=len(frac)).astype(np.int64)
    return System("fcc_ar_ne_222", positions, cell, (True, True, True), species, ("Ar", "Ne"))


def fewer_atoms(removed: int, seed: int) -> System:
    """fcc argon (2x2x2) without ``removed`` of its atoms, picked at random: another owned,
    ghost and pair count for graphs padded to capacities."""
    rng = np.random.default_rng(seed)
    system = fcc_argon_222()
    keep = np.sort(rng.choice(system.natoms, system.natoms - removed, replace=False))
    return System(
        "fewer",
        system.positions[keep],
        system.cell,
        system.pbc,
        system.species[keep],
        system.elements,
    )


def triclinic_ar_ne() -> System:
    """Six Ar/Ne atoms in a small, strongly skewed triclinic cell (all lengths < 6.5)."""
    cell = np.array([[5.1, 0.0, 0.0], [1.7, 4.8, 0.0], [-1.2, 1.4, 5.3]])
    frac = np.array(
        [
            [0.0, 0.0, 0.0],
            [0.5, 0.0, 0.1],
            [0.0, 0.5, 0.5],
            [0.5, 0.5, 0.6],
            [0.25, 0.75, 0.2],
            [0.75, 0.25, 0.8],
        ]
    )
    positions = _rattled(frac, cell, 0.1, seed=4)
    species = np.array([0, 1, 0, 1, 1, 0], np.int64)
    return System("triclinic_ar_ne", positions, cell, (True, True, True), species, ("Ar", "Ne"))


def slab_argon() -> System:
    """8 argon atoms periodic in x and y only; the z cell vector is ignored."""
    cell = np.array([[5.26, 0.0, 0.0], [0.0, 5.26, 0.0], [0.0, 0.0, 10.52]])
    frac = np.concatenate([FCC, FCC + [0.0, 0.0, 0.5]])
    positions = _rattled(frac, cell, 0.1, seed=5)
    return System(
        "slab_argon", positions, cell, (True, True, False), np.zeros(8, np.int64), ("Ar",)
    )


def ar_ne_slab(seed: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """3x3x2 jittered fcc cells of Ar and Ne (a = 4.1) in the lower 40 % of a tall periodic
    box, as ``(positions, cell, species)`` for a LAMMPS data file: split in 4 along z, the
    top rank owns nothing."""
    rng = np.random.default_rng(seed)
    cells = np.array([3, 3, 2])
    grid = np.array(np.meshgrid(*map(np.arange, cells), indexing="ij")).reshape(3, -1).T
    frac = (grid[:, None, :] + FCC[None]).reshape(-1, 3) / cells
    cell = np.diag(cells * 4.1).astype(np.float64)
    positions = frac @ cell + rng.normal(0.0, 0.12, size=frac.shape) + [0.0, 0.0, 1.0]
    cell[2, 2] *= 2.5
    species = (rng.random(len(frac)) < 0.35).astype(np.int64)
    return positions, cell, species


def cluster_ar_ne() -> System:
    """Five Ar/Ne atoms, no periodicity at all, zero cell."""
    positions = np.array(
        [[0.0, 0.0, 0.0], [3.6, 0.2, 0.1], [1.7, 3.1, -0.3], [1.9, 1.0, 3.2], [5.5, 3.3, 1.0]]
    )
    species = np.array([0, 1, 0, 1, 0], np.int64)
    return System("cluster_ar_ne", positions, np.zeros((3, 3)), (False,) * 3, species, ("Ar", "Ne"))


def lennard_jones(system: System, cutoff: float = 8.5, **kwargs) -> LennardJones:
    """LJ with argon/neon parameters for the elements of ``system``."""
    table = {"Ar": ARGON, "Ne": NEON}
    elements = list(system.elements)
    return LennardJones(
        elements=elements,
        epsilon={e: table[e]["epsilon"] for e in elements},
        sigma={e: table[e]["sigma"] for e in elements},
        cutoff=cutoff,
        **kwargs,
    )


# --- a hand-made multi-rank decomposition -------------------------------------------------


class OneRankComm(AdjointComm):
    """One rank whose ghosts image its own atoms (``owner``: each row's owned row): the
    exchanges copy each ghost row from that row and sum it back (``local_owners``, which a
    captured step holds), sums over ranks are the identity."""

    def __init__(self, owner: np.ndarray, exchange: bool = True, device: str = "cpu") -> None:
        self.owner = torch.from_numpy(owner).to(device)
        self.exchange = exchange
        self.one_rank = True

    def local_owners(self, device: torch.device) -> torch.Tensor | None:
        return self.owner.to(device)

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        return src[self.owner]

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(src).index_add_(0, self.owner, src)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return x


class RemoteComm(OneRankComm):
    """:class:`OneRankComm`'s values as if the ghosts came from other ranks: no local owners
    and not one rank, so that the engine treats every exchange and sum as MPI mid-step;
    every call of a collective counted (:meth:`taken`)."""

    def __init__(self, owner: np.ndarray, exchange: bool = True, device: str = "cpu") -> None:
        super().__init__(owner, exchange, device)
        self.one_rank = False
        self.calls = {"forward": 0, "reverse": 0, "sum": 0}

    def taken(self) -> dict[str, int]:
        """The collectives called since the last time asked."""
        calls, self.calls = self.calls, dict.fromkeys(self.calls, 0)
        return calls

    def local_owners(self, device: torch.device) -> None:
        return None

    def _forward(self, src: torch.Tensor) -> torch.Tensor:
        self.calls["forward"] += 1
        return super()._forward(src)

    def _reverse(self, src: torch.Tensor) -> torch.Tensor:
        self.calls["reverse"] += 1
        return super()._reverse(src)

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        self.calls["sum"] += 1
        return x


@dataclass(frozen=True)
class RankGraph:
    """What one LAMMPS rank would hand the engine: owned rows first, then ghosts.

    ``owner[row]`` is the global atom a local row (owned or ghost) is a copy of: the map
    LAMMPS's reverse communication uses to sum ghost forces into their owners.
    """

    nlocal: int
    species: np.ndarray
    pair_i: np.ndarray
    pair_j: np.ndarray
    rij: np.ndarray
    owner: np.ndarray

    @property
    def ntotal(self) -> int:
        return int(self.species.shape[0])

    def local_graph(self, comm=None, **fields) -> LocalGraph:
        """This rank's arrays as the contract's graph (torch views, no copies); ``fields``:
        the graph's other fields (positions, total_charge, ...)."""
        if comm is not None:
            fields["comm"] = comm
        return LocalGraph(
            self.nlocal,
            torch.from_numpy(self.species),
            torch.from_numpy(self.pair_i),
            torch.from_numpy(self.pair_j),
            torch.from_numpy(self.rij),
            **fields,
        )


def _slabs(system: System, nslabs: int) -> np.ndarray:
    """Slab index of every atom along lattice direction 0."""
    if system.pbc[0]:
        frac = np.linalg.solve(system.cell.T, system.positions.T).T[:, 0] % 1.0
    else:  # slabs of the positions' own extent
        x = system.positions[:, 0]
        frac = (x - x.min()) / (np.ptp(x) * (1 + 1e-9) or 1.0)
    return np.minimum((frac * nslabs).astype(np.int64), nslabs - 1)


def decompose(
    system: System, cutoff: float, nranks: int, nslabs: int | None = None
) -> list[RankGraph]:
    """Split ``system`` over ``nranks`` ranks as LAMMPS would, in slabs along lattice
    direction 0.

    Atoms in slab ``r`` of ``nslabs`` (default ``nranks``) are owned by rank ``r``; ranks
    ``nslabs..nranks-1`` own nothing. A rank's pairs are all pairs of the full periodic
    pair list whose receiver it owns; a sender that is another rank's atom, or a periodic
    image of any atom (its own atoms included), is a ghost row at ``x[j] + S @ cell``.
    Every other atom of the system is also added as an unpaired ghost, as the ghost shell
    of a LAMMPS rank holds atoms that are in no pair.
    """
    pairs = neighbor_pairs(system.positions, system.cell, system.pbc, cutoff)
    slab = _slabs(system, nranks if nslabs is None else nslabs)
    graphs = []
    for rank in range(nranks):
        owned = np.flatnonzero(slab == rank)
        local = {int(a): k for k, a in enumerate(owned)}
        rows = list(owned)
        positions = [system.positions[a] for a in owned]
        ghost_of: dict[tuple[int, int, int, int], int] = {}
        pi, pj, rij = [], [], []
        for i, j, s in zip(pairs.pair_i, pairs.pair_j, pairs.shifts):
            if int(i) not in local:
                continue
            key = (int(j), *map(int, s))
            if int(j) in local and not s.any():
                row = local[int(j)]
            elif key in ghost_of:
                row = ghost_of[key]
            else:
                row = ghost_of[key] = len(rows)
                rows.append(int(j))
                positions.append(system.positions[j] + s @ system.cell)
            pi.append(local[int(i)])
            pj.append(row)
            rij.append(positions[row] - positions[local[int(i)]])
        for a in range(system.natoms):
            if int(a) not in local and (a, 0, 0, 0) not in ghost_of:
                ghost_of[(a, 0, 0, 0)] = len(rows)
                rows.append(a)
                positions.append(system.positions[a])
        owner = np.array(rows, dtype=np.int64)
        graphs.append(
            RankGraph(
                nlocal=len(owned),
                species=system.species[owner] if len(owner) else np.zeros(0, np.int64),
                pair_i=np.array(pi, dtype=np.int64),
                pair_j=np.array(pj, dtype=np.int64),
                rij=np.array(rij, dtype=np.float64).reshape(-1, 3),
                owner=owner,
            )
        )
    return graphs


def decompose_shell(
    system: System, cutoff: float, layers: int, nranks: int, nslabs: int | None = None
) -> list[RankGraph]:
    """Like :func:`decompose`, for the widened-shell strategy of a ``layers``-deep model.

    A rank's ghosts are every periodic image within ``layers`` pair hops of its owned atoms,
    and every atom of that set, ghost or owned, gets its pairs to the others in the set, as
    a LAMMPS ghost neighbor list gives them. Ghosts on the outer edge have incomplete
    neighborhoods (as in LAMMPS); their errors must not reach the owned atoms' energies.
    """
    pairs = neighbor_pairs(system.positions, system.cell, system.pbc, cutoff)
    slab = _slabs(system, nranks if nslabs is None else nslabs)
    starts = np.searchsorted(pairs.pair_i, np.arange(system.natoms + 1))  # pairs sorted by i
    graphs = []
    for rank in range(nranks):
        owned = [int(a) for a in np.flatnonzero(slab == rank)]
        row_of: dict[tuple[int, int, int, int], int] = {
            (a, 0, 0, 0): k for k, a in enumerate(owned)
        }
        nodes = list(row_of)
        frontier = list(nodes)
        for _ in range(layers):
            following = []
            for a, *s in frontier:
                for k in range(starts[a], starts[a + 1]):
                    key = (int(pairs.pair_j[k]), *(np.array(s) + pairs.shifts[k]).tolist())
                    if key not in row_of:
                        row_of[key] = len(nodes)
                        nodes.append(key)
                        following.append(key)
            frontier = following
        positions = np.array(
            [system.positions[a] + np.array(s) @ system.cell for a, *s in nodes]
        ).reshape(-1, 3)
        pi, pj = [], []
        for row, (a, *s) in enumerate(nodes):
            for k in range(starts[a], starts[a + 1]):
                key = (int(pairs.pair_j[k]), *(np.array(s) + pairs.shifts[k]).tolist())
                if key in row_of:
                    pi.append(row)
                    pj.append(row_of[key])
        pi_a, pj_a = np.array(pi, dtype=np.int64), np.array(pj, dtype=np.int64)
        owner = np.array([a for a, *_ in nodes], dtype=np.int64)
        graphs.append(
            RankGraph(
                nlocal=len(owned),
                species=system.species[owner],
                pair_i=pi_a,
                pair_j=pj_a,
                rij=(positions[pj_a] - positions[pi_a]).reshape(-1, 3),
                owner=owner,
            )
        )
    return graphs


@dataclass(frozen=True)
class Gathered:
    energy: float
    atom_energies: np.ndarray
    forces: np.ndarray
    virial: np.ndarray
    atom_virials: np.ndarray


def gather(
    system: System,
    graphs: list[RankGraph],
    atom_energies: list[np.ndarray],
    pair_forces: list[np.ndarray],
) -> Gathered:
    """Apply each rank's results as LAMMPS does and fold ghost rows into their owners.

    ``f[i] += fij``, ``f[j] -= fij`` on local rows, per-atom virial half to each row, then
    the reverse communication: every ghost row is added to its owner atom.
    """
    n = system.natoms
    energies = np.zeros(n)
    forces = np.zeros((n, 3))
    virial = np.zeros((3, 3))
    atom_virials = np.zeros((n, 6))
    voigt = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    for graph, e, fij in zip(graphs, atom_energies, pair_forces):
        energies[graph.owner[: graph.nlocal]] += e
        local = np.zeros((graph.ntotal, 3))
        np.add.at(local, graph.pair_i, fij)
        np.add.at(local, graph.pair_j, -fij)
        np.add.at(forces, graph.owner, local)
        w = -graph.rij[:, :, None] * fij[:, None, :]
        virial += w.sum(axis=0)
        half = 0.5 * np.stack([w[:, a, b] for a, b in voigt], axis=-1)
        local_v = np.zeros((graph.ntotal, 6))
        np.add.at(local_v, graph.pair_i, half)
        np.add.at(local_v, graph.pair_j, half)
        np.add.at(atom_virials, graph.owner, local_v)
    return Gathered(float(energies.sum()), energies, forces, virial, atom_virials)


def image_ranges(system: System, cutoff: float) -> list[range]:
    """Lattice images to loop over in each direction so that every pair within ``cutoff``
    is found (none along non-periodic directions)."""
    ranges = []
    for a in range(3):
        if not system.pbc[a]:
            ranges.append(range(1))
            continue
        b, c = system.cell[(a + 1) % 3], system.cell[(a + 2) % 3]
        spacing = system.volume / np.linalg.norm(np.cross(b, c))
        n = math.ceil(cutoff / spacing) + 1
        ranges.append(range(-n, n + 1))
    return ranges


# --- several ranks in threads, talking through a fake of LAMMPS's collectives ---------------


class ThreadWorld:
    """Ranks of one LAMMPS run played by threads: each calls ``compute`` with its own
    :class:`RankCollectives`, whose methods meet at a barrier as MPI ranks would.

    A rank that fails breaks the barrier (``threading.BrokenBarrierError`` on the others)
    instead of leaving them waiting.
    """

    def __init__(self, graphs: list[RankGraph], natoms: int, timeout: float = 60.0) -> None:
        import threading

        self.graphs = graphs
        self.natoms = natoms
        self.barrier = threading.Barrier(len(graphs), timeout=timeout)
        self.slots: list[np.ndarray | None] = [None] * len(graphs)
        self.calls: list[list[str]] = [[] for _ in graphs]

    def collectives(self, rank: int) -> RankCollectives:
        return RankCollectives(self, rank)

    def run(self, work) -> list:
        """``work(rank)`` on every rank in its own thread; results in rank order."""
        import threading

        results: list = [None] * len(self.graphs)
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                results[rank] = work(rank)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller
                errors.append(err)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(len(self.graphs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


class RankCollectives:
    """The ``LammpsCollectives`` methods of one rank (python_bridge.cpp), with its checks:
    in-place work on writable, C-contiguous float64 buffers of ``ntotal * width`` values."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world = world
        self.rank = rank
        self.graph = world.graphs[rank]

    def ntotal(self) -> int:
        return self.graph.ntotal

    def _rows(self, buffer, width: int) -> np.ndarray:
        view = memoryview(buffer)
        if view.readonly or not view.c_contiguous or view.format != "d":
            raise TypeError("LAMMPS collectives need a float64 buffer")
        rows = np.frombuffer(view, dtype=np.float64)
        if width < 1:
            raise ValueError(f"exchange width must be >= 1, got {width}")
        if rows.size != self.ntotal() * width:
            raise ValueError(
                f"LAMMPS collectives got {rows.size} values, wanted {self.ntotal() * width}"
            )
        return rows.reshape(self.ntotal(), width)

    def _share(self, data: np.ndarray) -> list[np.ndarray]:
        """Publish ``data``, wait for every rank, return everybody's."""
        self.world.slots[self.rank] = data
        self.world.barrier.wait()
        return list(self.world.slots)

    def _done(self) -> None:
        self.world.barrier.wait()  # nobody republishes before all have read

    def forward_exchange(self, buffer, width: int) -> None:
        self.world.calls[self.rank].append("forward_exchange")
        rows = self._rows(buffer, width)
        g = self.graph
        table = np.full((self.world.natoms, width), np.nan)
        for other, owned in zip(self.world.graphs, self._share(rows[: g.nlocal].copy())):
            table[other.owner[: other.nlocal]] = owned
        rows[g.nlocal :] = table[g.owner[g.nlocal :]]
        self._done()

    def reverse_exchange(self, buffer, width: int) -> None:
        self.world.calls[self.rank].append("reverse_exchange")
        rows = self._rows(buffer, width)
        g = self.graph
        table = np.zeros((self.world.natoms, width))
        for other, ghosts in zip(self.world.graphs, self._share(rows[g.nlocal :].copy())):
            np.add.at(table, other.owner[other.nlocal :], ghosts)
        rows[: g.nlocal] += table[g.owner[: g.nlocal]]
        rows[g.nlocal :] = 0.0
        self._done()

    def allreduce(self, buffer) -> None:
        self.world.calls[self.rank].append("allreduce")
        view = memoryview(buffer)
        if view.readonly or not view.c_contiguous or view.format != "d":
            raise TypeError("LAMMPS collectives need a float64 buffer")
        values = np.frombuffer(view, dtype=np.float64)
        values[:] = np.sum(self._share(values.copy()), axis=0)
        self._done()


# --- the plugin's Python side driven as the pair style drives it -------------------------------


def byte_view(array: np.ndarray) -> memoryview:
    """What ``writable_view`` in cpp_bridge/python_bridge.cpp builds: raw writable bytes (a
    writable zero-byte view for an empty array, which ``memoryview.cast`` cannot make)."""
    assert array.flags.c_contiguous and array.flags.writeable
    if array.nbytes == 0:
        return memoryview(bytearray())
    return memoryview(array).cast("B")


@dataclass
class HostStep:
    """A step record of the host path (pairs filtered, rij given, per-pair forces wanted)
    and the arrays behind its outputs, prefilled with NaN, as uninitialized memory may hold
    anything, so a row the session fails to write shows."""

    record: object
    atom_energies: np.ndarray
    pair_forces: np.ndarray
    atom_forces: np.ndarray


def host_step(nlocal, species, pair_i, pair_j, rij, collectives) -> HostStep:
    from nvalchemi_lammps.frontends.plugin import StepRecord

    ntotal, npairs = len(species), len(pair_i)
    species, pair_i, pair_j, rij = (np.ascontiguousarray(a) for a in (species, pair_i, pair_j, rij))
    out = HostStep(
        None, np.full(nlocal, np.nan), np.full((npairs, 3), np.nan), np.full((ntotal, 3), np.nan)
    )
    out.record = StepRecord(
        nlocal=nlocal,
        ntotal=ntotal,
        positions=byte_view(np.zeros((ntotal, 3))),  # read only by models that need positions
        species=byte_view(species),
        owner=None,
        send_rows=None,
        nsend=0,
        nrecv=0,
        remote=False,
        npairs=npairs,
        filtered=True,
        capacity=npairs,
        pair_i=byte_view(pair_i),
        pair_j=byte_view(pair_j),
        rij=byte_view(rij),
        pair_forces=byte_view(out.pair_forces),
        want_pairs=True,
        atom_energies=byte_view(out.atom_energies),
        atom_forces=byte_view(out.atom_forces),
        collectives=collectives,
        tags=byte_view(np.arange(1, ntotal + 1, dtype=np.int64)),
        tag_bytes=8,
        timestep=0,
    )
    return out


#: Multi-rank = single-process reference to this relative difference, in float64.
UNIT_TOLERANCE = 1e-10


def relative(got, ref) -> float:
    """``max|got - ref| / max|ref|`` over every component."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def assert_same_results(got, ref, tol: float = UNIT_TOLERANCE) -> None:
    """Energy, per-atom energies, forces, virial and per-atom virials of two results
    (:class:`Gathered` or ``reference.ReferenceResult``) within ``tol`` relative each."""
    diffs = {
        "energy": relative([got.energy], [ref.energy]),
        "atom_energies": relative(got.atom_energies, ref.atom_energies),
        "forces": relative(got.forces, ref.forces),
        "virial": relative(got.virial, ref.virial),
        "atom_virials": relative(got.atom_virials, ref.atom_virials),
    }
    assert all(d <= tol for d in diffs.values()), diffs


def gather_evaluations(system: System, graphs: list[RankGraph], results) -> Gathered:
    """:func:`gather` of each rank's ``engine.Evaluation``."""
    return gather(
        system,
        graphs,
        [r.atom_energies.numpy() for r in results],
        [r.pair_forces.numpy() for r in results],
    )


def assert_null_atom_left_out(potential, system: System, total_charge: float = 1.0) -> None:
    """An atom of a NULL type (species -1, here the fifth) takes part in nothing: zero
    energy and force, and the others as without it."""
    from nvalchemi_lammps.reference import evaluate_reference

    species = system.species.copy()
    species[4] = -1
    with_null = evaluate_reference(
        potential, system.positions, system.cell, system.pbc, species, total_charge=total_charge
    )
    keep = np.arange(system.natoms) != 4
    without = evaluate_reference(
        potential,
        system.positions[keep],
        system.cell,
        system.pbc,
        species[keep],
        total_charge=total_charge,
    )
    assert with_null.atom_energies[4] == 0.0 and not with_null.forces[4].any()
    assert relative(with_null.forces[keep], without.forces) <= UNIT_TOLERANCE
    assert relative([with_null.energy], [without.energy]) <= UNIT_TOLERANCE


#: A net charge a model that takes one refuses, and the message (the engine's check).
BAD_TOTAL_CHARGES = [
    (0.5, "total charge must be an integer number of e, got 0.5"),
    (1e3, "total charge must be finite and at most 100 e, got 1000.0"),
    (float("nan"), "total charge must be finite and at most 100 e, got nan"),
]


def assert_same_weights(loaded: torch.nn.Module, expected: torch.nn.Module) -> None:
    """Every tensor of ``expected``'s state is ``loaded``'s, bit for bit."""
    state = loaded.state_dict()
    for key, value in expected.state_dict().items():
        assert torch.equal(state[key], value), key


def exported(config: str, tmp_path, name: str):
    """The model ``nvalchemi-lammps export`` writes from the TOML text ``config``, loaded."""
    from nvalchemi_lammps import load_model
    from nvalchemi_lammps.cli import main

    toml, out = tmp_path / f"{name}.toml", tmp_path / f"{name}.pt"
    toml.write_text(config)
    assert main(["export", str(toml), "-o", str(out)]) == 0
    return load_model(out)


def local_graph(nlocal: int, species: np.ndarray, pairs, *comm, rij=None, **inputs) -> LocalGraph:
    """A :class:`LocalGraph` over numpy arrays: ``pairs`` holds ``pair_i``, ``pair_j`` and
    ``rij`` (a :class:`RankGraph`, a ``reference.PairList``); ``rij`` replaces its rij."""
    return LocalGraph(
        nlocal,
        torch.from_numpy(species),
        torch.from_numpy(pairs.pair_i),
        torch.from_numpy(pairs.pair_j),
        torch.from_numpy(pairs.rij) if rij is None else rij,
        *comm,
        **inputs,
    )


def in_float32(double: torch.nn.Module) -> torch.nn.Module:
    """The same model with the same weights, in float32."""
    single = type(double).from_config({**double.config(), "dtype": "float32"})
    single.load_state_dict(double.state_dict())
    return single
