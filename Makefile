# The README's two commands. Both build .venv on first use (offline-safe: only the
# package registry is needed) and pass ARGS through.
#   make run  ARGS="--run-config \"head='softmax'\""   (VERBOSE=1: Flower's and Ray's log too)
#   make test ARGS="-k partition"   (WORKERS=0: in this process, no pytest-xdist; ends with the
#                                    15 slowest tests)
#   make test-fast                  the edit loop: the in-process tests but the slow ones
#   make docker-images              the compose demo's images (docs/docker.md)
#   make test-docker                the compose demo end to end (needs a docker engine)
#   make test-browser               the MLflow UI in headless Chromium (docs/tracking.md)
#   make check-reports              every report under reports/ remade from results/, compared
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NUM_SUPERNODES ?= 100
# pytest-xdist workers: the e2e units start first and wait on Flower much of the time, the
# in-process tests niced around them (tests/conftest.py); 5 workers overloaded the first minute
# (a Ray head did not start in 90 s); on the AMD machine 3 took 13:35 and 16:09, 4 took 15:22
# and 16:00 (3: fewer raylet restarts and Flower polls, 1,611 CPU-s against 1,820; docs/testing.md).
# tests/scheduling.py hands out the tests (loadgroup: a shared federation's scenarios on one worker)
WORKERS ?= 3
FAST_WORKERS ?= 2
xdist = -n $(1) $(if $(filter 0,$(1)),,--dist loadgroup)

.PHONY: run test test-fast test-docker test-browser docker-images check-reports install clean

# The tests' processes keep what they free for reuse (glibc's malloc tunables): the suite makes
# and frees large tensors thousands of times, and each one got a fresh mmap whose pages fault in
# again (`make test-fast`: 59 s of the kernel's CPU, 17 s with this; docs/testing.md). Runs
# outside the tests keep the product's own policy (ovalp_flwr/core/memory.py).
test test-fast: export GLIBC_TUNABLES = glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
# ... and write bytecode where the machine says not to (PYTHONDONTWRITEBYTECODE, as here): else
# every worker compiles and assertion-rewrites all test modules again, each session (~5 s each)
test test-fast: export PYTHONDONTWRITEBYTECODE =

install: $(STAMP)

# torch is installed first and alone, pinned, so that the CPU wheel is the one that
# satisfies every later requirement (a range would pull a CUDA build).
# pip's output goes to $(VENV)/install.log (its last lines are shown if it fails).
# The venv holds every package the app needs, so `source .venv/bin/activate` also turns off
# Flower's per-run install of them (Flower's own setting; else `flwr run .` builds a fresh
# environment for every run from PyPI: 5.8 GB here, with a CUDA torch; docs/flower.md).
ACTIVATE_LINE := export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1  \# ovalp-flwr (Makefile): the venv holds the app packages

$(STAMP): pyproject.toml
	@echo "installing into $(VENV) (first run only, a few minutes; log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@grep -qF 'FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION' $(VENV)/bin/activate \
	  || echo '$(ACTIVATE_LINE)' >> $(VENV)/bin/activate
	@{ $(PY) -m pip install --upgrade pip && \
	   $(PY) -m pip install torch==2.13.0 && \
	   $(PY) -m pip install -e ".[test,tracking]"; } > $(VENV)/install.log 2>&1 \
	 || { tail -n 20 $(VENV)/install.log; echo "install failed; see $(VENV)/install.log"; exit 1; }
	@touch $(STAMP)

run: $(STAMP)
	@$(PY) -m ovalp_flwr.ops.launch --num-supernodes $(NUM_SUPERNODES) $(if $(VERBOSE),--verbose) -- $(ARGS)

test: $(STAMP)
	@$(PY) -m pytest -q $(call xdist,$(WORKERS)) --durations=15 $(ARGS)

test-fast: $(STAMP)
	@$(PY) -m pytest -q -m "not e2e and not slow" $(call xdist,$(FAST_WORKERS)) $(ARGS)

docker-images: $(STAMP)
	@$(PY) -m ovalp_flwr.ops.images $(ARGS)

test-docker: $(STAMP)
	@$(PY) -m pytest -q -rs -m docker $(ARGS)

test-browser: $(STAMP)
	@$(PY) -m pytest -q -rs -m browser $(ARGS)

check-reports: $(STAMP)
	@$(PY) -m ovalp_flwr.experiments.report.check $(ARGS)

clean:
	rm -rf $(VENV) .flwr
