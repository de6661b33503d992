"""kvsim's `vllm-2023` profile against vLLM 0.1.4's own Scheduler + BlockSpaceManager, step by step.

Stored: the oracle's per-step records (tests/vllm/vllm2023_oracle_driver.py over the cases of
tests/vllm/vllm2023_oracle_cases.py: 4 traces x block sizes 8/16/32 x 4 pools, plus max_num_seqs and token
budget cases; recompute and swap, parallel samples of their own lengths, beams, prompts dropped as too
long), in tests/data/vllm2023_oracle. kvsim must equal every step: its start (engine steps of 1 s;
arrivals at their step), prompt step or decode step, the requests admitted, recomputed, swapped out,
swapped in and finished, the tokens scheduled, the GPU blocks used after scheduling and the CPU blocks
holding swapped requests; and the requests dropped as ignored. No vLLM needed.

Live (`--long`): when ../shared/vllm-2023 holds the tarballs, vLLM 0.1.4 itself is rerun over a few
cases (unpacked to ~/.cache/kvsim-vllm2023) and must give the stored records, and over 160 random traces
and cases (samples, beams, limits, swap of every victim; 3,413 preemptions) kvsim must equal it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from kvsim.cost.roofline import ConstantCost
from kvsim.engine.build import build_run
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.batching.request_state import REJECTED
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace
from tests.engine_loop import engine_steps

DATA = Path(__file__).parents[1] / "data" / "vllm2023_oracle"
KEYS = ("step", "prompt_run", "admitted", "recomputed", "swapped_out", "swapped_in", "finished",
        "scheduled_tokens", "used_peak", "cpu_used_peak")


def stored_cases() -> list[dict]:
    with gzip.open(DATA / "records_vllm_0.1.4.json.gz", "rt") as f:
        return json.load(f)["cases"]


def kvsim_trace(records: list[dict]) -> Trace:
    """The oracle trace as kvsim's: arrival at its step (s), samples, beams, per-sample lengths."""
    per = [r.get("output_tokens_per_sample") for r in records]
    return Trace.from_arrays([float(r.get("arrival_step", 0)) for r in records],
                             [r["prompt_len"] for r in records], [r["output_len"] for r in records],
                             n=[r.get("n", 1) for r in records], beam_width=[r.get("beam_width", 1) for r in records],
                             output_tokens_per_sample=per if any(per) else None)


def run_kvsim(records: list[dict], case: dict) -> tuple[list[dict], list[str]]:
    """kvsim's per-step records (`KEYS`) of the vllm-2023 profile on `case`, and the ids it dropped."""
    trace = kvsim_trace(records)
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1),
                    CacheConfig(block_size=case["block_size"], num_blocks=case["num_blocks"], swap_gib=64.0),
                    SchedulerConfig(max_num_seqs=case["max_num_seqs"], max_batched_tokens=case["max_num_batched_tokens"],
                                    preemption="swap" if case.get("preemption") == "swap" else "recompute"),
                    engine_profile="vllm-2023")
    assert get_model("opt-13b").max_seq_len == case["max_model_len"]
    parts = build_run(trace, cfg)
    parts = dataclasses.replace(parts, cost=ConstantCost(1.0))
    sched, bs, ids = parts.scheduler, case["block_size"], [r["id"] for r in records]
    out = []
    for kind, plan in engine_steps(trace, parts):
        for k in range(plan.num_steps):
            last = k == plan.num_steps - 1
            swapped = set(plan.swapped_out)
            out.append({"step": int(plan.starts[k]), "prompt_run": bool(plan.prefills),
                        "admitted": [ids[i] for i, _ in plan.prefills],
                        "recomputed": [ids[i] for i in plan.preempted if i not in swapped],
                        "swapped_out": [ids[i] for i in plan.swapped_out],
                        "swapped_in": [ids[i] for i in plan.swapped_in],
                        "finished": [ids[i] for i in plan.finished] if last else [],
                        "scheduled_tokens": plan.prefill_tokens if plan.prefills else plan.decode_seqs,
                        "used_peak": plan.memory[k].used_blocks,
                        "cpu_used_peak": sched.swap_used // bs if kind == "step" else 0})
    return out, [ids[i] for i, s in enumerate(sched.status) if s == REJECTED]


def mismatch(got: list[dict], want: list[dict]) -> str:
    """'' when equal, else the first differing step in words."""
    for g, w in zip(got, want):
        for key in KEYS:
            if sorted(g[key]) != sorted(w[key]) if isinstance(w[key], list) else g[key] != w[key]:
                return f"step {w['step']}: {key} kvsim {g[key]}, vLLM {w[key]}"
    if len(got) != len(want):
        return f"kvsim {len(got)} steps, vLLM {len(want)}"
    return ""


def _label(c: dict) -> str:
    return (f"{Path(c['trace']).name.split('.')[0]} B={c['block_size']} N={c['num_blocks']} "
            f"seqs={c['max_num_seqs']} tokens={c['max_num_batched_tokens']} {c.get('preemption', 'auto')}")


@pytest.mark.parametrize("trace", ["single", "samples", "beams", "drops"])
def test_vllm2023_equals_stored_vllm_0_1_4(trace):
    cases = [c for c in stored_cases() if Path(c["trace"]).name.startswith(trace)]
    records = [json.loads(line) for line in gzip.open(DATA / f"{trace}.jsonl.gz", "rt")]
    assert sum(c["final"]["preemptions"] for c in cases) > 50        # memory pressure is exercised
    diffs = []
    for c in cases:
        got, dropped = run_kvsim(records, c)
        why = mismatch(got, c["steps"])
        want_dropped = sorted(r for s in c["steps"] for r in s["ignored"])
        if not why and sorted(dropped) != want_dropped:
            why = f"dropped kvsim {sorted(dropped)}, vLLM {want_dropped}"
        if why:
            diffs.append(f"{_label(c)}: {why}")
    assert not diffs, "\n".join(diffs)


def test_fast_forward_windows_are_exercised():
    """The comparison covers the engine's fast-forward windows too (cut where vLLM would preempt)."""
    c = next(c for c in stored_cases() if "single" in c["trace"] and c["block_size"] == 16 and c["num_blocks"] == 64
             and c["max_num_seqs"] == 256 and c.get("preemption") != "swap")
    records = [json.loads(line) for line in gzip.open(DATA / "single.jsonl.gz", "rt")]
    trace = kvsim_trace(records)
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1),
                    CacheConfig(block_size=16, num_blocks=64), SchedulerConfig(), engine_profile="vllm-2023")
    parts = dataclasses.replace(build_run(trace, cfg), cost=ConstantCost(1.0))
    windows = [p.num_steps for kind, p in engine_steps(trace, parts) if kind == "window"]
    assert len(windows) > 5 and sum(windows) > 50
    assert c["final"]["preemptions"] == 68


def _driver():
    """tests/vllm/vllm2023_oracle_driver.py as a module (by path: the tests are not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("vllm2023_oracle_driver", Path(__file__).parent / "vllm2023_oracle_driver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tarballs() -> Path | None:
    return _driver().TARBALLS


@pytest.mark.long
@pytest.mark.skipif(_tarballs() is None, reason="no vLLM 0.1.x tarballs (../shared/vllm-2023)")
def test_stored_records_equal_live_vllm_0_1_4():
    """vLLM 0.1.4 rerun (unpacked from its tarball) gives the stored records of a few cases."""
    driver = _driver()
    v = driver.load_vllm("0.1.4")
    picked = [c for c in stored_cases() if c["block_size"] == 16 and c["num_blocks"] in (48, 64)]
    assert len(picked) >= 8
    for c in picked:
        case = {k: c[k] for k in c if k not in ("steps", "final")}
        got = driver.run_case(v, driver.read_trace(str(DATA / Path(c["trace"]).name)), case)
        assert got["steps"] == c["steps"], _label(c)


def _random_case(seed: int) -> tuple[list[dict], dict]:
    """A random trace (1-40 requests: single, samples of their own lengths, beams) and case."""
    import random
    rng = random.Random(seed)
    recs, step = [], 0
    for k in range(rng.randint(10, 40)):
        step += rng.choice((0, 0, 1, 3))
        r = {"id": f"r{k}", "prompt_len": rng.randint(1, 150), "output_len": rng.randint(1, 80), "arrival_step": step}
        u = rng.random()
        if u < 0.2:
            r["n"] = rng.randint(2, 4)
            r["output_tokens_per_sample"] = [r["output_len"]] + [rng.randint(1, r["output_len"]) for _ in range(r["n"] - 1)]
        elif u < 0.35 and r["output_len"] > 2:
            r["beam_width"] = rng.randint(2, 3)
        recs.append(r)
    b, slots = rng.choice((8, 16, 32)), rng.choice((768, 1024, 1536))
    return recs, {"block_size": b, "num_blocks": slots // b, "max_num_seqs": rng.choice((256, 256, 8)),
                  "max_num_batched_tokens": rng.choice((2560, 2560, 200)), "max_model_len": 2048,
                  "cpu_blocks": 4 * slots // b, "preemption": rng.choice(("auto", "auto", "swap"))}


@pytest.mark.long
@pytest.mark.skipif(_tarballs() is None, reason="no vLLM 0.1.x tarballs (../shared/vllm-2023)")
def test_random_cases_equal_live_vllm_0_1_4():
    """160 random traces and cases through vLLM 0.1.4 itself and kvsim: every step equal."""
    driver = _driver()
    v = driver.load_vllm("0.1.4")
    preemptions, diffs = 0, []
    for seed in range(160):
        recs, case = _random_case(seed)
        want = driver.run_case(v, recs, case)
        assert not want["final"]["aborted"], seed
        preemptions += want["final"]["preemptions"]
        got, dropped = run_kvsim(recs, case)
        why = mismatch(got, want["steps"]) or ("" if sorted(dropped) == sorted(
            x for s in want["steps"] for x in s["ignored"]) else "dropped requests differ")
        if why:
            diffs.append(f"seed {seed}: {why}")
    assert not diffs, "\n".join(diffs)
    assert preemptions == 3413
