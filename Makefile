# Set-up from a clean clone: `make demo` or `make test`. Each creates .venv when
# missing, installs the pinned dependencies, builds the extension (only when a
# source changed), then runs.

VENV   := .venv
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-installed
BUILT  := $(VENV)/.extension-built
# The test bindings (torch_recdev._testing: the store engine alone), for tests and benchmarks only.
TESTING := $(VENV)/.testing-built
FBGEMM := .venv-fbgemm
SOURCES := setup.py build_native.py $(wildcard csrc/*/*.cpp csrc/*/*.h csrc/*/*/*.cpp csrc/*/*/*.h)
# The wheel of torch 2.13.0 (CPU) may lie in a local wheel folder; pip finds it there first.
PIP    := $(PY) -m pip install --disable-pip-version-check

.PHONY: demo fleet-demo test soak bench build clean fbgemm-venv redis-peer fio-peer lint format

demo: $(BUILT)
	$(PY) examples/train_ctr.py --plot ctr_learning_curves.png

# The same job as a fleet: two recdev-server shards and two torchrun trainers on 127.0.0.1, all stopped after.
fleet-demo: $(BUILT)
	$(PY) examples/fleet_demo.py -- --plot ctr_fleet_learning_curves.png

# On both cores, each test file on one of them (module fixtures such as the fleet's start once), in
# the order collected: xdist would start the files with the most tests first, which leaves the quick
# benchmark run (two tests, three minutes) to the end, alone on one core.
test: $(BUILT) $(TESTING) redis-peer fio-peer
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder test

# The model-based test of the store (test/model) on random sequences for SOAK_MINUTES minutes;
# `make test` runs its fixed, derandomized sequences.
SOAK_MINUTES ?= 30
soak: $(BUILT) $(TESTING)
	RECDEV_SOAK_MINUTES=$(SOAK_MINUTES) $(PY) -m pytest test/model -x -q -k soak

# Python by ruff (ruff.toml); C++ formatting by clang-format (.clang-format), whose --dry-run lists
# every line it would change (`make format` changes them). C++ is compiled with -Wall -Werror by every build.
CPP_SOURCES = $(shell find csrc -name '*.cpp' -o -name '*.h')
lint: $(DEPS)
	$(VENV)/bin/ruff check .
	@$(VENV)/bin/clang-format --dry-run --Werror $(CPP_SOURCES) && echo "clang-format: the $(words $(CPP_SOURCES)) files of csrc/ are as .clang-format says"

format: $(DEPS)
	$(VENV)/bin/clang-format -i $(CPP_SOURCES)

# The fbgemm peer is optional: where its venv cannot be installed, the results say so.
bench: $(BUILT) $(TESTING) redis-peer fio-peer
	-$(MAKE) fbgemm-venv
	$(PY) benchmarks/run.py

fbgemm-venv: $(FBGEMM)/.installed

$(FBGEMM)/.installed: requirements-fbgemm.txt
	python3 -m venv $(FBGEMM)
	$(FBGEMM)/bin/python -m pip install --disable-pip-version-check -r requirements-fbgemm.txt
	touch $@

build: $(BUILT)

$(TESTING): $(BUILT)
	$(PY) build_native.py --testing
	touch $@

$(PY):
	python3 -m venv $(VENV)

$(DEPS): requirements.txt | $(PY)
	$(PIP) -r requirements.txt
	touch $@

# Built against the torch just installed (no build isolation), with ninja.
$(BUILT): $(DEPS) $(SOURCES)
	$(PIP) --no-build-isolation --no-deps -e .
	touch $@

# The Redis peer of the remote-store benchmark (its quick run is part of the test suite). CI runs as
# root and installs it; without root the benchmark skips that peer and the test suite says so.
redis-peer:
	@command -v redis-server >/dev/null || apt-get install -y redis-server || \
	  (apt-get update && apt-get install -y redis-server) || \
	  echo "note: redis-server is not installed and apt-get cannot install it; the Redis peer is skipped"

# fio measures the disk's own limit for the disk tier's benchmark (suite disk); without it that row
# says fio is missing.
fio-peer:
	@command -v fio >/dev/null || apt-get install -y fio || (apt-get update && apt-get install -y fio) || \
	  echo "note: fio is not installed and apt-get cannot install it; the disk benchmark runs without the disk's limit"

clean:
	rm -rf build *.egg-info torch_recdev/*.so $(BUILT) $(TESTING)
