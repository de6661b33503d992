# `make run` and `make test` set everything up on a fresh machine: they create .venv when it is
# missing, install kvsim with its extras (torch is pinned to the CPU wheel), then run or test.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/kvsim compare traces/sharegpt_2rps_10min.jsonl --model opt-13b --gpu a100-40gb --kv-gib 12

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
