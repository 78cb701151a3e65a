"""Python side of ``pair_style nvalchemi`` (cpp_bridge/).

The C++ pair style calls :func:`open_session` once per ``pair_style`` command and then the
session's methods. Arrays arrive as writable memoryviews over buffers the pair style owns;
they are wrapped without copying and never kept past the call.
"""

from __future__ import annotations

import torch

from .._elements import map_elements
from .._model_file import load_model
from ..engine import evaluate
from ._lammps_comm import LammpsComm


def _tensor(buffer: memoryview, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    if buffer.nbytes == 0:  # torch.frombuffer refuses empty buffers
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


class PluginSession:
    """One loaded model inside one LAMMPS pair style instance on one rank."""

    def __init__(
        self, path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
    ) -> None:
        self.device = _select_device(device, local_rank)
        self.potential = load_model(path).to(self.device)
        spec = self.potential.spec
        self.cutoff = float(spec.cutoff)
        self.units = spec.units
        self.elements = list(spec.elements)
        self.layers = int(spec.layers)
        self.needs_positions = bool(spec.needs_positions)
        self.strategy = "local"
        self.uses_exchange = False
        self.set_strategy("auto")
        self.total_charge = 0.0
        # LAMMPS's own thread count per rank (OMP_NUM_THREADS / -pk omp); torch's default
        # of one thread per core oversubscribes the cores shared by several ranks.
        torch.set_num_threads(max(1, num_threads))

    def describe(self) -> str:
        spec = self.potential.spec
        return (
            f"{self.potential.name} model: elements {' '.join(spec.elements)}, "
            f"cutoff {spec.cutoff:g}, units {spec.units}, {spec.dtype}, on {self.device}"
        )

    def set_strategy(self, strategy: str) -> None:
        """How ghosts reach past one cutoff (``pair_style ... strategy exchange|shell|auto``).

        A strictly local model (one layer) needs neither and ignores the choice.
        """
        supported = self.potential.spec.strategies
        if self.layers == 1:
            self.strategy = "local"
        elif strategy == "auto":
            self.strategy = supported[0]
        elif strategy in supported:
            self.strategy = strategy
        else:
            raise ValueError(
                f"the {self.potential.name} model does not support strategy {strategy} "
                f"(it supports: {', '.join(supported)})"
            )
        self.uses_exchange = self.strategy == "exchange"

    def set_total_charge(self, charge: float) -> None:
        """Net charge of the whole system (``pair_style ... charge Q``), handed to the model
        every step; models that do not predict charges ignore it."""
        self.total_charge = float(charge)

    def map_types(self, names: list[str]) -> list[int]:
        return map_elements(names, self.potential.spec.elements)

    def compute(
        self,
        nlocal: int,
        species: memoryview,
        pair_i: memoryview,
        pair_j: memoryview,
        rij: memoryview,
        atom_energies_out: memoryview,
        pair_forces_out: memoryview,
        collectives: object,
        system: tuple | None = None,
        system_out: tuple | None = None,
    ) -> float:
        """One step on one rank. ``system`` = ``(positions, charges or None, cell,
        (px, py, pz))`` and ``system_out`` = ``(atom_forces, virial)`` come only for a model
        that ``needs_positions``."""
        ntotal = species.nbytes // 8
        npairs = pair_i.nbytes // 8
        inputs = {}
        if system is not None:
            positions, charges, cell, pbc = system
            inputs = {
                "positions": _tensor(positions, torch.float64, ntotal, 3),
                "charges": None if charges is None else _tensor(charges, torch.float64, ntotal),
                "cell": _tensor(cell, torch.float64, 3, 3),
                "pbc": tuple(bool(p) for p in pbc),
            }
        result = evaluate(
            self.potential,
            nlocal,
            _tensor(species, torch.int64, ntotal),
            _tensor(pair_i, torch.int64, npairs),
            _tensor(pair_j, torch.int64, npairs),
            _tensor(rij, torch.float64, npairs, 3),
            LammpsComm(collectives, exchange=self.uses_exchange),
            total_charge=self.total_charge,
            **inputs,
        )
        _tensor(atom_energies_out, torch.float64, nlocal).copy_(result.atom_energies)
        _tensor(pair_forces_out, torch.float64, npairs, 3).copy_(result.pair_forces)
        if system_out is not None:
            atom_forces_out, virial_out = system_out
            _tensor(atom_forces_out, torch.float64, ntotal, 3).copy_(result.atom_forces)
            _tensor(virial_out, torch.float64, 6).copy_(result.virial)
        return result.energy


def _select_device(device: str, local_rank: int) -> torch.device:
    """``cpu``, ``cuda`` (one GPU per rank: node-local rank modulo the visible GPUs, which
    works under mpirun and srun alike), or an explicit ``cuda:N``."""
    if device == "cpu":
        return torch.device("cpu")
    if not device.startswith("cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N; got '{device}'")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {device} requested but torch {torch.__version__} sees no CUDA device"
        )
    if device == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(device)


def open_session(
    path: str, num_threads: int, device: str = "cpu", local_rank: int = 0
) -> PluginSession:
    return PluginSession(path, num_threads, device, local_rank)
