"""MACE's forward on a LocalGraph (mace-torch's ``node_energy``), run block by block, with
the ghosts' features exchanged between layers: inside the interaction blocks, as
mace-torch's LAMMPS ML-IAP path does, or between the layers by ``graph.comm``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...contract import Comm, LocalGraph
from .._layers import (
    Rows,
    energy_rows,
    receiving_pairs,
    scattered,
    updated_rows,
    with_ghost_rows,
)
from ._chunked import interaction as chunked_interaction


def _node_energies(
    model: torch.nn.Module,
    graph: LocalGraph,
    head: int,
    dtype: torch.dtype,
    pair_chunk: int = 0,
) -> torch.Tensor:
    """MACE's ``node_energy`` of every row of ``graph`` (ghost rows: anything finite), the
    interaction blocks' pair work in chunks of ``pair_chunk`` pairs (0: all at once;
    :mod:`._chunked`)."""
    mapped = graph.species >= 0
    num_elements = len(model.atomic_numbers)
    node_attrs = torch.nn.functional.one_hot(graph.species.clamp(min=0), num_elements)
    node_attrs = (node_attrs * mapped[:, None]).to(dtype)
    # MACE's edges run sender -> receiver, edge_index = [sender, receiver], and its edge
    # vector is x[receiver] - x[sender] (mace.modules.utils.get_edge_vectors_and_lengths);
    # here j sends to i and rij = x[j] - x[i].
    edge_index = torch.stack([graph.pair_j, graph.pair_i])
    vectors = -graph.rij.to(dtype)
    lengths = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)

    # energies of the owned rows; ghost rows' are never read
    owned = energy_rows(graph)
    node_e0 = model.atomic_energies_fn(node_attrs[:owned])[:, head]
    node_feats = model.node_embedding(node_attrs)
    edge_attrs = model.spherical_harmonics(vectors)
    edge_feats, cutoff = model.radial_embedding(
        lengths, node_attrs, edge_index, model.atomic_numbers
    )
    if hasattr(model, "pair_repulsion"):
        pair_energy = model.pair_repulsion_fn(lengths, node_attrs, edge_index, model.atomic_numbers)
        pair_energy = pair_energy[:owned]
    else:
        pair_energy = torch.zeros_like(node_e0)

    edges = _Edges(edge_attrs, edge_feats, edge_index, cutoff)
    if _exchanges_in_blocks(graph, model):
        features = _owned_features(model, graph, node_attrs, node_feats, edges, pair_chunk)
    else:
        features = _row_features(model, graph, node_attrs, node_feats, edges, pair_chunk)

    node_heads = graph.species.new_full((owned,), head)
    last_only = len(model.readouts) == 1
    readout_energies = [
        readout(_leading_rows(features[-1 if last_only else k], owned), node_heads)[:, head]
        for k, readout in enumerate(model.readouts)
    ]
    if hasattr(model, "scale_shift"):
        # ScaleShiftMACE scales the pair repulsion with the readouts, not the E0s
        interaction_energy = torch.stack([pair_energy, *readout_energies]).sum(dim=0)
        energies = node_e0 + model.scale_shift(interaction_energy, node_heads)
    else:
        energies = torch.stack([node_e0, pair_energy, *readout_energies]).sum(dim=0)
    return with_ghost_rows(torch.where(mapped[:owned], energies, 0.0), graph.ntotal)


def _leading_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x[:rows]``, or ``x`` itself when it has just those rows (the exchange strategy's
    owned features): a slice of every row would still cost a zero-fill and a copy in the
    backward pass."""
    return x if x.shape[0] == rows else x[:rows]


class _Edges(NamedTuple):
    """The interaction blocks' edge arguments, by their names there."""

    edge_attrs: torch.Tensor
    edge_feats: torch.Tensor
    edge_index: torch.Tensor
    cutoff: torch.Tensor | None


def _row_features(
    model: torch.nn.Module,
    graph: LocalGraph,
    node_attrs: torch.Tensor,
    node_feats: torch.Tensor,
    edges: _Edges,
    pair_chunk: int,
) -> list[torch.Tensor]:
    """Every layer's features, rows of the whole graph (``updated_rows`` decides which are
    computed), ghost rows exchanged between layers by ``graph.comm``."""
    features = []
    plan = updated_rows(graph, len(model.interactions))
    for layer, (block, product, rows) in enumerate(zip(model.interactions, model.products, plan)):
        if layer > 0:
            # ghosts take their owners' features (the identity under the widened shell)
            node_feats = graph.comm.forward_exchange(node_feats)
        node_feats, sc = chunked_interaction(
            block,
            pair_chunk,
            node_attrs=node_attrs,
            node_feats=node_feats,
            first_layer=layer == 0,
            **_receiving_edges(graph, rows, edges)._asdict(),
        )
        # the product basis, mace's costliest block per atom, on the rows whose update is used
        attrs = node_attrs
        if rows is not None:
            node_feats, attrs = node_feats[rows], node_attrs[rows]
            sc = None if sc is None else sc[rows]
        node_feats = scattered(rows, _product(product, node_feats, sc, attrs), graph.ntotal)
        features.append(node_feats)
    return features


def _owned_features(
    model: torch.nn.Module,
    graph: LocalGraph,
    node_attrs: torch.Tensor,
    node_feats: torch.Tensor,
    edges: _Edges,
    pair_chunk: int,
) -> list[torch.Tensor]:
    """Every layer's features of the owned rows, for the exchange strategy, as mace-torch's
    ML-IAP path runs the blocks: past the first layer an interaction takes the owned rows,
    exchanges the ghosts' after its ``linear_up`` (``InteractionBlock.handle_lammps``, here
    through ``graph.comm``) and keeps the owned rows' messages, so no per-atom work is done
    on ghost rows but the first layer's embedding."""
    nlocal = graph.nlocal
    hook = _ExchangeHook(graph.comm)
    natoms = (nlocal, graph.ntotal - nlocal)
    owned_attrs = node_attrs[:nlocal]
    features = []
    for layer, (block, product) in enumerate(zip(model.interactions, model.products)):
        node_feats, sc = chunked_interaction(
            block,
            pair_chunk,
            node_attrs=owned_attrs if layer else node_attrs,
            node_feats=node_feats,
            first_layer=layer == 0,
            lammps_class=hook,
            lammps_natoms=natoms,
            **edges._asdict(),
        )
        node_feats = _product(product, node_feats, sc, owned_attrs)
        features.append(node_feats)
    return features


def _product(
    product: torch.nn.Module, node_feats: torch.Tensor, sc: torch.Tensor | None, attrs: torch.Tensor
) -> torch.Tensor:
    """The product basis block on ``node_feats``' rows, also on none."""
    if len(node_feats):
        return product(node_feats=node_feats, sc=sc, node_attrs=attrs)
    # mace's symmetric contraction cannot reshape zero rows; a rank without atoms still
    # exchanges (and reverse-exchanges in backward) like every other rank, so its empty
    # features stay connected to the pair vectors
    width = product.linear.irreps_out.dim
    return node_feats.sum() * node_feats.new_zeros(0, width)


class _ExchangeHook:
    """mace-torch's ghost exchange (``lammps_class`` of its interaction blocks, called by
    ``mace.tools.utils.LAMMPS_MP``: forward after ``linear_up``, reverse in the backward)
    over the contract's collectives."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def forward_exchange(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        self.comm.exchange_into(src, dst, forward=True)

    def reverse_exchange(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        self.comm.exchange_into(src, dst, forward=False)


def _handle_lammps_traced(
    block: torch.nn.Module,
    node_feats: torch.Tensor,
    lammps_class: _ExchangeHook | None,
    lammps_natoms: tuple[int, int],
    first_layer: bool,
) -> torch.Tensor:
    """An interaction block's ``handle_lammps`` in the compiled copy: the owned rows, zero
    ghost rows, through the contract's ``forward_exchange`` (a custom operator with its
    derivative, engine/_compiled.py) rather than mace-torch's ``LAMMPS_MP``. That autograd
    function returns a new tensor written in place by the exchange, and torch 2.11's
    compiler differentiates such an output wrongly: the gradients into the exchange come
    out zero, and with them every force through the ghosts' features (torch 2.13 is right;
    ``tests/test_compiled.py::test_exchange_strategy_on_owned_rows`` under torch 2.11)."""
    if lammps_class is None or first_layer:
        return node_feats
    n_real, n_ghost = lammps_natoms
    if node_feats.shape[0] != n_real + n_ghost:
        node_feats = torch.cat((node_feats, node_feats.new_zeros(n_ghost, node_feats.shape[1])))
    return lammps_class.comm.forward_exchange(node_feats)


def _exchanges_in_blocks(graph: LocalGraph, model: torch.nn.Module) -> bool:
    """Run the blocks as mace-torch's ML-IAP path does (:func:`_owned_features`): with the
    exchange strategy, or one interaction under any strategy (nothing is exchanged, and no
    ghost row's update is used: the block's message ``linear`` and what follows take the
    owned rows only), where every interaction block takes the exchange hook (mace-torch's
    ``lammps_natoms``). Compiled too, the blocks' exchange being the compiled graph's
    custom operator (:func:`_handle_lammps_traced`)."""
    one_layer = len(model.interactions) == 1
    if not (graph.comm.exchange or one_layer):
        return False
    return all(_takes_exchange_hook(type(block)) for block in model.interactions)


def _takes_exchange_hook(block: type) -> bool:
    # and exchanges in handle_lammps, which the compiled copy replaces (prepare_compile)
    code = block.forward.__code__  # its arguments' names (read by torch.compile too)
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return "lammps_natoms" in arguments and hasattr(block, "handle_lammps")


def _receiving_edges(graph: LocalGraph, rows: Rows, edges: _Edges) -> _Edges:
    """The edges into ``rows`` (``None``: all)."""
    pairs = receiving_pairs(graph, rows)
    if pairs is None:
        return edges
    edge_attrs, edge_feats, edge_index, cutoff = edges
    return _Edges(
        edge_attrs[pairs],
        edge_feats[pairs],
        edge_index[:, pairs],
        None if cutoff is None else cutoff[pairs],
    )
