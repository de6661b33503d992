"""Run vLLM 0.33's own v1 Scheduler (and through it its KVCacheManager) with hybrid KV cache groups over burst
traces, for tests/vllm/test_hybrid_scheduler_oracle.py and tests/vllm/test_hybrid_retention_oracle.py. The
engine's configuration and KV cache config come from vLLM's own start-up functions (tests/vllm/vllm_startup.py:
`get_kv_cache_configs`, `generate_scheduler_kv_cache_config`, ...), so vLLM's defaults apply unless a case
sets them: prefix cache retention interval 0, recompute preemption, chunked prefill; synchronous
scheduling unless "async_scheduling": true (vLLM's `AsyncScheduler`, driven with two batches in flight
as `EngineCore.step_with_batch_queue` does).

Run with the oracle venv's python (never imported by kvsim or by pytest's process):
    ~/.cache/vllm-oracle-venv/bin/python tests/vllm/hybrid_scheduler_oracle_driver.py CASES.json OUT.json
A case: {"block_size": B, "num_blocks": N (usable blocks; vLLM gets num_gpu_blocks_override = N + 1 with its
null block), "groups": [...] (as tests/vllm/hybrid_oracle_driver.py), "max_num_batched_tokens": T,
"max_num_seqs": S, "max_model_len": L, "requests": [[prompt, output], ...] all arriving at step 0,
optionally "caching": true with "prompts": the token ids of each prompt (automatic prefix caching;
outputs unique to each request), "retention": "none" | an int (vLLM's --prefix-cache-retention-interval;
absent: its default 0), "async_scheduling": true}. Output per case: per step {"used": blocks used after
the step's scheduling, "groups": per case group blocks in the live requests' tables (a shared one once
per table), "preempted": [request index], "finished": [request index], "tokens": tokens scheduled}; with
caching a last record {"hits": tokens each request's first admission got from the prefix cache}.
"""

import json
import os
import sys
import tempfile
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_startup import group_order, startup  # noqa: E402  (sets vLLM's quiet logging first)


def run(case: dict) -> list[dict]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    vc, kvc, sched_bs, hash_bs = startup(case)       # vLLM's own start-up (tests/vllm/vllm_startup.py)
    order = group_order(kvc, case)
    caching = case.get("caching", False)
    hasher = None
    if caching:
        fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(hash_bs, fn)
    sch = vc.scheduler_config.get_scheduler_cls()(
        vllm_config=vc, kv_cache_config=kvc, structured_output_manager=StructuredOutputManager(vc),
        log_stats=False, block_size=sched_bs, hash_block_size=hash_bs)
    groups = kvc.kv_cache_groups
    mgr, pool = sch.kv_cache_manager, sch.kv_cache_manager.block_pool
    preempted: list[int] = []
    orig_preempt = sch._preempt_request

    def preempt(request, *a, **kw):
        preempted.append(int(request.request_id))
        return orig_preempt(request, *a, **kw)
    sch._preempt_request = preempt

    reqs, hits = [], {}
    orig_alloc = mgr.allocate_slots

    def allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, *a, **kw):
        out = orig_alloc(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, *a, **kw)
        if out is not None and new_computed_blocks is not None and request.request_id not in hits:
            hits[request.request_id] = num_new_computed_tokens      # at its first admission
        return out
    mgr.allocate_slots = allocate_slots
    for i, (prompt, output) in enumerate(case["requests"]):
        tokens = case["prompts"][i] if "prompts" in case else [3 + (i * 7919 + k) % 60000 for k in range(prompt)]
        r = Request(str(i), tokens, SamplingParams(max_tokens=output, ignore_eos=True), None, block_hasher=hasher)
        reqs.append(r)
        sch.add_request(r)
    out, done = [], set()

    def record_schedule(so) -> dict:
        held = [0] * len(groups)
        for r in reqs:
            for g, blocks in enumerate(mgr.coordinator.get_blocks(r.request_id)):
                held[g] += sum(not b.is_null for b in blocks)
        by_case = [0] * len(groups)
        for g, n in zip(order, held):
            by_case[g] = n
        return {"used": case["num_blocks"] - pool.get_num_free_blocks(), "groups": by_case,
                "preempted": list(preempted), "tokens": so.total_num_scheduled_tokens, "finished": []}

    def settle(so, sampling: list[str], record: dict) -> None:
        """The model's output for batch `so` (a token for each request that sampled in it)."""
        ids = list(so.num_scheduled_tokens)
        toks = [[100_000 + int(rid) * 1000 + reqs[int(rid)].num_output_tokens] if rid in sampling else []
                for rid in ids]
        sch.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={k: i for i, k in enumerate(ids)},
                                                     sampled_token_ids=toks))
        record["finished"] = [int(rid) for rid in ids if reqs[int(rid)].is_finished() and rid not in done]
        done.update(str(i) for i in record["finished"])

    batches = vc.max_concurrent_batches      # 1; 2 with async scheduling (EngineCore's batch queue)
    queue = deque()
    while sch.has_unfinished_requests() or queue:
        if sch.has_unfinished_requests():    # EngineCore.step_with_batch_queue: fill the queue first
            preempted.clear()
            so = sch.schedule()
            # a request samples in this batch unless it is a prefill chunk short of its prompt
            sampling = [rid for rid in so.num_scheduled_tokens
                        if reqs[int(rid)].num_computed_tokens >= reqs[int(rid)].num_tokens]
            record = record_schedule(so)
            out.append(record)
            queue.appendleft((so, sampling, record))
            assert len(out) < 100_000
            if len(queue) < batches and (so.total_num_scheduled_tokens > 0 or sch.has_unfinished_requests()):
                continue
        so, sampling, record = queue.pop()
        settle(so, sampling, record)
    if caching:
        out.append({"hits": [hits.get(str(i), 0) for i in range(len(reqs))]})
    return out


def main() -> None:
    cases = json.load(open(sys.argv[1]))
    json.dump([run(c) for c in cases], open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
