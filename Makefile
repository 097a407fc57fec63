# Two set-up commands: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench lint clean

# The install compiles the hot path in place (setup.py), so a source change re-installs.
$(STAMP): pyproject.toml setup.py $(wildcard routing/*.py proxy/*.py)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m proxy demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info routing/*.so proxy/*.so
