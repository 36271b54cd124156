# Set-up from a clean clone: `make demo` or `make test`. Each creates .venv when
# missing, installs the pinned dependencies, builds the extension (only when a
# source changed), then runs.

VENV   := .venv
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-installed
BUILT  := $(VENV)/.extension-built
FBGEMM := .venv-fbgemm
# The Redis peer of the remote-store benchmark (its quick run is part of the test suite).
REDIS  := /usr/bin/redis-server
SOURCES := setup.py setup.cfg $(wildcard csrc/*/*.cpp csrc/*/*.h kernels/*.cpp kernels/*.h)
# The wheel of torch 2.13.0 (CPU) may lie in a local wheel folder; pip finds it there first.
PIP    := $(PY) -m pip install --disable-pip-version-check

.PHONY: demo test bench build clean fbgemm-venv

demo: $(BUILT)
	$(PY) examples/train_ctr.py --plot ctr_learning_curves.png

test: $(BUILT) $(REDIS)
	$(PY) -m pytest test

# The fbgemm peer is optional: where its venv cannot be installed, the results say so.
bench: $(BUILT) $(REDIS)
	-$(MAKE) fbgemm-venv
	$(PY) benchmarks/run.py

fbgemm-venv: $(FBGEMM)/.installed

$(FBGEMM)/.installed: requirements-fbgemm.txt
	python3 -m venv $(FBGEMM)
	$(FBGEMM)/bin/python -m pip install --disable-pip-version-check -r requirements-fbgemm.txt
	touch $@

build: $(BUILT)

$(PY):
	python3 -m venv $(VENV)

$(DEPS): requirements.txt | $(PY)
	$(PIP) -r requirements.txt
	touch $@

# Built against the torch just installed (no build isolation), with ninja.
$(BUILT): $(DEPS) $(SOURCES)
	$(PIP) --no-build-isolation --no-deps -e .
	touch $@

$(REDIS):
	apt-get install -y redis-server || (apt-get update && apt-get install -y redis-server)

clean:
	rm -rf build *.egg-info torch_recdev/*.so $(BUILT)
