"""Write a model file for pair_style nvalchemi from a TOML configuration.

The configuration names the potential with a top-level key, potential = "lennard_jones";
every other key is an argument of that potential (for lennard_jones: elements, [epsilon]
and [sigma] per element, cutoff, [[pairs]], mixing, shift, units, dtype; see
nvalchemi_lammps.LennardJones). potential = "mace" takes checkpoint (a mace-torch model
file; it is unpickled, so only trusted files), dtype and head instead. --default writes the
built-in argon model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._command import add_switch, subcommand_main

if TYPE_CHECKING:
    from ..potentials import Potential

HELP = "write a model file (.pt) from a TOML configuration"
#: Suffix of model files; ``pair_style nvalchemi`` reads any name, the CLI insists on this one.
MODEL_SUFFIX = ".pt"
#: The built-in model of ``--default`` (in ``nvalchemi_lammps/data/``).
DEFAULT_CONFIG = "argon_lj.toml"


def default_config_text() -> str:
    """TOML text of the built-in argon model."""
    return resources.files("nvalchemi_lammps").joinpath("data", DEFAULT_CONFIG).read_text()


def read_config(path: Path) -> dict[str, Any]:
    """The configuration in the TOML file ``path``.

    :raises ValueError: the file is missing or not valid TOML
    """
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"configuration file {path} not found") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"configuration file {path} is not valid TOML: {err}") from None


def potential_from_config(config: dict[str, Any]) -> Potential:
    """:func:`nvalchemi_lammps.potentials._config.potential_from_config`, imported when
    used so that ``--help`` does not load torch."""
    from ..potentials._config import potential_from_config as build

    return build(config)


def check_model_file(potential: Potential, path: Path) -> None:
    """Load ``path`` back and compare it with ``potential`` on a small cluster.

    Every element pair at several distances inside the cutoff: the potential's energies and
    forces must be finite there, and the reloaded model's agree with them exactly, since
    the same code runs with the same parameters.

    :raises ValueError: what failed (the message names no file: ``path`` may be a temporary)
    """
    import torch

    from .._model_file import load_model
    from ..contract import LocalGraph
    from ..engine import evaluate

    reloaded = load_model(path)
    spec = potential.spec
    if reloaded.spec != spec:
        raise ValueError(f"the file's spec {reloaded.spec} differs from the potential's {spec}")
    n = len(spec.elements)
    # a line of atoms cycling through the elements, 0.3 cutoff apart
    count = max(4, 2 * n)
    species = torch.arange(count, dtype=torch.int64) % n
    x = torch.zeros(count, 3, dtype=torch.float64)
    x[:, 0] = 0.3 * spec.cutoff * torch.arange(count, dtype=torch.float64)
    x[:, 1] = 0.05 * spec.cutoff * (torch.arange(count, dtype=torch.float64) % 3)
    i, j = torch.meshgrid(torch.arange(count), torch.arange(count), indexing="ij")
    rij = x[j.reshape(-1)] - x[i.reshape(-1)]
    keep = (i.reshape(-1) != j.reshape(-1)) & ((rij * rij).sum(1) < spec.cutoff**2)
    pair_i, pair_j, rij = i.reshape(-1)[keep], j.reshape(-1)[keep], rij[keep]
    system = {}
    if spec.needs_positions:
        # the line of atoms in a periodic box around it, with alternating charges
        side = float(x[:, 0].max()) + 2.0 * spec.cutoff
        system = {
            "positions": x,
            "cell": side * torch.eye(3, dtype=torch.float64),
            "pbc": potential.periodicity,
            "charges": 1.0 - 2.0 * (torch.arange(count, dtype=torch.float64) % 2),
        }
    graph = LocalGraph(count, species, pair_i, pair_j, rij, **system)
    # one thread: the BLAS may otherwise split a product by how busy the machine is, and a
    # different split rounds differently (the two models must agree bit for bit)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = evaluate(potential, graph), evaluate(reloaded, graph)
    finally:
        torch.set_num_threads(threads)
    outputs = ["atom_energies", "pair_forces"] + (["atom_forces"] if spec.needs_positions else [])
    cluster = f"a line of {count} atoms of {', '.join(spec.elements)}, 0.3 cutoff apart"
    for name in outputs:
        if not torch.isfinite(getattr(a, name)).all():
            raise ValueError(
                f"the potential's {name.replace('_', ' ')} are not finite on {cluster}: look "
                "for nan or inf among its parameters"
            )
    differing = [name for name in outputs if not torch.equal(getattr(a, name), getattr(b, name))]
    if differing:
        raise ValueError(
            f"the file loaded back gives other {' and '.join(differing).replace('_', ' ')} "
            f"than the potential on {cluster}"
        )


def write_model_file(potential: Potential, path: Path, check: bool) -> None:
    """Write ``path`` only once it is complete and (``check``) passed
    :func:`check_model_file`: it is written into a temporary folder next to it (under its
    own name, which torch's archive records), then renamed, so ``path`` is either the
    checked model or as it was before.

    :raises ValueError: the check failed
    :raises OSError: the file cannot be written there
    """
    from .._model_file import save_model

    folder = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    temporary = folder / path.name
    try:
        try:
            save_model(potential, temporary)
        except RuntimeError as err:  # torch's writer says why in a RuntimeError
            raise OSError(str(err)) from None
        if check:
            check_model_file(potential, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
        folder.rmdir()


def _output_problem(path: Path) -> str | None:
    """Why the model file cannot be written at ``path``, found before any work."""
    if path.suffix != MODEL_SUFFIX:
        return f"the model file must end in {MODEL_SUFFIX}, got {path}"
    if path.is_dir():
        return f"cannot write {path}: it is a folder"
    folder = path.parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        return f"cannot write {path}: {folder} {why}"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "config",
        type=Path,
        nargs="?",
        metavar="CONFIG.toml",
        help='TOML configuration: potential = "<name>" plus its arguments',
    )
    source.add_argument(
        "--default",
        action="store_true",
        help="the built-in argon model (epsilon 0.0104 eV, sigma 3.40 A, cutoff 8.5 A, metal)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="MODEL.pt",
        help=f"model file to write (suffix {MODEL_SUFFIX})",
    )
    add_switch(
        parser, "--check", "load the written file back and compare it with the configured potential"
    )


def run(args: argparse.Namespace) -> int:
    problem = _output_problem(args.output)
    if problem:
        print(f"error: {problem}")
        return 2
    try:
        if args.default:
            config = tomllib.loads(default_config_text())
            source = f"built-in {DEFAULT_CONFIG}"
        else:
            config = read_config(args.config)
            source = str(args.config)
        potential = potential_from_config(config)
    except (ValueError, OSError) as err:
        print(f"error: {err}")
        return 1
    try:
        write_model_file(potential, args.output, args.check)
    except OSError as err:
        print(f"error: cannot write {args.output}: {err.strerror or err}")
        return 2
    except ValueError as err:  # ModelFileError among them
        print(f"error: {args.output} not written: the check of the written file failed: {err}")
        return 1
    spec = potential.spec
    print(
        f"wrote {args.output} from {source}: {potential.name}, elements {' '.join(spec.elements)}, "
        f"cutoff {spec.cutoff:g}, units {spec.units}, {spec.dtype}"
        + (" (reloaded and checked)" if args.check else "")
    )
    print("use it in a LAMMPS input with")
    print(f"  units        {spec.units}")
    print(f"  pair_style   nvalchemi {args.output}")
    print(f"  pair_coeff   * * {' '.join(spec.elements)}    # one element (or NULL) per atom type")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``nvalchemi-lammps export``; returns the exit code."""
    return subcommand_main(sys.modules[__name__], "export", argv)
