# dpsweep: `make demo` runs the main job, `make test` runs the test suite.
# Both create .venv if missing and install the project with its extras first. Every pip call
# goes through constraints.txt, which pins torch to the CPU build (see docs/environment.md).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --disable-pip-version-check -c constraints.txt
STAMP := $(VENV)/.installed-stamp
# docker-compose v1 (PyPI) in its own venv: the tests validate docker-compose.yml with
# `docker-compose config` (no Docker engine needed). Its PyYAML 5 builds only with cython<3.
COMPOSE_VENV := .venv-compose
COMPOSE_STAMP := $(COMPOSE_VENV)/.installed-stamp
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt

.PHONY: install demo test lint typecheck docs pytest bench report clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -q -U pip setuptools wheel
	$(PIP) -q -e '.[server,dev,onnx,docs,finetune]'
	touch $(STAMP)

install: $(STAMP)

$(COMPOSE_STAMP):
	test -x $(COMPOSE_VENV)/bin/python || $(PYTHON) -m venv $(COMPOSE_VENV)
	$(COMPOSE_VENV)/bin/pip install -q --disable-pip-version-check "cython<3" wheel setuptools
	$(COMPOSE_VENV)/bin/pip install -q --disable-pip-version-check --no-build-isolation \
		"docker-compose==1.29.2"
	touch $(COMPOSE_STAMP)

# A real sweep: plan, reserve, run 33 trials on a local Ray into ./dpsweep.db (SQLite), then
# print the results and write the Pareto plots under dpsweep-results/.
demo: install
	$(BIN)/dpsweep run examples/demo.yaml

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

# Two test processes (pytest-xdist), one per core: many tests wait on servers, sweeps and
# subprocesses, so the suite takes 55-70% of its one-process time. Whole files go to one process
# (--dist loadfile), so a module's server or finished sweep is set up once. Each process has
# its own throwaway PostgreSQL, local Rays and temporary directories (tests/conftest.py).
pytest: install $(COMPOSE_STAMP)
	$(BIN)/pytest -n 2 --dist loadfile

# The documentation site, strict: a broken link or anchor, or a page left out of the navigation,
# fails the build (NO_MKDOCS_2_WARNING: the theme's end-of-life banner is not a failure; no
# --quiet, with which mkdocs 1.6 stops counting the warnings that strict mode fails on).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint typecheck docs pytest

bench: install
	$(BIN)/python bench/step_overhead.py
	$(BIN)/python bench/packing.py
	$(BIN)/python bench/generic_packs.py
	$(BIN)/python bench/eval_modes.py
	$(BIN)/python bench/sweep_throughput.py
	$(BIN)/python bench/api_load.py
	$(BIN)/python bench/dashboard_open.py
	$(BIN)/python bench/ledger.py
	$(BIN)/python bench/planning.py
	$(BIN)/python bench/audit.py
	$(BIN)/python bench/first_result.py
	$(BIN)/python bench/vs_opacus.py
	$(BIN)/python bench/vs_opacus.py --grid large
	$(BIN)/python bench/large_batch.py
	$(BIN)/python bench/unit_step.py

# docs/results.md and docs/figures/ from the specs in examples/report/ (real sweeps).
report: install
	$(BIN)/python report/make_report.py --scale full --out docs

clean:
	rm -rf $(VENV) $(COMPOSE_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
