"""Importing, building and compiling models without the noise of the packages involved:
start-up banners, warnings about a package or the compiler rather than the model."""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
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


@contextlib.contextmanager
def without_warnings(*ignored: tuple[str, type[Warning]]) -> Iterator[None]:
    """Ignore, inside the block, the warnings of each ``(message, category)``: ``message``
    a regular expression matched at the start of the warning's text."""
    with warnings.catch_warnings():
        for message, category in ignored:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


def without_torchscript_warnings() -> contextlib.AbstractContextManager[None]:
    """e3nn builds its modules with ``torch.jit.script`` (and pickles them through
    ``torch.jit.save``/``load``), which recent torch deprecates and which warns about e3nn's
    annotations; those warnings say nothing about the model."""
    return without_warnings(
        (r"`torch\.jit\.(script|save|load)` is deprecated", DeprecationWarning),
        (r"The TorchScript type system doesn't support instance-level annotations", UserWarning),
    )


def without_compiler_warnings() -> contextlib.AbstractContextManager[None]:
    """``torch.compile``'s own, while it compiles: it reads ``.grad`` of the non-leaf
    tensors it traces, its code generation calls TorchScript functions deprecated in torch
    2.10+, and it instantiates the autograd functions it traces."""
    return without_warnings(
        (r"The \.grad attribute of a Tensor", UserWarning),
        (r"`torch\.jit\.", DeprecationWarning),
        (r".*should not be instantiated", DeprecationWarning),
    )
