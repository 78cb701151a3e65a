"""Several potentials as one: an MLIP plus dispersion plus electrostatics in one pair style.

The pipeline's graph holds every pair within the largest cutoff; each term sees the pairs
within its own cutoff, in its own dtype, and the per-atom energies add up. A term may take
its charges from an earlier term that predicts them (AIMNet2 charges into PME) instead of
from LAMMPS. Terms run in order on every rank, so their collectives line up across ranks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from ..contract import STRATEGIES, LocalGraph, ModelSpec, check_keys
from ._base import Potential, potential_class, register_potential

#: Relative slack when comparing ``layers x cutoff`` reaches (they are products of floats).
_REACH_SLACK = 1e-12


@register_potential
class Pipeline(Potential):
    """The sum of ``terms``, each a potential on the same elements and units.

    The pipeline's spec: the largest cutoff; ``layers`` such that ``layers x cutoff``
    covers the furthest-reaching term (for the widened shell); the strategies every
    message-passing term supports; positions, cell and charges if any term needs them; the
    widest dtype (each term still computes in its own).

    :param terms: the potentials, evaluated in this order
    :param charges_from: per term, the index of an earlier term whose predicted charges it
        reads (that term must predict ``"charges"``), or ``None`` for
        LAMMPS's per-atom charges
    """

    name = "pipeline"

    def __init__(self, terms: list[Potential], charges_from: list[int | None] | None = None):
        super().__init__()
        if not terms:
            raise ValueError("a pipeline needs at least one term")
        charges_from = list(charges_from) if charges_from is not None else [None] * len(terms)
        if len(charges_from) != len(terms):
            raise ValueError(f"charges_from has {len(charges_from)} entries for {len(terms)} terms")
        first = terms[0].spec
        for k, term in enumerate(terms):
            spec = term.spec
            if spec.elements != first.elements:
                raise ValueError(
                    f"pipeline term {k} ({term.name}) has elements {list(spec.elements)}, "
                    f"term 0 ({terms[0].name}) has {list(first.elements)}: export every "
                    "term with the same elements in the same order"
                )
            if spec.units != first.units:
                raise ValueError(
                    f"pipeline term {k} ({term.name}) is in units {spec.units}, term 0 "
                    f"({terms[0].name}) in {first.units}"
                )
            source = charges_from[k]
            if source is not None:
                if not 0 <= source < k:
                    raise ValueError(
                        f"pipeline term {k} ({term.name}) takes charges from term {source}; "
                        "it must be an earlier term"
                    )
                if "charges" not in terms[source].predicts:
                    raise ValueError(
                        f"pipeline term {source} ({terms[source].name}) predicts no charges "
                        f"for term {k} ({term.name})"
                    )
                if not spec.needs_positions:
                    raise ValueError(
                        f"pipeline term {k} ({term.name}) reads no charges; drop its charges_from"
                    )
        self.terms = torch.nn.ModuleList(terms)
        self.charges_from = charges_from
        self.spec = _combined_spec([t.spec for t in terms])

    @property
    def periodicity(self) -> tuple[bool, bool, bool]:
        """The box the terms run in: periodic where every term is."""
        return tuple(all(t.periodicity[d] for t in self.terms) for d in range(3))

    @property
    def system_state(self) -> tuple[str, ...]:
        """What any term takes of ``spin`` and ``task``."""
        return tuple(k for k in ("spin", "task") if any(k in t.system_state for t in self.terms))

    def check_system_state(self, spin: int | None, task: str | None) -> None:
        """A spin or task from the input script goes to the terms that take them; refused if
        none does."""
        takers = [t for t in self.terms if t.system_state]
        for keyword, value in (("spin", spin), ("task", task)):
            if value is not None and not takers:
                raise ValueError(f"no term of this pipeline takes a {keyword}")
        for term in takers:
            term.check_system_state(spin=spin, task=task)

    def check_box(self, pbc: tuple[bool, bool, bool]) -> None:
        for term in self.terms:
            term.check_box(pbc)

    def parts(self) -> list[Potential]:
        return list(self.terms)

    def compiled(self, wrap: Callable[[Potential], Potential]) -> Pipeline:
        """Compiled term by term: the pipeline picks each term's pairs by their length,
        which no fixed-shape graph can do, so that selection runs eagerly between compiled
        terms. Terms that ``wrap`` refuses (no compile support) run eagerly too, and so
        does a term whose predicted charges feed another (a compiled term returns energies
        only). The term that reads them is compiled: its padded graph takes the predicted
        charges as a differentiable input, through which the predicting term's share of
        the forces passes."""
        terms = []
        for k, term in enumerate(self.terms):
            if k not in self.charges_from:
                try:
                    term = wrap(term)
                except ValueError:  # prepare_compile's refusal: this term stays eager
                    pass
            terms.append(term)
        if all(new is old for new, old in zip(terms, self.terms)):
            names = ", ".join(t.name for t in terms)
            raise ValueError(f"no term of this pipeline can be compiled ({names})")
        return Pipeline(terms, self.charges_from)

    def config(self) -> dict[str, Any]:
        return {
            "terms": [
                {"potential": t.name, "config": t.config(), "charges_from": source}
                for t, source in zip(self.terms, self.charges_from)
            ]
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Pipeline:
        entries = config["terms"]
        terms = [potential_class(e["potential"]).from_config(e["config"]) for e in entries]
        return cls(terms, [e.get("charges_from") for e in entries])

    @classmethod
    def from_export_config(cls, config: dict[str, Any]) -> Pipeline:
        """What ``nvalchemi-lammps export`` builds from ``potential = "pipeline"`` and one
        ``[[terms]]`` table per term: that term's own keys (``potential = ...`` and its
        arguments), plus ``charges_from = K`` (0-based index of an earlier term) for a
        term that reads predicted charges."""
        from ._config import potential_from_config

        check_keys(config, "potential pipeline", ("terms",))
        entries = config.get("terms")
        if not isinstance(entries, list) or not entries:
            raise ValueError("potential pipeline needs [[terms]] tables, one per term")
        terms, charges_from = [], []
        for k, entry in enumerate(entries):
            entry = dict(entry)
            charges_from.append(entry.pop("charges_from", None))
            try:
                terms.append(potential_from_config(entry))
            except ValueError as err:
                raise ValueError(f"pipeline term {k}: {err}") from None
        return cls(terms, charges_from)

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        dtype = graph.rij.dtype
        # squared lengths in the pipeline's dtype, the same test on every rank
        rsq = (graph.rij * graph.rij).sum(dim=1)
        total = torch.zeros(graph.ntotal, dtype=dtype, device=graph.rij.device)
        predicted: dict[int, torch.Tensor] = {}
        for k, (term, source) in enumerate(zip(self.terms, self.charges_from)):
            sub = self._term_graph(graph, term.spec, rsq)
            if source is not None:
                sub = dataclasses.replace(sub, charges=predicted[source].to(sub.rij.dtype))
            if any(s == k for s in self.charges_from):
                out = term.outputs(sub)
                predicted[k] = out["charges"]
                energies = out["energies"]
            else:
                energies = term(sub)
            total = total + energies.to(dtype)
        return total

    @staticmethod
    def _term_graph(graph: LocalGraph, spec: ModelSpec, rsq: torch.Tensor) -> LocalGraph:
        """``graph`` as ``spec`` expects it: its pairs and dtype."""
        dtype = spec.torch_dtype
        keep = (rsq < spec.cutoff**2).nonzero().squeeze(1)
        fields = {
            "pair_i": graph.pair_i[keep],
            "pair_j": graph.pair_j[keep],
            "rij": graph.rij[keep].to(dtype),
        }
        if graph.positions is not None:
            fields["positions"] = graph.positions.to(dtype)
            fields["cell"] = graph.cell.to(dtype)
        if graph.charges is not None:
            fields["charges"] = graph.charges.to(dtype)
        return dataclasses.replace(graph, **fields)


def _combined_spec(specs: list[ModelSpec]) -> ModelSpec:
    cutoff = max(s.cutoff for s in specs)
    reach = max(s.interaction_range for s in specs)
    layers = max(1, math.ceil(reach / cutoff * (1.0 - _REACH_SLACK)))
    strategies = list(STRATEGIES)
    for s in specs:
        if s.layers > 1:
            strategies = [x for x in strategies if x in s.strategies]
    if not strategies:
        raise ValueError(
            "the pipeline's message-passing terms share no strategy (exchange or shell)"
        )
    # the first multi-layer term's preference comes first
    preferred = next((s.strategies for s in specs if s.layers > 1), STRATEGIES)
    strategies.sort(key=lambda x: preferred.index(x) if x in preferred else len(preferred))
    dtypes = {s.dtype for s in specs}
    return ModelSpec(
        elements=specs[0].elements,
        cutoff=cutoff,
        units=specs[0].units,
        dtype="float64" if "float64" in dtypes else "float32",
        layers=layers,
        strategies=tuple(strategies),
        needs_positions=any(s.needs_positions for s in specs),
    )
