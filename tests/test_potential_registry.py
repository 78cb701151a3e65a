"""Potentials from other packages are found by name through an entry-point group."""

from __future__ import annotations

from importlib import metadata

import pytest

from nvalchemi_lammps.potentials import LennardJones, _base, potential_class


class _Plugged(LennardJones):
    name = "plugged_lennard_jones"


def test_a_potential_of_another_package_is_found_by_its_entry_point(monkeypatch):
    entry = metadata.EntryPoint(
        name=_Plugged.name, value=f"{__name__}:_Plugged", group=_base.ENTRY_POINT_GROUP
    )

    def entry_points(**selection):
        return [e for e in [entry] if all(getattr(e, k) == v for k, v in selection.items())]

    monkeypatch.setattr(_base.metadata, "entry_points", entry_points)
    monkeypatch.delitem(_base._REGISTRY, _Plugged.name, raising=False)
    assert potential_class(_Plugged.name) is _Plugged
    monkeypatch.delitem(_base._REGISTRY, _Plugged.name)


def test_an_unknown_potential_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown potential 'nope' \(known: .*lennard_jones"):
        potential_class("nope")
