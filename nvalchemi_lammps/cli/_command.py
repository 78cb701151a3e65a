"""What every subcommand module shares: its own ``main(argv=None)``, on/off switches, and
the checks of what a command line names (exit code 2 when they fail)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from types import ModuleType


class UsageError(ValueError):
    """A command line that cannot be run (exit code 2)."""


def subcommand_main(module: ModuleType, name: str, argv: list[str] | None) -> int:
    """Parse ``argv`` with ``module.add_arguments`` and return ``module.run(args)``."""
    parser = argparse.ArgumentParser(
        prog=f"nvalchemi-lammps {name}",
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def add_switch(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """An on-by-default switch ``--flag`` / ``--no-flag``."""
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=True, help=help)


def positive(value: float, flag: str) -> float:
    """``value`` if it is a finite number > 0, else a :class:`UsageError` naming ``flag``."""
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a number > 0, got {value:g}")
    return value


def working_folder(path: Path, flag: str) -> Path:
    """The folder ``path``, made (with its parents) if missing; a :class:`UsageError`
    naming ``flag`` when it cannot be (a file on the way, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot make this folder: {err.strerror}") from None
    return path
