"""Ordering torch's GPU work against Kokkos's in a KOKKOS LAMMPS (both KOKKOS front doors)."""

from __future__ import annotations

import torch

__all__ = ["fence"]


def fence(device: torch.device) -> None:
    """Let Kokkos and torch read only what the other has finished writing on ``device``.
    Kokkos's default CUDA instance runs on a blocking stream (``cudaStreamCreate``),
    which CUDA orders both ways against the legacy default stream, torch's default: there
    every kernel of either already waits for the other's earlier work, and waiting here
    would only stall the host. On any other torch stream, wait for the whole device."""
    if device.type == "cuda" and torch.cuda.current_stream(device).cuda_stream != 0:
        torch.cuda.synchronize(device)
