"""What every subcommand module shares: its own ``main(argv=None)``, and on/off switches."""

from __future__ import annotations

import argparse
from types import ModuleType


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
