# make demo : create .venv, install, run the main job (hf-replayssm demo)
# make test : install with dev tools, lint (ruff), run the test suite on the newest transformers 5.x
# make test-compat : the model-equivalence and compiled-decoding tests (marked `equivalence`) on what the GPU images
#   ship: transformers 5.17.0 and torch 2.11 (a second venv; torch 2.11's Dynamo traces less than 2.13's)

PYTHON ?= python3
VENV ?= .venv
COMPAT_VENV ?= .venv-compat
# CPU build from the local wheel store here; on a GPU machine use e.g. `make demo TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
# torch 2.11 has no CPU build on PyPI: its CUDA build (about 4.5 GB with its CUDA libraries) runs on the CPU too.
COMPAT_TORCH_SPEC ?= torch==2.11.0
PIP_FLAGS ?= -q --disable-pip-version-check
# pytest-xdist workers (CI's machine has 2 cores); each worker runs torch single-threaded. --durations shows the
# slowest tests in the log.
PYTEST_WORKERS ?= 2
PYTEST_FLAGS ?= -q -n $(PYTEST_WORKERS) --durations=15
PYTEST_ENV ?= OMP_NUM_THREADS=1

.PHONY: demo test test-compat install clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH_SPEC)"

install: $(VENV)/bin/python
	$(VENV)/bin/pip install $(PIP_FLAGS) -e ".[dev]"

demo: $(VENV)/bin/python
	$(VENV)/bin/pip install $(PIP_FLAGS) -e .
	$(VENV)/bin/hf-replayssm demo

test: install
	$(VENV)/bin/ruff check .
	$(PYTEST_ENV) $(VENV)/bin/python -m pytest $(PYTEST_FLAGS)

$(COMPAT_VENV)/bin/python:
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install $(PIP_FLAGS) "$(COMPAT_TORCH_SPEC)"

test-compat: $(COMPAT_VENV)/bin/python
	$(COMPAT_VENV)/bin/pip install $(PIP_FLAGS) -e ".[test]" "transformers==5.17.0"
	$(PYTEST_ENV) $(COMPAT_VENV)/bin/python -m pytest $(PYTEST_FLAGS) -m equivalence

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .venv-tf517 build *.egg-info
