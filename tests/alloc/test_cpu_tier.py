"""The CPU tier under the paged prefix cache, by hand: blocks the GPU evicts land in it (LRU), a later
prompt continuing past its GPU hits loads them (counted as cached, taking fresh GPU blocks), the
scheduler charges the load as PCIe time, and the summary splits the hit rate per tier."""

import pytest

from kvsim.alloc import PagedAllocator, chain_hashes
from kvsim.alloc.cpu_tier import CpuTier
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.build import cpu_tier_blocks
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace


def _evict_first_prefix(tier_blocks):
    """3 blocks of 4 slots. Seq 1 (9 slots, shareable blocks [10, 20]) is freed: its two full blocks
    stay cached (evictable), tail first. Seq 2 (12 slots, other content) needs all 3: it evicts them,
    hash of [10, 20] first (the tail goes first), then hash of [10]."""
    alloc = PagedAllocator(3, 4, prefix_caching=True, cpu_tier_blocks=tier_blocks)
    alloc.allocate(1, 9, 9, [10, 20])
    alloc.free(1)
    alloc.allocate(2, 12, 12, [30, 40, 50])
    alloc.free(2)
    return alloc


def test_evicted_blocks_load_back_from_the_cpu_tier():
    alloc = _evict_first_prefix(tier_blocks=4)
    assert alloc.cpu_tier.stored == 2 and len(alloc.cpu_tier) == 2
    assert alloc.cached_tokens(9, [10, 20], 3) == 8          # both blocks, from the CPU
    assert alloc.allocate(3, 9, 9, [10, 20]) == 8
    assert alloc.take_loaded_tokens() == 8 and alloc.take_loaded_tokens() == 0
    assert alloc.cpu_tier.loaded == 2


def test_the_tier_keeps_the_most_recently_evicted_and_a_prefix_needs_its_head():
    alloc = _evict_first_prefix(tier_blocks=1)                # keeps only the last put: [10]'s hash
    assert alloc.cpu_tier.dropped == 1 and alloc.cpu_tier.count(chain_hashes([10, 20]), 0, 2) == 1
    assert alloc.allocate(3, 9, 9, [10, 20]) == 4
    tail_only = _evict_first_prefix(tier_blocks=4)
    assert tail_only.allocate(3, 9, 9, [99, 20]) == 0         # a different head: nothing matches


def test_cpu_tier_lru_order():
    tier = CpuTier(2)
    for h in (1, 2):
        tier.put(h)
    tier.load([1], 0, 1, 16)                                  # 1 is most recent now
    tier.put(3)                                               # drops 2
    assert tier.count([1], 0, 1) == 1 and tier.count([2], 0, 1) == 0 and tier.dropped == 1


def _config(cpu_kv_gib, num_blocks=3, swap_gib=0.0, tp=1):
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), tp)
    return SimConfig(dep, CacheConfig(block_size=16, num_blocks=num_blocks, prefix_caching=True,
                                      cpu_kv_gib=cpu_kv_gib, swap_gib=swap_gib),
                     SchedulerConfig(), engine_profile="ideal")


def test_a_cpu_hit_costs_pcie_time_and_counts_in_its_own_tier():
    # 3 blocks of 16. A (33 tokens, group g: 2 shared blocks) runs alone; B (48 tokens of other
    # content, 1 output) then takes every block, evicting A's two cached blocks into the CPU tier;
    # C (group g again) loads 32 tokens back: its prefill step lasts C + 32 x s (PCIe).
    step, per_token = 0.5, 0.01
    tr = Trace.from_arrays([0.0, 2.0, 4.0], [33, 48, 33], [1, 1, 1], prefix_group=["g", None, "g"],
                           prefix_tokens=[32, 0, 32])
    res = simulate(tr, _config(1.0), cost=ConstantCost(step, swap_s_per_token=per_token))
    assert res.request_columns["first_token_s"].tolist() == pytest.approx([0.5, 2.5, 4.0 + step + 32 * per_token])
    s = res.summary
    assert s["prefix_cache_hit_tokens"] == 32 and s["swap"]["time_s"] == pytest.approx(32 * per_token)
    assert s["cpu_kv"]["loaded_blocks"] == 2 and s["cpu_kv"]["stored_blocks"] >= 2
    assert s["cpu_kv"]["cpu_hit_rate"] == pytest.approx(32 / (33 + 48 + 33))
    assert s["cpu_kv"]["gpu_hit_rate"] == 0.0


def test_cpu_tier_size_in_blocks_and_the_host_memory_bound():
    cfg = _config(1.0)
    per_block = cfg.deployment.kv_bytes_per_token() * 16        # OPT-13B: 819,200 bytes per token
    assert cpu_tier_blocks(cfg, 16) == (1 << 30) // per_block
    with pytest.raises(ValueError, match="--cpu-kv-gib"):
        cpu_tier_blocks(_config(240.0), 16)                    # > 2 TB / 8 GPUs = 232.8 GiB
    assert cpu_tier_blocks(_config(400.0, tp=2), 16) > 0      # two GPUs' share holds it
    with pytest.raises(ValueError, match="--cpu-kv-gib"):
        CacheConfig(cpu_kv_gib=1.0, prefix_caching=False)      # no prefix caching: nothing to keep
