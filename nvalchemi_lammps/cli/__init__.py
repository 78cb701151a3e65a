"""The ``nvalchemi-lammps`` command: export, validate and benchmark models, report the
installation, run the demo.

Each subcommand is a module with ``add_arguments(parser)``, ``run(args) -> int`` and a
``main(argv=None) -> int`` of its own; nothing here exits the interpreter, the console
script does that with the returned code.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from . import bench, demo, export, info, validate

#: subcommand name -> module
COMMANDS: dict[str, ModuleType] = {
    "export": export,
    "validate": validate,
    "bench": bench,
    "info": info,
    "demo": demo,
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvalchemi-lammps")
    except PackageNotFoundError:  # a source tree on PYTHONPATH
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nvalchemi-lammps",
        description="Machine-learned interatomic potentials in LAMMPS: pair_style nvalchemi.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_arguments(
            commands.add_parser(
                name,
                help=module.HELP,
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``nvalchemi-lammps`` with ``argv`` (default: the command line); returns the
    exit code."""
    args = _parser().parse_args(argv)
    return COMMANDS[args.command].run(args)


__all__ = ["COMMANDS", "main"]
