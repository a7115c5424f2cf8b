# Two entry points that work on a fresh machine: `make search` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install search test clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The quickstart: ~8 real MindSpore trials on this machine's CPU, a new study each run.
search: $(STAMP)
	$(BIN)/autotune search examples/quickstart.yaml --study quickstart-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) trials/*/ trials/*.db .pytest_cache
