"""kvsim against vLLM 0.33's own v1 Scheduler + KVCacheManager (docs/prefix-caching.md).

Golden: the oracle's per-step records for 108 cases (3 traces from the shared oracle's `make_trace.py`,
pools of 40..2048 blocks, block sizes 8/16/32, prefix caching on and off), stored with their traces in
tests/data/vllm_oracle; kvsim must equal them exactly: engine steps, used blocks after every step's
scheduling, tokens scheduled per step, preemptions, prefix-cache hit tokens. No vLLM needed.

Live: when the oracle venv ($ORACLE_VENV, default ~/.cache/vllm-oracle-venv) and ../shared/oracle exist,
a few cases are rerun through vLLM itself (tests/vllm/vllm_oracle_driver.py) and compared the same way.

kvsim side: two full prompt blocks get the same content id exactly when their whole prefix is identical
(as vLLM's chained block hashes); output tokens are unique per request in the oracle, so kvsim's own
hashing of every other full block (prompt tails, generated tokens) matches vLLM's.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

DATA = Path(__file__).parents[1] / "data" / "vllm_oracle"
GOLDEN = DATA / "golden_vllm_0.33.0.json.gz"
KEYS = ("steps", "preemptions", "hit_tokens", "used", "tokens")


def load_oracle_trace(path: str | Path) -> list[dict]:
    """Records of an oracle-format JSONL trace (optionally gzipped)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip() and not line.startswith("#")]


def kvsim_trace(records: list[dict], block_size: int, num_blocks: int) -> Trace:
    """Burst trace (all at t = 0) of the requests whose peak fits the pool (the oracle drops the rest:
    vLLM would wait for them forever), with chained content ids per full prompt block."""
    ids: dict[tuple, int] = {}
    prompts, outputs, hashes = [], [], []
    for r in records:
        prompt, out = r["prompt_tokens"], r["output_len"]
        if -(-(len(prompt) + out - 1) // block_size) > num_blocks:
            continue
        chain, parent = [], -1
        for k in range(len(prompt) // block_size):
            parent = ids.setdefault((parent, tuple(prompt[k * block_size:(k + 1) * block_size])), len(ids))
            chain.append(parent)
        prompts.append(len(prompt))
        outputs.append(out)
        hashes.append(chain)
    return Trace.from_arrays([0.0] * len(prompts), prompts, outputs, block_hashes=hashes,
                             hash_block_size=block_size)


def run_kvsim(records: list[dict], num_blocks: int, block_size: int, caching: bool) -> dict:
    """kvsim with vLLM v1's scheduler settings (chunked prefill, token budget 8192, 256 sequences,
    recompute; synchronous scheduling, as the oracle's `Scheduler` runs: `async_scheduling=False` in
    ../shared/oracle/vllm_oracle.py); the same keys as the oracle driver's results."""
    trace = kvsim_trace(records, block_size, num_blocks)
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1),
                    CacheConfig(block_size=block_size, num_blocks=num_blocks, prefix_caching=caching),
                    SchedulerConfig(max_num_seqs=256, max_batched_tokens=8192, chunked_prefill=True,
                                    preemption="recompute", async_scheduling=False))
    res = simulate(trace, cfg, cost=ConstantCost(0.01))
    steps = res.steps
    return {"steps": len(steps), "preemptions": int(res.summary["preemptions"]),
            "hit_tokens": int(res.summary.get("prefix_cache_hit_tokens", 0)),
            "used": steps["used_blocks"].astype(int).tolist(),
            "tokens": (steps["prefill_tokens"] + steps["decode_tokens"]).astype(int).tolist()}


def _golden_cases() -> list[dict]:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)["cases"]


def _mismatch(got: dict, want: dict) -> str:
    """'' when equal, else the first difference in words."""
    for key in KEYS:
        if got[key] != want[key]:
            if key in ("used", "tokens"):
                step = next((j for j, (a, b) in enumerate(zip(got[key], want[key])) if a != b),
                            min(len(got[key]), len(want[key])))
                return f"{key} first differs at step {step}"
            return f"{key}: kvsim {got[key]}, vLLM {want[key]}"
    return ""


@pytest.mark.parametrize("trace", ["burst60_s5", "repeats60_s11", "shared80_s23"])
def test_kvsim_equals_stored_vllm_records(trace):
    records = load_oracle_trace(DATA / f"{trace}.jsonl.gz")
    cases = [c for c in _golden_cases() if c["trace"].startswith(trace)]
    assert len(cases) == 36
    assert sum(c["preemptions"] for c in cases) > 100          # memory pressure is exercised
    assert sum(c["hit_tokens"] for c in cases if c["caching"]) > 0
    diffs = []
    for c in cases:
        why = _mismatch(run_kvsim(records, c["num_blocks"], c["block_size"], c["caching"]), c)
        if why:
            diffs.append(f"N={c['num_blocks']} B={c['block_size']} caching={c['caching']}: {why}")
    assert not diffs, "\n".join(diffs)


def _oracle() -> tuple[Path, Path] | None:
    venv = Path(os.environ.get("ORACLE_VENV", Path.home() / ".cache" / "vllm-oracle-venv"))
    oracle_dir = Path(os.environ.get("ORACLE_DIR", Path(__file__).resolve().parents[2].parent / "shared" / "oracle"))
    python = venv / "bin" / "python"
    if python.exists() and (oracle_dir / "vllm_oracle.py").exists():
        return python, oracle_dir
    return None


@pytest.mark.long
@pytest.mark.skipif(_oracle() is None, reason="no vLLM oracle venv (../shared/oracle/setup.sh builds it)")
def test_kvsim_equals_live_vllm(tmp_path):
    python, oracle_dir = _oracle()
    trace = DATA / "repeats60_s11.jsonl.gz"
    cases = [{"trace": str(trace), "num_blocks": n, "block_size": b, "caching": c}
             for n, b, c in ((64, 16, True), (120, 8, True), (200, 32, False))]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    subprocess.run([str(python), "-W", "ignore", str(Path(__file__).parent / "vllm_oracle_driver.py"),
                    str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
                   env={**os.environ, "ORACLE_DIR": str(oracle_dir)}, check=True, capture_output=True,
                   timeout=600)
    records = load_oracle_trace(trace)
    for want in json.loads((tmp_path / "out.json").read_text()):
        assert want["preemptions"] > 0
        got = run_kvsim(records, want["num_blocks"], want["block_size"], want["caching"])
        assert _mismatch(got, want) == "", want
