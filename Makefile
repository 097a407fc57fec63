# Two set-up commands: `make run` and `make test`. Everything else is optional.
#
# Set-up happens in three steps, each redone only when its inputs change:
#   $(DEPS)    the virtualenv, the runtime dependencies and the build tools (first time:
#              about a minute, depending on the package mirror);
#   $(NATIVE)  the compiled hot path (mypyc, setup.py), built in place and incrementally:
#              the first build takes about 2–3 minutes on 2 cores, a later one recompiles
#              only the packages whose generated C changed (a comment edit: seconds);
#   $(TOOLS)   the test tools (pytest, mypy, grpcio, …), for `make test` only.
# $(NATIVE) and $(TOOLS) need only $(DEPS): `make -j2 setup` installs the test tools while
# the hot path compiles (.ci/run does).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.deps
NATIVE := $(VENV)/.native
TOOLS  := $(VENV)/.test-tools
PIP    := $(PY) -m pip install --progress-bar off --disable-pip-version-check
SOURCES := $(wildcard routing/*.py routing/*/*.py proxy/*.py proxy/*/*.py proxy/*/*.c tunnel/*.py)
# Each suite runs on WORKERS pytest-xdist workers: the tests mostly wait on sockets,
# timers and child processes, every server binds a port the OS picks (or one a test
# picked below the ephemeral range), and no test shares state with another outside its
# own process. `make test WORKERS=0` runs them one by one in one process.
WORKERS ?= 2
PYTEST := -m pytest -n $(WORKERS)

.PHONY: run test test-pure bench setup clean

$(DEPS): pyproject.toml setup.py
	@echo "==> [1/3] virtualenv $(VENV), runtime dependencies and build tools (about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) --quiet --upgrade pip
	$(PIP) 'setuptools>=77' wheel 'mypy>=1.13'
	@# The package itself, editable and not compiled here: $(NATIVE) compiles it in place.
	TUNNELGATE_PURE_PYTHON=1 $(PIP) --no-build-isolation -e .
	touch $@

$(NATIVE): $(DEPS) $(SOURCES)
	@echo "==> [2/3] compiling the hot path with mypyc (first time about 2–3 minutes; later only what changed)"
	$(PY) setup.py --quiet build_ext --inplace
	touch $@

$(TOOLS): $(DEPS) pyproject.toml
	@echo "==> [3/3] test tools (pytest, hypothesis, grpcio, kubernetes-validate, …)"
	$(PIP) $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"])')
	touch $@

setup: $(NATIVE) $(TOOLS)

run: $(NATIVE)
	$(PY) -m proxy demo

test: $(NATIVE) $(TOOLS)
	$(PY) $(PYTEST)

# The same suite on the same sources run as plain Python (the fallback when nothing can
# be compiled): a copy of the tree without the compiled extensions. Less the type check
# of the sources, which does not depend on the build: `make test` runs it.
PURE := $(shell mktemp -u /tmp/tunnelgate-pure.XXXXXX)
test-pure: $(NATIVE) $(TOOLS)
	mkdir -p $(PURE)
	tar --exclude=./.venv --exclude=./build --exclude='*.so' --exclude=./.git -cf - . \
		| tar -xf - -C $(PURE)
	cd $(PURE) && env -u TUNNELGATE_REQUIRE_NATIVE $(abspath $(PY)) $(PYTEST) \
		--deselect tests/test_native_build.py::test_the_packages_type_check; \
		status=$$?; rm -rf $(PURE); exit $$status

bench: $(NATIVE) $(TOOLS)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info routing/*.so proxy/*.so proxy/*/*.so tunnel/*.so
