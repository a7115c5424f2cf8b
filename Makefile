# Two entry points that work on a fresh machine: `make search` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install search test test-slow clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,plots,postgres]'
	touch $(STAMP)

# The quickstart: ~8 real MindSpore trials on this machine's CPU, a new study each run.
search: $(STAMP)
	$(BIN)/autotune search examples/quickstart.yaml --study quickstart-$$(date +%Y%m%d-%H%M%S)

# The fast tier: the import contracts, unit and contract tests, the loop's logic on the replay
# backend, and one real end-to-end search (~4 min on 2 cores).
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m "not slow" tests

# Every multi-process proof: layouts that train alike, process-tree kills, two-node clusters,
# PostgreSQL drivers, exported runs that train and resume, the loop on real trials. CI runs it
# after make test.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests

clean:
	rm -rf $(VENV) trials/*/ trials/*.db .pytest_cache
