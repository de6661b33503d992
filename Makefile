# `make run` and `make test` set everything up on a fresh machine: they create .venv when it is
# missing, install kvsim with its extras (torch is pinned to the CPU wheel), then run or test.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-long install mutate clean

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

# release checks: allocator state machines with 5,000 examples, 1,000 fuzzed CLI inputs, the
# 100,000-request memory ceiling (minutes)
test-long: $(STAMP)
	$(BIN)/python -m pytest --long tests/test_alloc_stateful.py tests/test_fuzz_cli.py tests/test_memory.py

# Mutation testing (on demand, not in CI; tens of minutes): GROUPS="metrics alloc" limits it.
mutate: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,mutate]'
	$(BIN)/python bench/mutate.py $(GROUPS)

clean:
	rm -rf $(VENV) build *.egg-info mutants mutants-work
