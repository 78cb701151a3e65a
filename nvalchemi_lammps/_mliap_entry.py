"""Where ``pair_style mliap unified model.pt`` enters the package.

LAMMPS's ML-IAP unpickles a model file with ``torch.load(weights_only=False)``, which calls
the file's one global, ``nvalchemi_lammps._model_file.mliap_model(record)``; that hands the
record to :func:`unified_model` here. The ML-IAP model class is the one the ML-IAP front door
registers under the entry point :data:`ENTRY_POINT` of group :data:`ENTRY_POINT_GROUP`
(pyproject.toml), as LAMMPS finds the plugin through ``lammps.plugins``: the model file
names no front door and imports none, and this module imports nothing of the package.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

#: The entry-point group under which a front door registers the ML-IAP model class
ENTRY_POINT_GROUP = "nvalchemi_lammps.mliap_unified"
#: Its one entry: a class that takes a model file's record
ENTRY_POINT = "model"


def unified_model(record: object) -> Any:
    """The ML-IAP model of a model file's ``record``, checked as the model file checks it
    (by the class's constructor).

    :raises ImportError: the package is not installed (no entry point), e.g. run from a
        source tree through ``PYTHONPATH``
    """
    found = entry_points(group=ENTRY_POINT_GROUP, name=ENTRY_POINT)
    if not found:
        raise ImportError(
            f"no ML-IAP model class registered (entry point '{ENTRY_POINT}' of group "
            f"'{ENTRY_POINT_GROUP}'): install nvalchemi-lammps (pip install nvalchemi-lammps, "
            "or pip install -e . in its source tree) in the Python LAMMPS embeds"
        )
    return next(iter(found)).load()(record)
