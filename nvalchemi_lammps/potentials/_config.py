"""Potentials from plain configurations (what a TOML file given to ``nvalchemi-lammps
export`` holds)."""

from __future__ import annotations

import inspect
from typing import Any

from ._base import Potential, potential_class


def potential_from_config(config: dict[str, Any]) -> Potential:
    """Build the potential that ``config`` describes.

    :param config: ``potential`` (registered name) plus that potential's constructor
        arguments
    :raises ValueError: unknown potential, unknown or missing arguments, or arguments the
        potential rejects
    """
    config = dict(config)
    name = config.pop("potential", None)
    if name is None:
        raise ValueError('the configuration needs a top-level key potential = "<name>"')
    cls = potential_class(name)
    # a potential made from something other than its constructor's arguments (mace: a
    # mace-torch checkpoint) reads its own keys
    from_export_config = getattr(cls, "from_export_config", None)
    if from_export_config is not None:
        return from_export_config(config)
    parameters = inspect.signature(cls.__init__).parameters
    allowed = [p for p in parameters if p != "self"]
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} for potential {name} "
            f"(allowed: potential, {', '.join(allowed)})"
        )
    required = [p for p in allowed if parameters[p].default is inspect.Parameter.empty]
    missing = [p for p in required if p not in config]
    if missing:
        raise ValueError(f"potential {name} needs key(s) {', '.join(missing)}")
    return cls.from_config(config)
