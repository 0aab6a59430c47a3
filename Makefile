# bc: `make demo` runs a local lab, `make test` runs the tests. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The optional extra `libvirt` (libvirt-python, the libvirt runtime) has no wheels and compiles against the
# host's libvirt: installed only where pkg-config finds libvirt-dev (.ci/run installs it), at the pinned version.
# The stamp names it, so a venv made before libvirt-dev was installed is completed by the next make.
LIBVIRT := $(shell pkg-config --exists libvirt 2>/dev/null && echo libvirt)
comma := ,
EXTRAS := dev$(if $(LIBVIRT),$(comma)libvirt)
STAMP := $(VENV)/.installed$(if $(LIBVIRT),-libvirt)

# Python caches compiled modules (__pycache__, git-ignored) as any installed copy of bc has them. A shell
# that sets PYTHONDONTWRITEBYTECODE would make every `bc` and agent process the tests and benchmarks start
# compile the whole project again: about 0.7 s each on this machine (docs/design.md, "The CLI's start-up").
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv demo test test-slow test-fast lint proto check bench bench-fleet sim-sweep smoke zipapp binary clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m bc.cli.demo

# The store and control suites run on PostgreSQL too (tests/pg.py): this machine's local database by
# default; `make test BC_TEST_POSTGRES=` skips those cases (each says why). Two workers (pytest-xdist),
# whole files per worker so a file's session fixtures (built binaries) are made once, in our order
# (tests/conftest.py puts the binary-building files first; xdist would otherwise send the biggest files first).
BC_TEST_POSTGRES ?= postgresql://postgres@127.0.0.1:5432/test
export BC_TEST_POSTGRES
PYTEST_WORKERS ?= auto

# `make test` leaves out the tests marked slow (PyInstaller builds, the heavy simulator seeds, the longest
# end-to-end runs: the lists are SLOW_FILES and SLOW_TESTS in tests/conftest.py) to stay within ten minutes
# on 2 cores; `make test-slow` runs them, and .ci/run runs both.
test: $(STAMP)
	$(PY) -m pytest -q -rfEs -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -rfEs -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 -m slow

test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not e2e and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) build/gen_proto.py --check
	$(PY) build/check_wiring.py

proto: $(STAMP)
	$(PY) build/gen_proto.py

check: lint test

bench: $(STAMP)
	$(PY) -m bench.run

# Issue 38's fleet figures (docs/scale.md): FLEET_NODES generated sessions on FLEET_GATEWAYS `bc serve` over one
# PostgreSQL schema, plus FLEET_CONTROL full `bc node` processes; steady state, `bc nodes --json`, a reconnect
# storm and a re-home. Not part of `make test`; the defaults take about 5-10 minutes on 2 cores
# (FLEET_NODES=10000 FLEET_AGENT_PROCS=4 for the full run, which needs more cores than 2: docs/scale.md).
FLEET_NODES ?= 1000
FLEET_GATEWAYS ?= 3
FLEET_AGENT_PROCS ?= 2
FLEET_CONTROL ?= 3
FLEET_WINDOW ?= 30
FLEET_ARGS ?=
# Then bench.fleet_rows: the rows that need no generated fleet (CPU per command, PostgreSQL against SQLite, the
# placement pass, `bc nodes --json` and the TUI at 10,000 nodes, the journal), each beside its goal;
# FLEET_ROWS picks them (comma-separated; empty skips them).
FLEET_ROWS ?= throughput,placement,nodes,tui,journal
bench-fleet: $(STAMP)
	$(PY) -m bench.fleet --nodes $(FLEET_NODES) --gateways $(FLEET_GATEWAYS) --agent-procs $(FLEET_AGENT_PROCS) \
		--control $(FLEET_CONTROL) --window $(FLEET_WINDOW) --url $(BC_TEST_POSTGRES) $(FLEET_ARGS)
	$(if $(FLEET_ROWS),$(PY) -m bench.fleet_rows --only $(FLEET_ROWS) --gateways $(FLEET_GATEWAYS) --url $(BC_TEST_POSTGRES))

# The simulator measures itself (docs/sim.md, "Sweeps"): each --break's catch rate with 1 and 3 gateways and the
# unbroken shapes, over SIM_SEEDS at 50 nodes, heavy chaos, 30 simulated minutes. Long (hours on 2 cores): not
# part of `make test`, which keeps one short seed per shape and per break.
SIM_SEEDS ?= 1-10
SIM_SWEEP_ARGS ?=
sim-sweep: $(STAMP)
	$(PY) -m bench.sim_sweep --seeds $(SIM_SEEDS) $(SIM_SWEEP_ARGS)

smoke: $(STAMP)
	$(PY) ../shared/checks/smoke.py .

# dist/bc.pyz (needs CPython 3.11 on the host) and dist/bc-<version>-linux-<arch> (needs nothing);
# each rewrites dist/SHA256SUMS. Staging and PyInstaller's work files go to build/out.
zipapp: $(STAMP)
	$(PY) build/dist.py zipapp

binary: $(STAMP)
	$(PY) build/dist.py binary

clean:
	rm -rf $(VENV) .demo dist build/out .pytest_cache .mypy_cache .ruff_cache
