"""The unchanged kvsim Scheduler over the hybrid allocator against vLLM 0.33's own v1 Scheduler and
KVCacheManager with the same KV cache groups (tests/vllm/hybrid_scheduler_oracle_driver.py, its engine configured
by vLLM's own start-up functions: tests/vllm/vllm_startup.py), step by step on burst traces: used blocks after
each step's scheduling, blocks per group, preemptions, finishes and tokens scheduled. Chunked prefill,
recompute, synchronous scheduling; prefix caching off, or on with vLLM's default retention interval 0.

Golden: vLLM's records in tests/data/hybrid_oracle/scheduler_vllm_0.33.json.gz (small cases, block 4)
and scheduler_realistic_vllm_0.33.json.gz (gpt-oss-, Gemma-3- and Llama-4-like group mixes at block 16),
made by the driver (`python tests/vllm/test_hybrid_scheduler_oracle.py` regenerates both); live: where the
oracle venv exists vLLM is rerun and must reproduce them (`--long`).
"""

import json
import random
from pathlib import Path

import pytest

from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.trace.table import Trace

from tests.vllm.scheduler_golden import assert_same_steps, regenerate, vllm_records
from tests.vllm.test_hybrid_oracle import _oracle_python, load_golden

DATA = Path(__file__).parents[1] / "data" / "hybrid_oracle" / "scheduler_vllm_0.33.json.gz"
FULL, MAMBA = {"kind": "full"}, {"kind": "mamba"}
SWA8, CHUNK8 = {"kind": "sliding", "window": 8}, {"kind": "chunked", "chunk": 8}


def cases() -> list[dict]:
    """Block size 4, a 32-token budget, 16 sequences; 30 short requests, and 12 long ones whose prompts
    (up to 120 tokens) pass the sliding / chunked groups' admission cap (cdiv(7 + 32, 4) + 1 = 11 and
    cdiv(8 + 32, 4) = 10 blocks)."""
    rng = random.Random(5)
    short = [[rng.randint(1, 40), rng.randint(1, 30)] for _ in range(30)]
    long = [[rng.randint(40, 120), rng.randint(1, 40)] for _ in range(12)]

    def case(groups, num_blocks, requests, max_len):
        return {"block_size": 4, "num_blocks": num_blocks, "groups": groups, "max_num_batched_tokens": 32,
                "max_num_seqs": 16, "max_model_len": max_len, "requests": requests}
    # prefix caching: 3 families of prompts sharing 24- to 40-token prefixes, some repeated whole
    families = [[1000 * f + k for k in range(rng.randint(24, 40))] for f in range(1, 4)]
    prompts = []
    for i in range(36):
        fam = families[rng.randrange(3)]
        prompts.append(fam + [50_000 + 100 * i + k for k in range(rng.randint(0, 20) if i % 5 else 0)])
    shared = [[len(p), rng.randint(1, 30)] for p in prompts]

    def cached(groups, num_blocks, max_len=128):
        return {**case(groups, num_blocks, shared, max_len), "caching": True, "prompts": prompts}
    # max_model_len: what vLLM's start-up lets the pool serve (one max-length request must fit)
    return [case([FULL, SWA8], 40, short, 72), case([FULL, CHUNK8], 40, short, 72),
            case([FULL, MAMBA], 40, short, 128), case([SWA8, FULL, MAMBA], 50, short, 128),
            case([FULL, SWA8], 60, long, 160), case([FULL, CHUNK8], 60, long, 160),
            case([SWA8, SWA8, FULL], 70, long, 160),
            cached([FULL, SWA8], 40, 96), cached([FULL, SWA8], 80), cached([FULL, CHUNK8], 40, 96),
            cached([SWA8, FULL, SWA8], 60), cached([SWA8, CHUNK8], 40)]


def realistic_cases() -> list[dict]:
    """Block 16, a 2048-token budget, 64 sequences, 80 requests (prompts 50-1500, outputs 10-300):
    gpt-oss-like (full + sliding 128), Gemma-3-like (five sliding-512 groups + full), Llama-4-like (three
    chunked-1024 groups + full), and gpt-oss-like with prefix caching over four shared 200-600-token
    prefixes; pools small enough to preempt."""
    rng = random.Random(17)
    reqs = [[rng.randint(50, 1500), rng.randint(10, 300)] for _ in range(80)]
    swa128, swa512, chunk1024 = ({"kind": "sliding", "window": 128}, {"kind": "sliding", "window": 512},
                                 {"kind": "chunked", "chunk": 1024})
    prefixes = [[10_000 * f + k for k in range(rng.randint(200, 600))] for f in range(1, 5)]
    prompts = [prefixes[i % 4] + [900_000 + 2000 * i + k for k in range(rng.randint(1, 400))] for i in range(80)]

    def case(groups, num_blocks, requests=reqs, max_len=4096, **extra):
        return {"block_size": 16, "num_blocks": num_blocks, "groups": groups, "max_num_batched_tokens": 2048,
                "max_num_seqs": 64, "max_model_len": max_len, "requests": requests, **extra}
    return [case([FULL, swa128], 420), case([swa512] * 5 + [FULL], 900, max_len=2048), case([chunk1024] * 3 + [FULL], 1200),
            case([FULL, swa128], 500, [[len(p), rng.randint(10, 300)] for p in prompts], caching=True, prompts=prompts)]


def _content_ids(tokens: list[int], block_size: int) -> list[int]:
    """Content ids of the full blocks of `tokens` (equal prefixes, equal ids: the trace's block hashes)."""
    return [hash(tuple(tokens[:(k + 1) * block_size])) & (2**62 - 1) for k in range(len(tokens) // block_size)]


def run_kvsim(case: dict) -> list[dict]:
    """kvsim's Scheduler and HybridAllocator with vLLM's settings (its KV cache group order; async
    scheduling's one batch in flight where the case asks, `Scheduler.use_async_scheduling`); the driver's
    records."""
    reqs, mbt, bs, caching = case["requests"], case["max_num_batched_tokens"], case["block_size"], case.get("caching")
    hashes = [_content_ids(p, bs) for p in case["prompts"]] if caching else None
    trace = Trace.from_arrays([0.0] * len(reqs), [p for p, _ in reqs], [o for _, o in reqs], block_hashes=hashes,
                              hash_block_size=bs if caching else None)
    retention = case.get("retention", 0)          # vLLM's default 0 unless the case names one
    # vLLM's group order (its blocks are taken group by group in it): layers of one spec together, the specs
    # in the order their first layer comes (e.g. sliding, full, sliding -> sliding, sliding, full)
    specs = [json.dumps(g, sort_keys=True) for g in case["groups"]]
    order = sorted(range(len(specs)), key=lambda g: (specs.index(specs[g]), g))
    alloc = HybridAllocator(case["num_blocks"], bs, [GroupSpec(**case["groups"][g]) for g in order], case["max_model_len"],
                            max_in_flight_tokens=mbt * (2 if case.get("async_scheduling") else 1),
                            prefill_chunk_tokens=mbt, prefix_caching=bool(caching),
                            retention_interval=None if retention == "none" else retention,
                            mamba_checkpoints=bool(case.get("mamba_checkpoints")))
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=case["max_num_seqs"], max_batched_tokens=mbt,
                                                    chunked_prefill=True), max_seq_len=case["max_model_len"],
                      block_ids=(lambda i: trace.prompt_block_ids(i, bs)) if caching else None)
    if case.get("async_scheduling"):
        sched.use_async_scheduling()
    for i in range(len(reqs)):
        sched.add(i, 0.0)
    out, now, hits = [], 0.0, {}
    while (plan := sched.schedule(now)) is not None:
        for seq, cached_tokens in plan.allocated:
            hits.setdefault(seq, cached_tokens)
        held = [0] * len(order)
        for g, part in zip(order, alloc.group_stats()):
            held[g] = part.unshared_blocks
        record = {"used": alloc.stats().used_blocks, "groups": held,
                  "preempted": list(plan.preempted), "tokens": plan.prefill_tokens + plan.decode_seqs}
        sched.finish(plan, now + 1.0)
        record["finished"] = list(plan.finished)
        out.append(record)
        now += 1.0
    assert sched.num_finished == len(reqs)
    if caching:
        out.append({"hits": [hits.get(i, 0) for i in range(len(reqs))]})
    return out


def test_kvsim_scheduler_equals_vllm_step_by_step():
    golden = load_golden(DATA)
    all_cases = cases()
    assert len(golden) == len(all_cases)
    for case, want in zip(all_cases, golden):
        assert_same_steps(case, run_kvsim(case), want)
    assert sum(len(r.get("preempted", ())) for case in golden for r in case) > 20    # memory pressure is exercised
    assert all(sum(case[-1]["hits"]) > 0 for case, c in zip(golden, all_cases) if c.get("caching"))


REALISTIC = Path(__file__).parents[1] / "data" / "hybrid_oracle" / "scheduler_realistic_vllm_0.33.json.gz"


def test_kvsim_scheduler_equals_vllm_at_realistic_sizes():
    golden = load_golden(REALISTIC)
    all_cases = realistic_cases()
    assert len(golden) == len(all_cases)
    for case, want in zip(all_cases, golden):
        assert_same_steps(case, run_kvsim(case), want)
    assert all(sum(len(r.get("preempted", ())) for r in case) > 0 for case in golden)


@pytest.mark.long
@pytest.mark.skipif(_oracle_python() is None, reason="no vLLM oracle venv (../shared/oracle/setup.sh builds it)")
def test_vllm_live_reproduces_the_golden(tmp_path):
    assert json.loads(vllm_records(cases() + realistic_cases(), tmp_path, timeout=600)) == \
        load_golden(DATA) + load_golden(REALISTIC)


if __name__ == "__main__":      # regenerate the golden files with vLLM (the oracle venv must exist)
    for make, out in ((cases, DATA), (realistic_cases, REALISTIC)):
        regenerate(make(), out, make.__name__)
