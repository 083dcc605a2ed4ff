# make demo : create .venv, install, run the main job (hf-replayssm demo)
# make test : install with dev tools, lint (ruff), run the test suite on the newest transformers 5.x
# make test-compat : the whole suite again on transformers 5.17.0 (a second venv)

PYTHON ?= python3
VENV ?= .venv
COMPAT_VENV ?= .venv-tf517
# CPU build from the local wheel store here; on a GPU machine use e.g. `make demo TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
PIP_FLAGS ?= -q --disable-pip-version-check

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
	$(VENV)/bin/python -m pytest -q

$(COMPAT_VENV)/bin/python:
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH_SPEC)"

test-compat: $(COMPAT_VENV)/bin/python
	$(COMPAT_VENV)/bin/pip install $(PIP_FLAGS) -e ".[dev]" "transformers==5.17.0"
	$(COMPAT_VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) $(COMPAT_VENV) build *.egg-info
