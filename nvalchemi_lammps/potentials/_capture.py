"""Whether a potential runs inside a CUDA graph capture (engine/_captured.py)."""

from __future__ import annotations

import torch


def capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph: a potential's checks
    that read values back to the host then stay out (they ran at the warm-ups before)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
