# Two set-up commands: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-pure bench clean

# The install compiles the hot path in place (setup.py), so a source change re-installs.
$(STAMP): pyproject.toml setup.py $(wildcard routing/*.py proxy/*.py proxy/*/*.py proxy/*/*.c tunnel/*.py)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m proxy demo

test: $(STAMP)
	$(PY) -m pytest

# The same suite on the same sources run as plain Python (the fallback when nothing can
# be compiled): a copy of the tree without the compiled extensions.
PURE := $(shell mktemp -u /tmp/tunnelgate-pure.XXXXXX)
test-pure: $(STAMP)
	mkdir -p $(PURE)
	tar --exclude=./.venv --exclude=./build --exclude='*.so' --exclude=./.git -cf - . \
		| tar -xf - -C $(PURE)
	cd $(PURE) && env -u TUNNELGATE_REQUIRE_NATIVE $(abspath $(PY)) -m pytest; \
		status=$$?; rm -rf $(PURE); exit $$status

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info routing/*.so proxy/*.so proxy/*/*.so tunnel/*.so
