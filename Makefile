# `make run` and `make test` set everything up on a fresh machine: they create .venv when it is
# missing, install kvsim with its extras (torch is pinned to the CPU wheel), then run or test.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-long install mutate clean reports

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/kvsim compare traces/sharegpt_2rps_10min.jsonl --model opt-13b --gpu a100-40gb --kv-gib 12

# The default suite runs on every core (pytest-xdist; work stealing evens out the long tests: 139 s against
# 174 s with the default scheduling, one run each on this 2-core machine); `make test-long` adds the release checks.
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal

# Regenerate every shipped report under reports/ (one line each; reports/README.md lists them). Each
# report records the command that made it and the engine-profile set it ran with; the test
# tests/e2e/test_report_freshness.py fails when a report is older than the profiles or its command here.
# KVSIM="python -m kvsim.cli.app" REPORTS_DEPS= runs it without the .venv set-up.
KVSIM ?= $(BIN)/kvsim
REPORTS_DEPS ?= $(STAMP)
SWEEP_TMP ?= /tmp/kvsim-sweep-llama3-8b
reports: $(REPORTS_DEPS)
	$(KVSIM) report traces/sharegpt_2rps_10min.jsonl --num-requests 400 --model opt-13b --gpu a100-40gb --kv-gib 12 -o reports/sharegpt-opt13b --force
	$(KVSIM) tune-block-size traces/sharegpt_2rps_10min.jsonl --model opt-13b --kv-gib 12 --report reports/block-size-sharegpt --force
	$(KVSIM) tune-block-size traces/alpaca_30rps_2min.jsonl --model opt-13b --kv-gib 12 --report reports/block-size-alpaca --force
	rm -rf $(SWEEP_TMP) && $(KVSIM) sweep traces/azure_conv_excerpt.jsonl --grid block_size=16,128 --grid rate=2,4,8 --set model=llama-3-8b --set gpu=h100-80gb --set max_requests=400 -o $(SWEEP_TMP) \
		&& $(KVSIM) report --sweep $(SWEEP_TMP) --title "Sweep report: Llama-3-8B on one H100, block size x rate" -o reports/sweep-llama3-8b --force
	$(KVSIM) hybrid-study -o reports/hybrid-models --force
	$(KVSIM) report traces/mooncake_conversation_excerpt.jsonl --model llama-3.1-8b --gpu h100-80gb --set prefix_caching=true --replicas 4,16 --routers round-robin,prefix-aware --pd 1:3,2:2,3:1 --fleet-only -o reports/fleet-mooncake --force
	$(KVSIM) paper --duration 600 --force
	$(KVSIM) sim-to-real real-runs -o reports/sim-to-real --force

# release checks (tens of minutes): allocator state machines with 5,000 examples, 1,000 fuzzed CLI inputs,
# live re-runs of vLLM's own code over the stored cases, whole-report regenerations, every README command,
# the 100,000-request memory ceiling
test-long: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal --long

# Mutation testing (on demand, not in CI; tens of minutes): GROUPS="metrics alloc" limits it.
mutate: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,mutate]'
	$(BIN)/python bench/mutate.py $(GROUPS)

clean:
	rm -rf $(VENV) build *.egg-info mutants mutants-work
