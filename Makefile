# Two entry points that work on a fresh machine: `make search` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# MindFormers, the export's consumer, in a venv of its own: it pins numpy<2 and mindspore~=2.9.0,
# which autotune's venv cannot share (docs/mindformers.md, "MindFormers itself in the tests").
MF_VENV  := .venv-mindformers
MF_STAMP := $(MF_VENV)/.installed

.PHONY: install mindformers search test test-slow clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,plots,postgres]'
	touch $(STAMP)

mindformers: $(MF_STAMP)

$(MF_STAMP): tests/mindformers/requirements.txt
	rm -rf $(MF_VENV)
	$(PYTHON) -m venv $(MF_VENV)
	$(MF_VENV)/bin/pip install --quiet -r tests/mindformers/requirements.txt
	touch $(MF_STAMP)

# The quickstart: 6 real MindSpore trials and the confirm phase on this machine's CPU (examples/quickstart.yaml), a new study each run.
search: $(STAMP)
	$(BIN)/autotune search examples/quickstart.yaml --study quickstart-$$(date +%Y%m%d-%H%M%S)

# The fast tier: lint and format (ruff), the import contracts, unit and contract tests, the loop's
# logic on the replay backend, and one real end-to-end search (~4 min on 2 cores).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m "not slow" tests

# Every multi-process proof: layouts that train alike, process-tree kills, two-node clusters,
# PostgreSQL drivers, exported runs that train and resume, the loop on real trials. CI runs it
# after make test.
test-slow: $(STAMP) $(MF_STAMP)
	AUTOTUNE_REQUIRE_MINDFORMERS=1 $(BIN)/python -m pytest -q -m slow tests

clean:
	rm -rf $(VENV) $(MF_VENV) trials/*/ trials/*.db .pytest_cache
