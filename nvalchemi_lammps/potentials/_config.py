"""Potentials from plain configurations (what a TOML file given to ``nvalchemi-lammps
export`` holds)."""

from __future__ import annotations

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
    return potential_class(name).from_export_config(config)
