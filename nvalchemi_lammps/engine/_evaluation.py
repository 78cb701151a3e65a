"""What the engine gives a front door for one rank and one step, and the check of what a
potential's forward returned."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..contract import Potential


class Readback:
    """A step's energy and whether it is finite, read from the device on first use: the
    one host sync of a step, which a front door makes after it has queued its writes of
    the forces (the GPU runs them meanwhile instead of waiting for the host).

    :param sums: the energy, then sums whose finiteness counts too (a sum is finite iff
        all its terms are, short of overflowing past 1e308, which no force of a working
        model reaches); or the energy itself, a float
    :param scale: the energy is ``scale`` times ``sums[0]`` (exact for a power of two)
    :param on_nonfinite: called when the values are not finite, before :attr:`finite`
        returns (it may raise, naming the cause)
    """

    def __init__(
        self,
        sums: torch.Tensor | float,
        scale: float = 1.0,
        on_nonfinite: Callable[[], None] | None = None,
    ) -> None:
        self._sums, self._scale, self._on_nonfinite = sums, scale, on_nonfinite
        self._values: tuple[float, bool] | None = None

    def values(self, name_cause: bool = True) -> tuple[float, bool]:
        """The energy and whether every value is finite; ``name_cause``: call
        ``on_nonfinite`` when they are not (it reads the step's inputs: only while they
        are still the step's)."""
        if self._values is None:
            sums = self._sums
            values = sums.tolist() if isinstance(sums, torch.Tensor) else [sums]
            self._values = (values[0] * self._scale, all(map(math.isfinite, values)))
        if not self._values[1] and name_cause and self._on_nonfinite is not None:
            self._on_nonfinite()
        return self._values


@dataclass(frozen=True)
class Evaluation:
    """What goes back to LAMMPS for one rank and one step.

    From a captured potential (:class:`~._captured.CapturedPotential`) the tensors are views
    of its static buffers, valid until its next evaluation: a front door uses them within
    the step.

    :param readback: :attr:`energy` and :attr:`finite`, read from the device when first
        asked for (a front door asks after it has queued what it writes)
    :param atom_energies: ``(nlocal,)`` float64 energies of the owned atoms, on the
        potential's device; ``(ntotal,)`` for a half pair list (``half_pairs``): ghost rows
        hold their share of pairs counted on this rank, which the front door folds into
        their owners (LAMMPS's reverse communication of per-atom energies). ``None`` when
        the front door did not ask for them (``atom_energies=False``) and a closed form
        (``pair_terms``) gave the energy without them
    :param pair_forces: ``(npairs, 3)`` float64 ``fij = +dE/drij``, on the potential's
        device; the front door applies ``f[i] += fij`` and ``f[j] -= fij``. ``None`` when
        the front door asked for ``pair_scalars`` and the potential gave them
    :param atom_forces: ``(ntotal, 3)`` float64 ``-dE/dx`` of every atom row, for a
        potential that ``needs_positions`` (else ``None``); ghost rows are folded into their
        owners by the front door's reverse communication, like pair forces on ghosts
    :param virial: ``(6,)`` float64 ``xx yy zz xy xz yz`` of ``-h^T dE/dh`` (``h``: the
        cell, rows = lattice vectors), the virial's part that ``sum x . f`` misses, for a
        potential that ``needs_positions`` (else ``None``)
    :param pair_scalars: ``(npairs,)`` float64 ``s`` with ``fij = s * rij``, instead of
        ``pair_forces``, when the front door asked for them (``evaluate(...,
        pair_scalars=True)``) and the potential has a closed form (``pair_terms``): a
        front door that applies pair forces in its own loop multiplies there, and no
        ``(npairs, 3)`` tensor is made or copied
    """

    readback: Readback = field(repr=False)
    atom_energies: torch.Tensor | None
    pair_forces: torch.Tensor | None
    atom_forces: torch.Tensor | None = None
    virial: torch.Tensor | None = None
    pair_scalars: torch.Tensor | None = None

    @property
    def energy(self) -> float:
        """Sum of ``atom_energies``: this rank's share of the potential energy."""
        return self.readback.values()[0]

    @property
    def finite(self) -> bool:
        """The energy and every force (and the virial) are finite numbers; the front doors
        stop the run when not."""
        return self.readback.values()[1]


def check_energies(potential: Potential, energies: object, ntotal: int) -> None:
    """Refuse what a potential's forward returned unless it is a floating-point tensor of
    one energy per row, naming the potential and what it gave (an integer tensor would run
    on with zero forces; a list or ``None`` would fail far from the cause)."""
    if not isinstance(energies, torch.Tensor):
        got = "None" if energies is None else f"a {type(energies).__name__}"
    elif not energies.dtype.is_floating_point:
        got = f"a tensor of dtype {energies.dtype}"
    elif energies.shape != (ntotal,):
        raise ValueError(
            f"potential '{potential.name}' returned energies of shape {tuple(energies.shape)}, "
            f"wanted ({ntotal},)"
        )
    else:
        return
    raise ValueError(
        f"potential '{potential.name}' returned {got}: its forward must return a "
        f"floating-point torch.Tensor of shape ({ntotal},), one energy per atom row"
    )


def virial_voigt(cell: torch.Tensor, cell_grad: torch.Tensor) -> torch.Tensor:
    """``xx yy zz xy xz yz`` of ``-h^T dE/dh`` (``h``: the cell, rows = lattice vectors), the
    virial's part that ``sum x . f`` misses (views and one stack: no host data, so a CUDA
    graph can hold it)."""
    v = -(cell.detach().T @ cell_grad)
    return torch.stack((v[0, 0], v[1, 1], v[2, 2], v[0, 1], v[0, 2], v[1, 2]))
