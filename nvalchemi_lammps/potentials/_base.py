from __future__ import annotations

from importlib import import_module, metadata

from ..contract import Potential

_REGISTRY: dict[str, type[Potential]] = {}

#: Entry-point group through which other packages provide potentials: ``name = "pkg.mod:Cls"``
#: makes model files of potential ``name`` loadable wherever that package is installed.
ENTRY_POINT_GROUP = "nvalchemi_lammps.potentials"

#: Potentials of this package by model-file name -> module under ``potentials``, imported
#: on first use so that a model file needs only its own potential's dependencies.
BUILTIN_MODULES = {
    "lennard_jones": "lennard_jones",
    "message_passing": "message_passing",
    "mace": "mace",
    "ewald": "ewald",
    "pme": "pme",
    "dftd3": "dftd3",
    "aimnet2": "aimnet2",
    "uma": "uma",
    "toolkit_lennard_jones": "toolkit_lennard_jones",
    "pipeline": "pipeline",
}


def register_potential(cls: type[Potential]) -> type[Potential]:
    """Class decorator: make ``cls`` loadable from model files under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def potential_class(name: str) -> type[Potential]:
    """The potential class called ``name``: registered here, or provided by an installed
    package through the ``nvalchemi_lammps.potentials`` entry-point group."""
    if name not in _REGISTRY and name in BUILTIN_MODULES:
        import_module(f"{__package__}.{BUILTIN_MODULES[name]}")
    if name not in _REGISTRY:
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
            _REGISTRY.setdefault(name, entry.load())
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ValueError(f"unknown potential '{name}' (known: {known})") from None
