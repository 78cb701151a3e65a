"""Deliberately broken models, for the tests of ``nvalchemi-lammps validate`` and of how
the pair style fails, and test-only variants of working ones (a path no shipped model takes).

:class:`UnderdeclaredMessagePassing` runs every layer of
:class:`~nvalchemi_lammps.MessagePassing` but its spec declares fewer (``declared_layers``),
so ``pair_style nvalchemi`` treats it as reaching less far than it does: with
``declared_layers=1`` it builds a ghost shell of one cutoff, gives ghost atoms no pairs and
exchanges no features, and the energies come out wrong.

The pair style looks potentials up by name in LAMMPS's embedded interpreter, so this
module must be imported there too: :func:`importable_in_lammps` writes a
``sitecustomize.py`` that does so, for a folder to put on ``PYTHONPATH`` (the embedded
interpreter honours it, as it runs ``site``). Nothing of this is in the package.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from nvalchemi_lammps import LennardJones, MessagePassing
from nvalchemi_lammps.contract import LocalGraph
from nvalchemi_lammps.potentials import register_potential


@register_potential
class UnderdeclaredMessagePassing(MessagePassing):
    """:class:`MessagePassing` with ``layers`` rounds whose spec says ``declared_layers``."""

    name = "test_underdeclared_message_passing"

    def __init__(self, *args: Any, declared_layers: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._true_spec = self.spec
        self.spec = dataclasses.replace(self.spec, layers=declared_layers)
        self._config["declared_layers"] = declared_layers

    def forward(self, graph: LocalGraph) -> Any:
        declared, self.spec = self.spec, self._true_spec  # MessagePassing loops spec.layers
        try:
            return super().forward(graph)
        finally:
            self.spec = declared


@register_potential
class FailingMessagePassing(MessagePassing):
    """:class:`MessagePassing` that raises in its first layer on one MPI rank only (read
    from MPICH's ``PMI_RANK``), while the other ranks wait in the ghost exchange."""

    name = "test_failing_message_passing"

    def __init__(self, *args: Any, failing_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config["failing_rank"] = failing_rank

    def forward(self, graph: LocalGraph) -> Any:
        if os.environ.get("PMI_RANK") == str(self._config["failing_rank"]):
            raise ValueError(f"deliberate failure on rank {self._config['failing_rank']}")
        return super().forward(graph)


@register_potential
class NonFiniteLennardJones(LennardJones):
    """:class:`LennardJones` whose energies turn NaN on atoms of element ``poisoned`` (an
    index into ``elements``) from its ``from_call``-th evaluation on (0: the first)."""

    name = "test_non_finite_lennard_jones"
    symmetric_pair_terms = False  # no pair terms at all (below)

    def __init__(self, *args: Any, poisoned: int = 1, from_call: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config.update(poisoned=poisoned, from_call=from_call)
        self.calls = 0

    def pair_terms(self, graph: LocalGraph) -> tuple[torch.Tensor, torch.Tensor] | None:
        """No closed form: the engine must run :meth:`forward` (issue 18 gives the plain
        Lennard-Jones one, which would skip it)."""
        return None

    def forward(self, graph: LocalGraph) -> Any:
        energies = super().forward(graph)
        self.calls += 1
        if self.calls <= self._config["from_call"]:
            return energies
        nan = torch.full_like(energies, float("nan"))
        return torch.where(graph.species == self._config["poisoned"], nan, energies)


@register_potential
class DirectedPairsLennardJones(LennardJones):
    """:class:`LennardJones` with its closed form but without declaring it symmetric: the
    pair style then hands it every directed pair (a full list) and takes one scalar per
    pair back, the path of a pair potential whose share depends on the direction."""

    name = "test_directed_pairs_lennard_jones"
    symmetric_pair_terms = False


@register_potential
class ExitingLennardJones(LennardJones):
    """:class:`LennardJones` that raises ``SystemExit(3)`` (``exit``) or
    ``KeyboardInterrupt`` (``interrupt``) in its evaluation, on the MPI rank
    ``failing_rank`` only (MPICH's ``PMI_RANK``) or on every rank (-1)."""

    name = "test_exiting_lennard_jones"
    symmetric_pair_terms = False  # no pair terms at all (below)

    def __init__(
        self, *args: Any, raises: str = "exit", failing_rank: int = -1, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._config.update(raises=raises, failing_rank=failing_rank)

    def pair_terms(self, graph: LocalGraph) -> tuple[torch.Tensor, torch.Tensor] | None:
        """No closed form: the engine must run :meth:`forward` (see above)."""
        return None

    def forward(self, graph: LocalGraph) -> Any:
        rank = self._config["failing_rank"]
        if rank < 0 or os.environ.get("PMI_RANK") == str(rank):
            if self._config["raises"] == "exit":
                raise SystemExit(3)
            raise KeyboardInterrupt
        return super().forward(graph)


@register_potential
class WrongReturnLennardJones(LennardJones):
    """:class:`LennardJones` whose forward returns what no potential may: its energies as
    ``int64`` (``returns="int64"``), as a Python list (``"list"``) or ``None``."""

    name = "test_wrong_return_lennard_jones"
    symmetric_pair_terms = False  # no pair terms at all (below)

    def __init__(self, *args: Any, returns: str = "int64", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config.update(returns=returns)

    def pair_terms(self, graph: LocalGraph) -> tuple[torch.Tensor, torch.Tensor] | None:
        """No closed form: the engine must run :meth:`forward` (see above)."""
        return None

    def forward(self, graph: LocalGraph) -> Any:
        energies = super().forward(graph)
        returns = self._config["returns"]
        if returns == "int64":
            return energies.to(torch.int64)
        return energies.tolist() if returns == "list" else None


#: Imports this module in LAMMPS's embedded interpreter only: there ``sys.argv`` is
#: ``['']``; the ``lmp`` launcher (a Python script) need not import torch.
_SITECUSTOMIZE = """\
import sys

if sys.argv in ([], [""]):
    import _broken_models  # noqa: F401  (registers the test potentials)
"""


def importable_in_lammps(folder: Path) -> str:
    """A ``PYTHONPATH`` under which LAMMPS's embedded Python registers this module's
    potentials: ``folder`` (gets a ``sitecustomize.py``) and the tests folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return os.pathsep.join([str(folder), str(Path(__file__).resolve().parent)])
