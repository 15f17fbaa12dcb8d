# django-ledon — developer entry points. See README.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# A CI leg's interpreter, Django requirement and extras (scripts/test.sh sets them;
# empty: the newest Python >= 3.12 found, the newest Django that pyproject.toml
# allows, and the extras for tests and docs).
PYTHON_VERSION ?=
DJANGO ?=
EXTRAS ?= test,docs

.PHONY: test demo docs venv clean bench bench-quick bench-targets soak chaos failover

# The packages are installed by uv (from PyPI, into the virtualenv first), which
# resolves and installs them several times faster than pip; the virtualenv keeps its
# pip.
UV := $(VENV)/bin/uv pip install --quiet --python $(PY)

$(VENV)/.installed: pyproject.toml
	@base=$$(scripts/find-python.sh $(PYTHON_VERSION)) && echo "using $$base" && "$$base" -m venv $(VENV)
	$(PY) -m pip install --quiet 'uv>=0.13,<1'
	$(UV) -e '.[$(EXTRAS)]' $(if $(DJANGO),'Django$(DJANGO)')
	@touch $@

venv: $(VENV)/.installed

## Run the whole suite: lint, types, migrations check, tests on SQLite and PostgreSQL,
## on every CI leg (a Python and a Django version, scripts/test.sh): the newest leg
## the whole suite, the others the fast and every real-process test (core;
## SCOPE=compat for only the tests of what differs between versions).
## One leg: make test LEG=3.12-5.2. Times: docs/compatibility.md.
test: venv
	SCOPE=$(SCOPE) scripts/test.sh $(if $(LEG),--leg $(LEG))

## Run the demo on SQLite: migrate, submit sample jobs, run a worker until done.
demo: venv
	scripts/demo.sh

## Build the documentation (warnings are errors) into build/docs.
docs: venv
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs build/docs

$(VENV)/.bench-installed: pyproject.toml $(VENV)/.installed
	$(UV) -e '.[test,docs,bench]'
	@touch $@

## Benchmarks against pgqueuer, Procrastinate and django-tasks-db on a throw-away
## PostgreSQL with durable commits (about 20 minutes on 2 CPUs): docs/benchmark-results.md
## and the raw JSON in benchmarks/results/.
bench: $(VENV)/.bench-installed
	$(PY) -m benchmarks
	$(PY) -m benchmarks.workflows
	$(PY) -m benchmarks.wf_ops

## The same, tiny and once (under a minute): benchmarks/results/latest.md.
bench-quick: $(VENV)/.bench-installed
	$(PY) -m benchmarks --quick

## The worker's targets with their verdicts, twice: as the machine is, then with a
## process keeping one CPU busy beside it (about 30 minutes on 2 CPUs): the ratios
## docs/benchmarks.md quotes, and the raw JSON in benchmarks/results/.
bench-targets: $(VENV)/.bench-installed
	$(PY) -m benchmarks --only targets
	$(PY) -m benchmarks --only targets --cpu-burner

## Soak (not in CI): a fixed arrival rate below capacity for MINUTES (default 30) per
## system — django-ledon, pgqueuer, Procrastinate — on a throw-away PostgreSQL with
## durable commits, a transaction held open for a third of it; per-minute throughput,
## pickup p50/p99, table and index sizes and dead tuples: benchmarks/results/soak-latest.md.
## Beside django-ledon's jobs, WORKFLOW_RATE workflow runs a second (default 2; 0: none),
## each a timer and a signal: their advance latency p99, while the horizon is pinned
## against before, and after.
MINUTES ?= 30
WORKFLOW_RATE ?= 2
soak: $(VENV)/.bench-installed
	$(PY) -m benchmarks.soak --minutes $(MINUTES) --workflows $(WORKFLOW_RATE)

$(VENV)/.brokers-installed: pyproject.toml $(VENV)/.installed
	$(UV) -e '.[test,docs,brokers-test]'
	@touch $@

## Chaos (not in CI; the suite runs its short profile, tests/processes/test_chaos.py):
## 100,000 jobs, 20,000 messages, 5,000 workflow runs and 2,000 sagas through real
## engines on a throw-away PostgreSQL, under a seeded schedule of SIGKILL, SIGTERM,
## PostgreSQL restarts, partitions and lost COMMIT replies; then the checker's verdict
## table (chaos/results/full-latest.md), exit status 1 on any violation. RabbitMQ:
## RABBITMQ_URL, or the Debian package started by scripts/brokers.sh (CI installs it with
## scripts/brokers.sh install). PROFILE=short SEED=7 for another run.
PROFILE ?= full
SEED ?= 1
chaos: $(VENV)/.brokers-installed
	$(PY) -m chaos --profile $(PROFILE) --seed $(SEED)

## Failover (not in CI; the suite runs its smoke): a primary and a streaming standby
## started from the PostgreSQL binaries on this machine, the primary killed under load
## and the standby promoted, with asynchronous replication and with remote_apply; the
## figures of docs/guarantees.md are printed.
## The test's own database: DATABASE_URL (PostgreSQL), else a throw-away one.
failover: $(VENV)/.installed
	@dir=$$(mktemp -d /tmp/ledon-failover.XXXXXX); \
	url=$${DATABASE_URL:-$$(scripts/pg.sh start $$dir)} || exit 1; \
	LEDON_FAILOVER=full DATABASE_URL=$$url $(PY) -m pytest -p no:cacheprovider -s -q \
		tests/processes/test_failover.py; status=$$?; \
	[ -n "$${DATABASE_URL:-}" ] || scripts/pg.sh stop $$dir >/dev/null; rm -rf $$dir; \
	exit $$status

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache db.sqlite3*
