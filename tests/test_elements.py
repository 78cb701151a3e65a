"""``pair_coeff * * <elements>``: LAMMPS types to model species."""

from __future__ import annotations

import re

import pytest

from nvalchemi_lammps import map_elements

MODEL = ("Ar", "Ne")


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["Ar", "Ne"], [0, 1]),
        (["Ne", "Ar"], [1, 0]),
        (["Ar", "NULL", "Ne"], [0, -1, 1]),
        (["NULL", "NULL"], [-1, -1]),
        (["Ar", "Ar", "Ne", "Ar"], [0, 0, 1, 0]),
        (["Ne"], [1]),
        ([], []),
    ],
    ids=[
        "in-order",
        "reversed",
        "null",
        "all-null",
        "several-types-one-element",
        "subset",
        "no-types",
    ],
)
def test_map_elements(names, expected):
    assert map_elements(names, MODEL) == expected
    assert map_elements(names, list(MODEL)) == expected


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["Ar", "Xx"], "element Xx not in model (Ar, Ne)"),
        (["ar"], "element ar not in model (Ar, Ne)"),
        (["null"], "element null not in model (Ar, Ne)"),
        (["Ar", "Kr", "Xe"], "element Kr not in model (Ar, Ne)"),
    ],
    ids=["unknown", "case-sensitive", "lowercase-null", "first-unknown-named"],
)
def test_unknown_element(names, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        map_elements(names, MODEL)
