"""Probe: bad and inapplicable inputs to `run`, `compare`, `capacity`, `sweep` and `report`, each classified.

Covers: the five families of issue 40 (flags that cannot apply, model configs with defects, unbounded
counts, messages) as a careful user and a fuzzer would try them.
Scenario: every input runs in this process through typer's CliRunner with a 30 s alarm; its outcome is
- clean: a valid input exits 0, or a bad one exits 2 with one line naming the expected flag or field;
- unclear: exit 2, but the line does not name the culprit (or is more than one line);
- silent: a bad input exits 0 (accepted, and ignored or answered wrongly);
- crash: any other exit status (1: "internal error"), or a traceback;
- unbounded: still running after 30 s (or out of memory).

    PYTHONPATH=$PWD python bench/probe_flags_and_configs.py          # prints counts per command

Model-config mutations follow tests/specs/hf/test_fields.py: an integer field kvsim reads set to 0, -1,
NaN, a string, 10^12 or 1.5 must be refused naming it; deleting or nulling a field may be accepted.
"""

from __future__ import annotations

import copy
import json
import random
import signal
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli.app import app

#: The integer fields of a config.json that change a prediction, with their lowest valid value (written out
#: here rather than imported, so the probe also runs against older kvsim code).
_LOW = {**dict.fromkeys(("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                         "head_dim", "max_position_embeddings", "vocab_size", "kv_lora_rank", "qk_rope_head_dim",
                         "attention_chunk_size", "sliding_window", "full_attention_interval", "attn_layer_period",
                         "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                         "linear_value_head_dim", "linear_conv_kernel_dim", "ssm_state_size", "mamba_d_state",
                         "conv_kernel", "mamba_d_conv", "mamba_expand", "mamba_num_heads", "mamba_head_dim",
                         "n_groups", "expert_layer_period", "num_experts_per_tok", "num_local_experts",
                         "num_experts", "n_routed_experts"), 1),
        **dict.fromkeys(("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                         "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "first_k_dense_replace",
                         "attn_layer_offset", "expert_layer_offset", "n_shared_experts"), 0)}
#: Fields whose ceiling is a context length (10^9 tokens is within it: a window that large is legitimate).
_LONG = ("max_position_embeddings", "attention_chunk_size", "sliding_window")

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny.jsonl")
ONE_SEQ = str(ROOT / "traces" / "alpaca_30rps_2min.jsonl")
CONFIGS = sorted((ROOT / "tests" / "data" / "hf_configs").glob("*.json"))
GPU = {"deepseek-v3": ["--gpu", "h200", "--tp", "8"], "qwen3-next-80b-a3b": ["--gpu", "h200", "--tp", "4"],
       "llama-4-scout": ["--gpu", "h200", "--tp", "4"], "jamba-v0.1": ["--gpu", "h200", "--tp", "2"],
       "gpt-oss-120b": ["--gpu", "h200"]}


class _Timeout(BaseException):          # not an Exception: kvsim's error policy must not catch it
    pass


def _alarm(signum, frame):
    raise _Timeout


def classify(args: list[str], expect: str | None) -> str:
    """`expect`: the token the refusal must name, or None for an input that must run."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(30)
    try:
        res = CliRunner().invoke(app, args)
    except _Timeout:
        return "unbounded"
    finally:
        signal.alarm(0)
    if isinstance(res.exception, (_Timeout, MemoryError)):
        return "unbounded"
    lines = [x for x in res.output.splitlines() if x.strip() and not x.startswith("note:")]
    if res.exit_code == 0:
        return "clean" if expect is None else "silent"
    if res.exit_code != 2 or "Traceback" in res.output or "internal error" in res.output:
        return "crash"
    if expect is None:
        return "unclear"
    errors = [x for x in lines if x.startswith(("error:", "Error:", "Usage:", "Try", "╭", "│", "╰"))]
    return "clean" if expect in res.output and len(errors) <= 3 else "unclear"


def run_cases() -> list[tuple[str, list[str], str | None]]:
    q = ["--quiet"]
    cases = [
        # family 1: flags that cannot apply
        *[("run", ["run", TINY, *q, *a], tok) for a, tok in [
            (["--replicas", "2", "--prefill-replicas", "1", "--decode-replicas", "1"], "--replicas"),
            (["--ttft-slo", "0"], "--ttft-slo"), (["--ttft-slo", "-1"], "--ttft-slo"),
            (["--tpot-slo", "nan"], "--tpot-slo"), (["--kv-link", "pcie"], "--kv-link"),
            (["--prefill-tp", "2"], "--prefill-tp"), (["--decode-tp", "2"], "--decode-tp"),
            (["--router", "least-kv"], "--router"),
            (["--replicas", "2", "--router-cache-threshold", "0.5"], "--router-cache-threshold"),
            (["--replicas", "2", "--router-balance-rel", "2"], "--router-balance-rel"),
            (["--allocator", "contiguous", "--no-hybrid-kv-cache"], "--hybrid-kv-cache"),
            (["--reserve", "pow2"], "--reserve"), (["--placement", "first-fit"], "--placement"),
            (["--model-config", str(ROOT / "tests/data/hf_configs/gpt-oss-20b.json"), "--gpu", "h200",
              "--quantization", "awq"], "--quantization"),
            (["--allocator", "bogus"], "--allocator"), (["--cpu-kv-gib", "-1"], "--cpu-kv-gib"),
            (["--replicas", "0"], "--replicas"), (["--replicas", "-3"], "--replicas"),
            (["--replicas", "2", "--router", "bogus"], "--router"),
            (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "nvlink9"], "--kv-link"),
            (["--prefill-replicas", "1", "--decode-replicas", "1", "--batching", "static"], "--batching"),
            (["--prefill-replicas", "0", "--decode-replicas", "1"], "--prefill-replicas"),
            (["--decode-replicas", "1"], "--prefill-replicas"),
            (["--replicas", "2", "--router", "prefix-aware", "--router-cache-threshold", "2"], "--router-cache-threshold"),
            (["--allocator", "jenga", "--reserve", "oracle"], "--reserve"),
            (["--allocator", "paged", "--placement", "buddy"], "--placement"),
            (["--quantization", "bogus"], "--quantization"), (["--kv-cache-dtype", "int3"], "kv"),
            # family 3: unbounded counts
            (["--replicas", "1000000"], "1,024"), (["--prefill-replicas", "1000000", "--decode-replicas", "1"], "1,024"),
            (["--prefill-replicas", "1", "--decode-replicas", "1000000"], "1,024"),
            # valid inputs that must still run
            (["--replicas", "2", "--router", "prefix-aware", "--router-cache-threshold", "0.5"], None),
            (["--allocator", "contiguous", "--reserve", "pow2"], None),
        ]],
        ("run", ["run", ONE_SEQ, *q, "--max-requests", "5", "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--kv-link", "pcie", "--ttft-slo", "0.5"], None),
        # family 5: the hybrid one-sequence refusal
        ("run", ["run", TINY, *q, "--model-config", str(ROOT / "tests/data/hf_configs/gpt-oss-20b.json"),
                 "--gpu", "h200"], "--no-hybrid-kv-cache"),
        ("run", ["run", TINY, *q, "--model-config", str(ROOT / "tests/data/hf_configs/gpt-oss-20b.json"),
                 "--gpu", "h200", "--allocator", "jenga"], "line 2, request 'r2'"),
    ]
    tmp = Path(tempfile.mkdtemp(prefix="probe40-"))
    for grid, tok in [("allocator=bogus", "allocator"), ("router=bogus", "router"), ("cpu_kv_gib=-1", "cpu_kv_gib"),
                      ("router=least-kv", "router"), ("block_size=abc", "block_size"), ("kv_link=pcie", "kv_link"),
                      ("replicas=1000000", "1,024"), ("dtype=bfloat16,float16", None), ("quantization=fp8", None),
                      ("model=llama-2-70b", "can be served"), ("tp=3", "--tp 3"), ("reserve=pow2", "reserve"),
                      ("prefill_tp=2", "prefill_tp")]:
        cases.append(("sweep", ["sweep", TINY, "--grid", grid, "-o", str(tmp / f"sw{len(cases)}")], tok))
    for args, tok in [(["--sample-lengths", "bogus"], "--sample-lengths"), (["--gpu", "bogus"], "bogus"),
                      (["--kv-gib", "nan"], "--kv-gib"), (["--tp", "3", "--model", "llama-3-8b"], "--tp"),
                      (["--max-requests", "0"], "--max-requests"), (["--replicas", "2"], "No such option")]:
        cases.append(("compare", ["compare", TINY, "--quiet", *args], tok))
    for args, tok in [(["--kv-gib", "-1"], "--kv-gib"), (["--gpus-for", "1e12", "--preset", "sharegpt"], "--gpus-for"),
                      (["--gpus-for", "2", "--disagg", "--max-gpus", "100000", "--preset", "sharegpt"], "1,024"),
                      (["--model", "bogus"], "bogus"), (["--router", "bogus", "--gpus-for", "2", "--slo", "ttft_p99=2", "--preset", "sharegpt"], "router")]:
        cases.append(("capacity", ["capacity", *args], tok))
    for args, tok in [(["--routers", "least-kv"], "--routers"), (["--ttft-slo", "1"], "--ttft-slo"),
                      (["--kv-link", "pcie"], "--kv-link"), (["--replicas", "2000"], "1,024"),
                      (["--replicas", "2", "--kv-link", "pcie"], "--kv-link")]:
        cases.append(("report", ["report", TINY, "-o", str(tmp / f"rep{len(cases)}"), *args], tok))
    return cases


def config_cases(seed: int = 40, per_config: int = 24) -> list[tuple[str, list[str], str | None]]:
    """Mutated shipped configs through run, compare and capacity (`per_config` mutations each)."""
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="probe40cfg-"))
    cases = []
    for path in CONFIGS:
        cfg = json.loads(path.read_text())
        target = cfg.get("text_config") or cfg
        keys = [k for k in target if k in _LOW and isinstance(target[k], int)]
        for j in range(per_config):
            key, how = rng.choice(keys), rng.choice([0, -1, float("nan"), "x", 10**12, 1.5, 10**9, [4], True])
            if how == 10**9 and key in _LONG:
                how = 10**12                  # 10^9 is within a window's or context's ceiling: legitimate
            if how == 0 and _LOW[key] == 0:
                how = -1                      # 0 is a valid count there (first_k_dense_replace, ...)
            bad = copy.deepcopy(cfg)
            (bad.get("text_config") or bad)[key] = how
            out = tmp / f"{path.stem}-{j}.json"
            out.write_text(json.dumps(bad))
            command = ("run", "compare", "capacity")[j % 3]
            args = [command, *([ONE_SEQ, "--quiet", "--max-requests", "2"] if command != "capacity" else []),
                    "--model-config", str(out), *GPU.get(path.stem, ["--gpu", "h200"])]
            cases.append((command, args, key))
    for name, key, value in [("qwen3-next-80b-a3b", "full_attention_interval", 49), ("jamba-v0.1", "attn_layer_offset", 8),
                             ("deepseek-v3", "kv_lora_rank", None), ("gpt-oss-20b", "layer_types", [])]:
        for command in ("run", "compare", "capacity"):
            bad = json.loads((ROOT / "tests/data/hf_configs" / f"{name}.json").read_text())
            bad[key] = value
            out = tmp / f"{name}-{key}-{command}.json"
            out.write_text(json.dumps(bad))
            args = [command, *([ONE_SEQ, "--quiet", "--max-requests", "2"] if command != "capacity" else []),
                    "--model-config", str(out),
                    *GPU.get(name, ["--gpu", "h200"])]
            cases.append((command, args, key))
    return cases


def main() -> None:
    counts: dict[str, Counter] = defaultdict(Counter)
    bad = []
    for command, args, expect in run_cases() + config_cases():
        outcome = classify(args, expect)
        counts[command][outcome] += 1
        if outcome != "clean":
            bad.append((outcome, " ".join(args[:8]), expect))
    kinds = ("clean", "unclear", "silent", "crash", "unbounded")
    print(f"{'command':<10}{'tried':>6}" + "".join(f"{k:>10}" for k in kinds))
    for command, c in sorted(counts.items()):
        print(f"{command:<10}{sum(c.values()):>6}" + "".join(f"{c[k]:>10}" for k in kinds))
    total = sum((c for c in counts.values()), Counter())
    print(f"{'all':<10}{sum(total.values()):>6}" + "".join(f"{total[k]:>10}" for k in kinds))
    for row in bad:
        print("  not clean:", *row, file=sys.stderr)


if __name__ == "__main__":
    main()
