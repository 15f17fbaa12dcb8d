# django-ledon — developer entry points. See README.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test demo docs venv clean bench

$(VENV)/.installed: pyproject.toml
	@base=$$(scripts/find-python.sh) && echo "using $$base" && "$$base" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,docs]'
	@touch $@

venv: $(VENV)/.installed

## Run the whole suite: lint, types, migrations check, tests on SQLite and PostgreSQL.
test: venv
	scripts/test.sh

## Run the demo on SQLite: migrate, submit sample jobs, run a worker until done.
demo: venv
	scripts/demo.sh

## Build the documentation (warnings are errors) into build/docs.
docs: venv
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs build/docs

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache db.sqlite3*
