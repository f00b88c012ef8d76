# MergePipe: `make demo` runs the main job end to end, `make test` runs the tests
# (`make test-pg`: the same on a PostgreSQL catalog).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that lies on the build machines' disk; see README.
TORCH := torch==2.13.0

.PHONY: demo test test-unit test-pg test-all lint bench bench-quick clean

# A plain editable install of src/mergepipe/ (a path entry: modules and subpackages added later
# import without reinstalling). Both stamps depend on
# pyproject.toml: a changed dependency list reinstalls; a changed C kernel (setup.py compiles
# src/mergepipe/core/_fused.c at install) rebuilds. The sources are byte-compiled as a wheel's
# install does (an editable install is not, and where PYTHONDONTWRITEBYTECODE is set every
# command would compile them again: 0.15 s of `mergepipe models`).
$(VENV)/.installed: pyproject.toml setup.py src/mergepipe/core/_fused.c
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q $(TORCH) -e .
	$(PY) -m compileall -q src
	touch $@

# The tests also cover the benchmark suite, a distribution of its own (benchmarks/).
$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml benchmarks/pyproject.toml
	$(PIP) install -q $(TORCH) -e '.[test,dev]' -e ./benchmarks
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/mergepipe demo

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

# The unit tier: the modules listed in tests/unit.txt, which need no server or outside program
# (no PostgreSQL, Ray, Chromium, mergekit runs, S3 or HTTP servers); under a minute.
test-unit: $(VENV)/.installed-test
	$(PY) -m pytest -q $$(grep -v '^#' tests/unit.txt)

# The same suite with every catalog a fresh database on one real PostgreSQL server started by
# the tests (tests/catalogs.py); DuckDB-only tests are skipped (docs/development.md).
test-pg: $(VENV)/.installed-test
	MERGEPIPE_TEST_CATALOG=postgresql $(PY) -m pytest -q

test-all: $(VENV)/.installed-test
	$(PY) -m pytest -q -m ''

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p mergepipe -p mergepipe_bench -p tests
	$(VENV)/bin/lint-imports

bench: $(VENV)/.installed-test
	$(VENV)/bin/mergepipe bench

bench-quick: $(VENV)/.installed-test
	$(VENV)/bin/mergepipe bench --quick

clean:
	rm -rf $(VENV) demo-output bench-output .pytest_cache .mypy_cache .ruff_cache
