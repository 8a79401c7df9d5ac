# The README's two commands. Both build .venv on first use (offline-safe: only the
# package registry is needed) and pass ARGS through.
#   make run  ARGS="--run-config \"head='softmax'\""   (VERBOSE=1: Flower's and Ray's log too)
#   make test ARGS="-k partition"   (WORKERS=0: in this process, no pytest-xdist; ends with the
#                                    15 slowest tests)
#   make test-fast                  the in-process tests only: the edit loop
#   make docker-images              the compose demo's images (docs/docker.md)
#   make test-docker                the compose demo end to end (needs a docker engine)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NUM_SUPERNODES ?= 100
# pytest-xdist workers; the e2e tests start first and wait on Flower much of the time, so a
# third worker keeps both cores busy; tests/scheduling.py hands out the tests (loadgroup: the
# scenarios of a shared federation on one worker)
WORKERS ?= 3
FAST_WORKERS ?= 2
xdist = -n $(1) $(if $(filter 0,$(1)),,--dist loadgroup)

.PHONY: run test test-fast test-docker docker-images install clean

install: $(STAMP)

# torch is installed first and alone, pinned, so that the CPU wheel is the one that
# satisfies every later requirement (a range would pull a CUDA build).
# pip's output goes to $(VENV)/install.log (its last lines are shown if it fails).
$(STAMP): pyproject.toml
	@echo "installing into $(VENV) (first run only, a few minutes; log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install --upgrade pip && \
	   $(PY) -m pip install torch==2.13.0 && \
	   $(PY) -m pip install -e ".[test]"; } > $(VENV)/install.log 2>&1 \
	 || { tail -n 20 $(VENV)/install.log; echo "install failed; see $(VENV)/install.log"; exit 1; }
	@touch $(STAMP)

run: $(STAMP)
	@$(PY) -m ovalp_flwr.ops.launch --num-supernodes $(NUM_SUPERNODES) $(if $(VERBOSE),--verbose) -- $(ARGS)

test: $(STAMP)
	@$(PY) -m pytest -q $(call xdist,$(WORKERS)) --durations=15 $(ARGS)

test-fast: $(STAMP)
	@$(PY) -m pytest -q -m "not e2e" $(call xdist,$(FAST_WORKERS)) $(ARGS)

docker-images: $(STAMP)
	@$(PY) -m ovalp_flwr.ops.images $(ARGS)

test-docker: $(STAMP)
	@$(PY) -m pytest -q -rs -m docker $(ARGS)

clean:
	rm -rf $(VENV) .flwr
