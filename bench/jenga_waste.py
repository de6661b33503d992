"""Covers: how much of a fixed KV pool is wasted under Jenga (kvsim/alloc/jenga/) against vLLM's hybrid KV
cache manager (kvsim/alloc/hybrid/, its groups padded to one page size) and uniform pages (every layer as
full attention, vLLM's --disable-hybrid-kv-cache-manager), all driven by the unchanged Scheduler.
Scenario: a burst of requests queued at t = 0 (prompts 256..4096, outputs 64..1024 tokens, seeded) on one
GPU's pool of --pool-gib GiB, block 16, chunked prefill with an 8192-token budget, max_model_len 8192.
Every step the pool's bytes are split into: live tokens' KV, reserved (will be written), internal
fragmentation (held, never written), padding (hybrid: page bytes of the layers a padded group lacks),
stranded (Jenga: free small pages inside another group's large pages), free, and the pool's remainder
past the last whole page (Jenga twice: request-aware placement, and packed: `empty_first=False`); printed
as means over the steps while requests wait (fractions of the pool), with all steps to drain the burst,
the mean batch over them and the preemptions. "wasted" = internal + padding + stranded.

Models (per-layer K+V bytes per token = 2 x kv_heads x head_dim x 2 bytes, bf16), from config.json:
- gpt-oss-120b (openai/gpt-oss-120b): 36 layers alternating sliding (window 128) and full attention,
  8 KV heads x head_dim 64 -> 18 full + 18 sliding layers, 2048 B per layer per token;
- gemma-3-27b (google/gemma-3-27b-it, text_config): 62 layers, sliding_window 1024, every 6th layer global
  (sliding_window_pattern 6) -> 10 full + 52 sliding, 16 KV heads x head_dim 128, 8192 B per layer per token;
- llama-4-scout (meta-llama/Llama-4-Scout-17B-16E, text_config): 48 layers, chunked local attention
  (attention_chunk_size 8192) in 3 of every 4, 8 KV heads x head_dim 128 -> 36 chunked + 12 full, 4096 B;
- qwen3-next-80b (Qwen/Qwen3-Next-80B-A3B-Instruct): 48 layers, full attention every 4th
  (full_attention_interval 4: 12 full, 2 KV heads x head_dim 256, 2048 B) and 36 Gated DeltaNet layers
  whose state is conv (2 x 16 x 128 + 32 x 128 = 8192 channels x (linear_conv_kernel_dim 4 - 1)) + SSM
  (32 value heads x 128 x 128), bf16: 1,097,728 B per layer per request. vLLM raises the attention block
  to 16 x cdiv(state, 16 x 2048) = 544 tokens so one attention page covers a state, and pads the state
  to that page (`Platform._align_hybrid_block_size`, vllm/platforms/interface.py); Jenga keeps block 16
  and the state's own size. No uniform row: Mamba layers cannot be sized as full attention.
vLLM 0.33 groups layers as `_get_kv_cache_groups_uniform_page_size` (v1/core/kv_cache_planning.py): group
size = the smallest kind's layer count (the largest if below 1.5x), each kind cut into cdiv(n, size) groups
(layers[i::groups]), every group's page sized for `size` layers (checked against that function in the
oracle venv: gemma-3-27b -> sliding groups of 9, 9, 9, 9, 8, 8 layers + full 10, pages of 10 layers).
Jenga: one group per kind, at its own page size.

Run: PYTHONPATH=. .venv/bin/python bench/jenga_waste.py [--model gemma-3-27b] [--pool-gib 12] [--requests 200]
(models: gpt-oss-120b, gemma-3-27b, llama-4-scout, qwen3-next-80b; about 1-6 s each on one core)
"""

from __future__ import annotations

import argparse
import random

from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.alloc.jenga import JengaAllocator, JengaGroup
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace

MODELS = {   # per-layer bytes per token, layers per kind (in vLLM's group order), window or chunk (tokens)
    "gpt-oss-120b": (2 * 8 * 64 * 2, {"sliding": 18, "full": 18}, 128),
    "gemma-3-27b": (2 * 16 * 128 * 2, {"sliding": 52, "full": 10}, 1024),
    "llama-4-scout": (2 * 8 * 128 * 2, {"chunked": 36, "full": 12}, 8192),
    "qwen3-next-80b": (2 * 2 * 256 * 2, {"mamba": 36, "full": 12}, 0),
}
MAMBA_STATE = {"qwen3-next-80b": 8192 * 3 * 2 + 32 * 128 * 128 * 2}   # bytes per linear-attention layer
BLOCK, BUDGET, MAX_LEN = 16, 8192, 8192
PARTS = ("kv", "reserved", "internal", "padding", "stranded", "free", "remainder")


class _Recording:
    """Keeps the per-group breakdown as of the last `stats()` (the step's) and runs step by step."""

    def stats(self, *args, **kwargs):
        m = super().stats(*args, **kwargs)
        self.last_groups = self.group_stats()
        return m

    def decode_window(self, seq_ids, max_steps):
        return 0


class Hybrid(_Recording, HybridAllocator):
    pass


class Jenga(_Recording, JengaAllocator):
    pass


def vllm_groups(layers: dict[str, int]) -> tuple[int, list[tuple[str, int]]]:
    """vLLM's uniform-page grouping: (layers per page, [(kind, layers in the group), ...])."""
    size = min(layers.values())
    if max(layers.values()) < 1.5 * size:
        size = max(layers.values())
    groups = []
    for kind, n in layers.items():
        k = -(-n // size)
        groups += [(kind, len(range(i, n, k))) for i in range(k)]
    return size, groups


def spec(kind: str, span: int) -> GroupSpec:
    """The group of `kind` with its window or chunk `span`."""
    return GroupSpec(kind, window=span if kind == "sliding" else 0, chunk=span if kind == "chunked" else 0)


def burst(n: int, seed: int) -> Trace:
    rng = random.Random(seed)
    return Trace.from_arrays([0.0] * n, [rng.randint(256, 4096) for _ in range(n)],
                             [rng.randint(64, 1024) for _ in range(n)])


def build(name: str, scheme: str, pool: int):
    """(allocator, per-group (bytes per slot, useful share of a slot)) for one scheme."""
    per_layer, layers, window = MODELS[name]
    state = MAMBA_STATE.get(name, 0)
    kw = dict(max_model_len=MAX_LEN, max_in_flight_tokens=BUDGET, prefill_chunk_tokens=BUDGET)
    if scheme.startswith("jenga"):           # "jenga": request-aware (empty large pages first); "jenga-packed"
        groups = [JengaGroup(k, spec(k, window).window, spec(k, window).chunk,
                             n * (state if k == "mamba" else BLOCK * per_layer)) for k, n in layers.items()]
        alloc = Jenga(pool, BLOCK, groups, **kw, empty_first=scheme == "jenga")
        return alloc, [(alloc.layout.bytes_per_slot, 1.0)] * len(groups)
    if scheme == "uniform":                           # every layer as full attention, one group
        size, groups = sum(layers.values()), [("full", sum(layers.values()))]
    else:
        size, groups = vllm_groups(layers)
    block = BLOCK * -(-state // (BLOCK * per_layer)) if state else BLOCK    # vLLM's aligned block
    alloc = Hybrid(pool // (size * block * per_layer), block, [spec(k, window) for k, _ in groups], **kw)
    page = block * per_layer                          # per layer; a state is padded to it
    return alloc, [(size * per_layer, n / size * (state / page if k == "mamba" else 1)) for k, n in groups]


def measure(name: str, scheme: str, pool: int, trace: Trace) -> dict:
    alloc, slot = build(name, scheme, pool)
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=256, max_batched_tokens=BUDGET,
                                                    chunked_prefill=True), max_seq_len=MAX_LEN)
    for i in range(len(trace)):
        sched.add(i, 0.0)
    stepper, now, sums = Stepper(sched, ConstantCost(1.0)), 0.0, dict.fromkeys(PARTS, 0.0)
    steps = batch = full = 0
    while (plan := stepper.step(now)) is not None:
        now, steps, batch = plan.end_s, steps + 1, batch + plan.batch_requests
        if not plan.waiting[0]:
            continue                              # only steps while requests wait (memory-bound)
        full += 1
        part = dict.fromkeys(PARTS, 0.0)
        for g, (per_slot, useful) in zip(alloc.last_groups, slot):
            held = g.token_states + g.reserved + g.internal_fragmentation
            part["kv"] += g.token_states * per_slot * useful
            part["reserved"] += g.reserved * per_slot * useful
            part["internal"] += g.internal_fragmentation * per_slot * useful
            part["padding"] += held * per_slot * (1 - useful)
            part["stranded"] += g.external_fragmentation * per_slot
        per_slot = slot[0][0]                     # the same for every group of one allocator
        part["free"] = plan.memory[0].free * per_slot
        part["remainder"] = pool - alloc.capacity_tokens * per_slot
        assert abs(sum(part.values()) - pool) < 1e-6 * pool, (scheme, part)
        for k in PARTS:
            sums[k] += part[k] / pool
    assert sched.num_finished + sched.num_rejected == len(trace)
    out = {k: v / full for k, v in sums.items()}
    out.update(steps=steps, full_steps=full, mean_batch=batch / steps, preemptions=sched.num_preemptions,
               rejected=sched.num_rejected)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gemma-3-27b")
    ap.add_argument("--pool-gib", type=float, default=12.0)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pool, trace = int(args.pool_gib * 2**30), burst(args.requests, args.seed)
    print(f"{args.model}: pool {args.pool_gib} GiB, {args.requests} requests (seed {args.seed}); "
          f"vLLM groups {vllm_groups(MODELS[args.model][1])}")
    print(f"{'scheme':12s} " + " ".join(f"{k:>9s}" for k in PARTS) + "  wasted  steps  batch  preempt")
    for scheme in ("uniform", "hybrid", "jenga", "jenga-packed")[1 if args.model in MAMBA_STATE else 0:]:
        r = measure(args.model, scheme, pool, trace)
        wasted = r["internal"] + r["padding"] + r["stranded"]
        print(f"{scheme:12s} " + " ".join(f"{r[k]:9.4f}" for k in PARTS)
              + f"  {wasted:6.4f} {r['steps']:6d} {r['mean_batch']:6.1f} {r['preemptions']:8d}")


if __name__ == "__main__":
    main()
