# The README's two commands. Both build .venv on first use (offline-safe: only the
# package registry is needed) and pass ARGS through.
#   make run  ARGS="--run-config \"head='softmax'\""
#   make test ARGS="-k partition"
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NUM_SUPERNODES ?= 100

.PHONY: run test install clean

install: $(STAMP)

# torch is installed first and alone, pinned, so that the CPU wheel is the one that
# satisfies every later requirement (a range would pull a CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m ovalp_flwr.launch --num-supernodes $(NUM_SUPERNODES) -- $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) .flwr
