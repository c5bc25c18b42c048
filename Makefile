# fedhet: `make demo` and `make test` each set up .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fedhet-installed

.PHONY: demo test test-nodata test-rest test-data test-ray test-all test-slow lint typecheck bench results-doc setup clean

setup: $(STAMP)

# The pinned CPU build of torch goes in first: a bare `torch` requirement on an
# empty environment would pull several GB of CUDA wheels.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,report]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedhet demo

# The suite's tiers (tests/conftest.py): unit, federation (parties in memory), processes (party
# processes; `smoke` marks one audited run per algorithm family) and system (network namespaces, Ray,
# a browser).  `make test` runs the first two and the smoke set; CI (`make test-all`) runs every tier.
PYTEST := $(PY) -m pytest -q -n 2 --dist worksteal --durations=20
NODATA := FEDHET_NO_SHARED=1 FEDHET_DATA_DIR=$$d

test: $(STAMP) lint
	$(PYTEST) --tiers unit,federation,smoke

lint: $(STAMP)
	$(PY) -m ruff check .
	$(MAKE) --no-print-directory typecheck

# CI's passes (.ci/run runs `make test-all`): the default tiers as a user's clone without ../shared
# runs them, then the other tiers without the data, then only the tests of the real data (every
# tier), then the Ray cluster.  Each test runs in exactly one pass.
test-nodata: $(STAMP) lint
	d=$$(mktemp -d) && $(NODATA) $(PYTEST) --tiers unit,federation,smoke -m "not data"; rc=$$?; rmdir $$d; exit $$rc

test-rest: $(STAMP)
	d=$$(mktemp -d) && $(NODATA) $(PYTEST) --tiers processes,system -m "not data and not smoke"; \
	  rc=$$?; rmdir $$d; exit $$rc

test-data: $(STAMP)
	$(PYTEST) -m data

# The Ray engine's tests (tests/test_ray_cluster.py): Ray installed into .venv, then a cluster of
# three nodes on this machine that the tests start and stop themselves; one test process.
test-ray: $(STAMP)
	$(PY) -m pip install -q -e '.[ray]'
	$(PY) -m pytest -q -p no:xdist --ray -m ray --durations=10

test-all: test-nodata test-rest test-data test-ray

# The paper reproductions and other slow runs (never in CI's time)
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --runslow -m slow

# mypy on the four packages as the one import package `fedhet` they form when installed (the
# editable install maps fedhet.parties... to the root folders, which mypy cannot follow): a
# folder of links .mypy_path/fedhet/{parties,crypto,protocols,algorithms}.
typecheck: $(STAMP)
	mkdir -p .mypy_path/fedhet
	for d in parties crypto protocols algorithms; do ln -sfn ../../$$d .mypy_path/fedhet/$$d; done
	MYPYPATH=.mypy_path $(PY) -m mypy -p fedhet.parties -p fedhet.crypto -p fedhet.protocols -p fedhet.algorithms

bench: $(STAMP)
	$(PY) -m benchmarks.transport --quick
	$(PY) -m benchmarks.crypto --quick

# docs/results.md from the committed results files (tests/test_results_doc.py keeps them equal)
results-doc: $(STAMP)
	$(PY) -m benchmarks.results_doc

clean:
	rm -rf runs .pytest_cache
