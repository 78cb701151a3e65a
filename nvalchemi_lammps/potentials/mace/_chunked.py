"""MACE's interaction blocks with their per-pair work in chunks of pairs (``pair_chunk``).

Most of a large system's memory in MACE is per pair: the radial MLP's weights of the
convolution (``conv_tp_weights``: hidden layers and one weight per path and channel) and
the convolution's messages, kept for the backward pass, about 17 kB per pair for the
MACE-MP-0-medium shape in float32. Here each chunk's messages are summed onto the rows
and the chunk's intermediates are freed (``torch.utils.checkpoint``), then made again
chunk by chunk in the backward pass: the peak holds one chunk's pair work instead of every
pair's, for one more forward of the pair work (the per-atom blocks run once). The result
is the blocks' own up to the order of the sums (rounding). The ghost exchanges stay
outside the recomputed part, so each runs once per step as without chunks.

The blocks whose forward this reproduces are :data:`CHUNKED_BLOCKS` (those of the
released foundation models' shapes); :func:`check_chunkable` refuses the others.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

#: Interaction block classes (mace.modules.blocks) that run chunked.
CHUNKED_BLOCKS = ("RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock")


def check_chunkable(interaction_classes: list[str]) -> None:
    """Refuse ``pair_chunk`` for a model with an interaction block it cannot run chunked.

    :raises ValueError: naming the block and the ones that can
    """
    for name in interaction_classes:
        if name not in CHUNKED_BLOCKS:
            raise ValueError(
                f"pair_chunk is not supported for MACE interaction blocks {name} (supported: "
                f"{', '.join(CHUNKED_BLOCKS)}); leave pair_chunk at 0"
            )


def interaction(block: torch.nn.Module, pair_chunk: int, **inputs: Any) -> Any:
    """``block(**inputs)``, with the per-pair work in chunks of ``pair_chunk`` pairs when
    there are more pairs than that (``pair_chunk`` 0: never)."""
    if not pair_chunk or inputs["edge_index"].shape[1] <= pair_chunk:
        return block(**inputs)
    return _chunked_forward(block, pair_chunk, **inputs)


def _chunked_forward(
    block: torch.nn.Module,
    pair_chunk: int,
    node_attrs: torch.Tensor,
    node_feats: torch.Tensor,
    edge_attrs: torch.Tensor,
    edge_feats: torch.Tensor,
    edge_index: torch.Tensor,
    cutoff: torch.Tensor | None = None,
    lammps_class: Any = None,
    lammps_natoms: tuple[int, int] = (0, 0),
    first_layer: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward of mace-torch's ``RealAgnosticInteractionBlock`` or
    ``RealAgnosticResidualInteractionBlock`` (mace-torch 0.3.14-0.3.16), step for step,
    but the message from :func:`_chunked_message`."""
    residual = type(block).__name__ == "RealAgnosticResidualInteractionBlock"
    n_real = lammps_natoms[0] if lammps_class is not None else None
    sc = block.skip_tp(node_feats, node_attrs) if residual else None
    node_feats = block.linear_up(node_feats)
    node_feats = block.handle_lammps(
        node_feats,
        lammps_class=lammps_class,
        lammps_natoms=lammps_natoms,
        first_layer=first_layer,
    )
    message = _chunked_message(
        block, pair_chunk, node_feats, edge_attrs, edge_feats, edge_index, cutoff
    )
    message = block.truncate_ghosts(message, n_real)
    node_attrs = block.truncate_ghosts(node_attrs, n_real)
    message = block.linear(message) / block.avg_num_neighbors
    if residual:
        sc = block.truncate_ghosts(sc, n_real)
    else:
        message = block.skip_tp(message, node_attrs)
    return block.reshape(message), sc


def _chunked_message(
    block: torch.nn.Module,
    pair_chunk: int,
    node_feats: torch.Tensor,
    edge_attrs: torch.Tensor,
    edge_feats: torch.Tensor,
    edge_index: torch.Tensor,
    cutoff: torch.Tensor | None,
) -> torch.Tensor:
    """Every row's summed messages, one chunk of pairs at a time, each chunk's pair work
    made again in the backward pass rather than kept (no random numbers in it, so no
    generator state to keep: ``preserve_rng_state=False``, which also keeps a CUDA graph
    capture free of host reads)."""
    message = None
    for start in range(0, edge_index.shape[1], pair_chunk):
        chunk = slice(start, start + pair_chunk)
        part = checkpoint(
            _pair_messages,
            block,
            node_feats,
            edge_attrs[chunk],
            edge_feats[chunk],
            edge_index[:, chunk],
            None if cutoff is None else cutoff[chunk],
            use_reentrant=False,
            preserve_rng_state=False,
        )
        message = part if message is None else message + part
    return message


def _pair_messages(
    block: torch.nn.Module,
    node_feats: torch.Tensor,
    edge_attrs: torch.Tensor,
    edge_feats: torch.Tensor,
    edge_index: torch.Tensor,
    cutoff: torch.Tensor | None,
) -> torch.Tensor:
    """The messages of some pairs summed onto their receivers' rows (every row), as the
    block's forward makes them for all pairs."""
    from mace.tools.scatter import scatter_sum

    weights = block.conv_tp_weights(edge_feats)
    if cutoff is not None:
        weights = weights * cutoff
    if hasattr(block, "conv_fusion"):  # cuEquivariance's convolution sums onto rows itself
        return block.conv_tp(node_feats, edge_attrs, weights, edge_index)
    messages = block.conv_tp(node_feats[edge_index[0]], edge_attrs, weights)
    return scatter_sum(src=messages, index=edge_index[1], dim=0, dim_size=node_feats.shape[0])
