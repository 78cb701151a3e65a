"""A small invariant message-passing potential in plain torch.

It exists to exercise what message-passing MLIPs need from a decomposed system (ghost
features refreshed after every layer, or a ghost shell ``layers x cutoff`` deep) without
any model package. Weights are random (seeded) unless loaded from a model file.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..contract import LocalGraph, ModelSpec
from ._base import Potential, register_potential
from ._layers import added, energy_rows, receiving_pairs, updated_rows, with_ghost_rows


def _smooth_cutoff(r: torch.Tensor, cutoff: float) -> torch.Tensor:
    # 1 - 10u^3 + 15u^4 - 6u^5: value, slope and curvature vanish at the cutoff
    u = (r / cutoff).clamp(max=1.0)
    return 1.0 - u**3 * (10.0 - 15.0 * u + 6.0 * u * u)


@register_potential
class MessagePassing(Potential):
    """``layers`` rounds of ``h_i += MLP(sum_j W(r_ij) * h_j)``, then per-atom readout.

    ``h`` starts as a per-element embedding; ``W(r)`` is a linear map of a smooth Bessel
    radial basis. Between layers the ghost rows of ``h`` are refreshed through
    ``graph.comm.forward_exchange``, so with the exchange strategy a ghost shell of one
    cutoff suffices and layers update owned rows only; under the widened shell the exchange
    is the identity and the ghosts still needed compute their features from their own pairs
    (``_layers``).

    :param elements: element names
    :param cutoff: pair cutoff
    :param layers: message-passing rounds (>= 1)
    :param features: width of ``h``
    :param radial_basis: number of Bessel functions in ``W(r)``
    :param seed: seed of the random initial weights
    :param units: LAMMPS unit style of the energies and lengths
    :param dtype: ``float64`` or ``float32``
    """

    name = "message_passing"

    def __init__(
        self,
        elements: list[str],
        cutoff: float,
        layers: int = 2,
        features: int = 16,
        radial_basis: int = 8,
        seed: int = 0,
        units: str = "metal",
        dtype: str = "float64",
    ) -> None:
        super().__init__()
        self.spec = ModelSpec(
            elements=tuple(elements),
            cutoff=float(cutoff),
            units=units,
            dtype=dtype,
            layers=int(layers),
        )
        self._config = {
            "elements": list(elements),
            "cutoff": float(cutoff),
            "layers": int(layers),
            "features": int(features),
            "radial_basis": int(radial_basis),
            "seed": int(seed),
            "units": units,
            "dtype": dtype,
        }
        generator = torch.Generator().manual_seed(seed)
        dt = self.spec.torch_dtype

        def weight(*shape: int, scale: float) -> torch.nn.Parameter:
            w = torch.randn(*shape, generator=generator, dtype=torch.float64) * scale
            return torch.nn.Parameter(w.to(dt))

        n_el = len(elements)
        self.embedding = weight(n_el, features, scale=1.0)
        self.radial = torch.nn.ParameterList(
            [
                weight(radial_basis, features, scale=1.0 / math.sqrt(radial_basis))
                for _ in range(layers)
            ]
        )
        self.update = torch.nn.ParameterList(
            [weight(features, features, scale=0.5 / math.sqrt(features)) for _ in range(layers)]
        )
        self.readout = weight(features, scale=0.1 / math.sqrt(features))
        self.element_energy = weight(n_el, scale=0.1)
        frequencies = torch.arange(1, radial_basis + 1, dtype=torch.float64) * math.pi / cutoff
        self.register_buffer("frequencies", frequencies.to(dt))

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def prepare_compile(self) -> Potential:
        # the smooth cutoff is zero beyond the cutoff, NULL atoms are masked
        return self

    def forward(self, graph: LocalGraph) -> torch.Tensor:
        cutoff = self.spec.cutoff
        mapped = graph.species >= 0
        species = graph.species.clamp(min=0)
        r = torch.linalg.vector_norm(graph.rij, dim=1)
        envelope = _smooth_cutoff(r, cutoff) / r
        basis = torch.sin(r[:, None] * self.frequencies) * envelope[:, None]

        h = self.embedding[species]
        for layer, rows in enumerate(updated_rows(graph, self.spec.layers)):
            if layer > 0:
                h = graph.comm.forward_exchange(h)
            pairs = receiving_pairs(graph, rows)
            pair_i, pair_j, pair_basis = (
                (graph.pair_i, graph.pair_j, basis)
                if pairs is None
                else (graph.pair_i[pairs], graph.pair_j[pairs], basis[pairs])
            )
            messages = (pair_basis @ self.radial[layer]) * h[pair_j]
            summed = torch.zeros_like(h).index_add(0, pair_i, messages)
            # rows not updated are never read again
            rows_summed = summed if rows is None else summed[rows]
            h = added(h, rows, torch.nn.functional.silu(rows_summed @ self.update[layer]))
        n = energy_rows(graph)
        energies = h[:n] @ self.readout + self.element_energy[species[:n]]
        return with_ghost_rows(torch.where(mapped[:n], energies, 0.0), graph.ntotal)
