"""``python -m nvalchemi_lammps.cli``: the ``nvalchemi-lammps`` command."""

from . import main

raise SystemExit(main())
