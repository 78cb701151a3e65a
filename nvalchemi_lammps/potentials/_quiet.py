"""Importing model packages without their start-up noise."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

#: How the lines of Warp's start-up banner begin (printed when a package initializes Warp).
_WARP_BANNER = ("Warp ", "   CUDA Toolkit", "   Devices:", '     "', "   Kernel cache:", "     /")


@contextlib.contextmanager
def without_warp_banner() -> Iterator[None]:
    """Drop Warp's banner from what the block prints to stdout; print anything else."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    finally:
        for line in captured.getvalue().splitlines():
            if not line.startswith(_WARP_BANNER):
                print(line, file=sys.stdout)
