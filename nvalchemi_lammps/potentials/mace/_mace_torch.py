"""mace-torch, imported once without its side effects, and the dtype and mode its networks
are built and run in."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from ..._quiet import without_torchscript_warnings as _quiet_torchscript

_INSTALL_HINT = (
    "the mace potential needs mace-torch: pip install 'nvalchemi-lammps[mace]' "
    "(or pip install mace-torch)"
)


_MACE: Any = None


@contextlib.contextmanager
def weights_only_load_kept() -> Iterator[None]:
    """Import mace-torch modules inside this: ``mace/__init__.py``, ``mace.calculators`` and
    ``mace.cli.create_lammps_model`` set ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, which would
    make every later ``torch.load`` without an explicit ``weights_only`` in this process (and
    its children) unpickle arbitrary code; the variable is put back as it was."""
    key = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _mace() -> Any:
    """``mace.modules``, imported once.

    Three side effects of importing mace-torch 0.3 are undone or avoided here:

    - ``mace/__init__.py`` sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in the environment,
      which would make every later ``torch.load`` without an explicit ``weights_only`` in
      this process (and in any child process) unpickle arbitrary code: it is put back;
    - e3nn loads its constants with ``torch.load``; they contain ``slice`` objects, allowed
      here explicitly so that the load works without that environment variable;
    - mace prints a line to stdout when cuEquivariance is missing (it always is on CPU, and
      this module only uses e3nn): that line is dropped, anything else printed is kept.
    """
    global _MACE
    if _MACE is not None:
        return _MACE
    captured = io.StringIO()
    try:
        with weights_only_load_kept(), _quiet_torchscript(), contextlib.redirect_stdout(captured):
            with torch.serialization.safe_globals([slice]):
                # e3nn loads its constants at import: before mace changes the environment
                importlib.import_module("e3nn.o3")
            import mace.modules
            import mace.tools.compile  # Mace.prepare_compile
            import mace.tools.scripts_utils  # extract_radial_MLP
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    finally:
        for line in captured.getvalue().splitlines():
            if "Cuequivariance acceleration will be disabled" not in line:
                print(line, file=sys.stdout)
    _MACE = mace.modules
    return _MACE


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """mace-torch creates its buffers in torch's default dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _inference(network: torch.nn.Module) -> torch.nn.Module:
    """``network`` in eval mode with weights that need no gradient: the engine differentiates
    by the pair vectors only, and autograd records every operation on a weight that does."""
    for parameter in network.parameters():
        parameter.requires_grad_(False)
    return network.eval()
