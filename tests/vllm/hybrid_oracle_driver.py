"""Run vLLM 0.33's own KVCacheManager (hybrid KV cache groups over one block pool, prefix caching off) through
a list of allocator operations and record the pool after each one, for tests/vllm/test_hybrid_oracle.py.

Run with the oracle venv's python (never imported by kvsim or by pytest's process):
    ~/.cache/vllm-oracle-venv/bin/python tests/vllm/hybrid_oracle_driver.py SCENARIOS.json OUT.json
A scenario: {"block_size": B, "num_blocks": N (kvsim's; vLLM gets N + 1, its block 0 being the null block),
"max_model_len": L, "max_in_flight_tokens": T, "groups": [{"kind": "full"|"sliding"|"chunked"|"mamba",
"window": W, "chunk": C}], "ops": [...]}. Ops, as vLLM's scheduler makes them:
- ["admit", rid, prompt, first]: a new request's first `first` prompt tokens (allocate_slots with
  full_sequence_must_fit, vLLM's default admission gate);
- ["grow", rid, n]: a running request computes `n` more tokens (a prefill chunk or a decode token;
  its output grows to cover them);
- ["free", rid];
with "caching": true (automatic prefix caching, every prompt given as its token ids, output tokens unique
to each request; new tokens per admission at most "max_in_flight_tokens"):
- ["admitc", rid, [token ids]]: a new request, its prefix-cache hits looked up (`get_computed_blocks`);
- ["readmit", rid]: a freed request back with its prompt and outputs (a recompute), hits looked up.
An op on a request that is not running (its admission was refused) is skipped (ok: null); a request whose
grow fails is freed at once (preempted, as vLLM's scheduler does when it is the last one running).
Output per scenario: one record per op: {"ok": bool, "free": free blocks, "tables": {rid: [per group:
block ids, vLLM id - 1, -1 for the null block]}, with caching also "hit": tokens served by the cache}.
"""

import json
import logging
import math
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
logging.getLogger("vllm").setLevel(logging.WARNING)


def spec_of(group: dict, block_size: int, max_model_len: int, pad_mamba: bool = False, align: bool = False,
            checkpoints: bool = False):
    """vLLM's spec of a case group; `pad_mamba`: a Mamba page padded to the attention page (as vLLM's
    start-up makes every page the same size); `align`: prefix caching on, so a Mamba group runs vLLM's
    "align" cache mode with blocks of `block_size` tokens (`MambaModelConfig.verify_and_update_config`
    sets mamba_block_size = block_size, `Platform._align_hybrid_block_size` keeps it equal to the
    attention block size); `checkpoints`: the Mamba layer exports a state from inside a prefill chunk, as
    vLLM's Mamba-2 mixer declares (`MambaMixer2.get_kv_cache_spec`: one prefill checkpoint block, alignment 1)."""
    import torch
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec,
                                            SlidingWindowSpec)
    attn = dict(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kind = group["kind"]
    if kind == "full":
        return FullAttentionSpec(**attn)
    if kind == "sliding":
        return SlidingWindowSpec(**attn, sliding_window=group["window"])
    if kind == "chunked":
        return ChunkedLocalAttentionSpec(**attn, attention_chunk_size=group["chunk"])
    # without prefix caching vLLM gives a Mamba group blocks of max_model_len tokens
    # (vllm/model_executor/models/config.py: mamba_block_size = max_model_len): one per request
    pad = 2 * block_size * 8 * 4 if pad_mamba else None    # (the attention page: K and V, 8 float32 per token)
    if align:
        extra = dict(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1) if checkpoints else {}
        return MambaSpec(block_size=block_size, shapes=((2, 4),), dtypes=(torch.float32,), page_size_padded=pad,
                         mamba_cache_mode="align", **extra)
    return MambaSpec(block_size=max_model_len, shapes=((2, 4),), dtypes=(torch.float32,), page_size_padded=pad)


def run(scenario: dict) -> list[dict]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    bs, max_len = scenario["block_size"], scenario["max_model_len"]
    groups = [KVCacheGroupSpec([f"layers.{g}"], spec_of(group, bs, max_len))
              for g, group in enumerate(scenario["groups"])]
    # (the scheduler-level driver takes this config from vLLM's start-up functions, tests/vllm/vllm_startup.py;
    # here it is made directly, its retention interval as a scenario's "retention" says, else the field's
    # None: dense, as start-up makes it from `--prefix-cache-retention-interval none`)
    retention = scenario.get("retention")
    cfg = KVCacheConfig(num_blocks=scenario["num_blocks"] + 1, kv_cache_tensors=[], kv_cache_groups=groups,
                        prefix_cache_retention_interval=None if retention == "none" else retention)
    lcm = math.lcm(*(g.kv_cache_spec.block_size for g in groups))   # vLLM's scheduler block size
    mgr = KVCacheManager(cfg, max_model_len=max_len, scheduler_block_size=lcm, hash_block_size=bs,
                         max_in_flight_tokens=scenario["max_in_flight_tokens"],
                         enable_caching=scenario.get("caching", False))
    hasher = None
    if scenario.get("caching"):
        fn = get_hash_fn_by_name("sha256")
        init_none_hash(fn)
        hasher = get_request_block_hasher(bs, fn)
    reqs: dict[int, Request] = {}
    parked: dict[int, Request] = {}
    out = []
    for op in scenario["ops"]:
        kind, rid = op[0], op[1]
        hit = 0
        if kind in ("admitc", "readmit"):
            if kind == "admitc":
                req = Request(str(rid), list(op[2]), SamplingParams(max_tokens=max_len, ignore_eos=True), None,
                              block_hasher=hasher)
            else:
                req = parked.pop(rid)
                req.num_computed_tokens, req.status = 0, RequestStatus.PREEMPTED
            # the junction, as the Scheduler keeps it on the request (`shared_prefix_boundary`)
            blocks, hit, req.shared_prefix_boundary = mgr.get_computed_blocks(req)
            new = min(req.num_tokens - hit, scenario["max_in_flight_tokens"])
            ok = mgr.allocate_slots(req, new, hit, blocks, full_sequence_must_fit=True) is not None
            if ok:
                req.num_computed_tokens, req.status = hit + new, RequestStatus.RUNNING
                reqs[rid] = req
            else:
                parked[rid] = req
        elif kind != "admit" and rid not in reqs:
            ok = None
        elif kind == "admit":
            prompt, first = op[2], op[3]
            req = Request(str(rid), list(range(prompt)), SamplingParams(max_tokens=max_len, ignore_eos=True), None)
            ok = mgr.allocate_slots(req, first, full_sequence_must_fit=True) is not None
            if ok:
                req.num_computed_tokens, req.status = first, RequestStatus.RUNNING
                reqs[rid] = req
        elif kind == "grow":
            req, n = reqs[rid], op[2]
            while req.num_tokens < req.num_computed_tokens + n:
                req.append_output_token_ids(1_000_000 + rid * 10_000 + req.num_output_tokens)
            ok = mgr.allocate_slots(req, n) is not None
            if ok:
                req.num_computed_tokens += n
            else:
                mgr.free(reqs[rid])
                parked[rid] = reqs.pop(rid)
        else:
            mgr.free(reqs[rid])
            parked[rid] = reqs.pop(rid)
            ok = True
        tables = {str(r): [[-1 if b.is_null else b.block_id - 1 for b in blocks]
                           for blocks in mgr.coordinator.get_blocks(str(r))] for r in reqs}
        record = {"ok": ok, "free": mgr.block_pool.get_num_free_blocks(), "tables": tables}
        if scenario.get("caching"):
            record["hit"] = hit
        out.append(record)
    return out


def main() -> None:
    scenarios = json.load(open(sys.argv[1]))
    json.dump([run(s) for s in scenarios], open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
