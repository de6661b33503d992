"""What limited a run (`kvsim.planning.limits.limit_of`), on constructed runs whose answer is known by
hand (constant kernel time C per step, no CPU time): each admission limit binding, the GPU busy with
nothing held back (compute), and the GPU mostly idle (latency); plus issue 41's case, a cache full a
tenth of the time that the old rule ("compute is 1 minus the limits' sum") called compute."""

from dataclasses import replace

import numpy as np
import pytest

from kvsim.cost.profiles import PROFILES
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.planning.limits import BUSY, MIN_HELD, limit_of
from kvsim.planning.runs import config_row, summary_row
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

C = 1.0
DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
IDEAL = replace(PROFILES["ideal"], cpu_step_s=0.0, cpu_seq_s=0.0)


def row_of(rows, cache=None, **sched):
    a, p, o = (np.array(col) for col in zip(*rows))
    cfg = SimConfig(DEP, CacheConfig(**(cache or {"block_size": 4, "num_blocks": 100})),
                    SchedulerConfig(**sched), engine_profile=IDEAL)
    res = simulate(Trace.from_arrays(a.astype(float), p, o), cfg, cost=ConstantCost(C))
    return res.summary, {**config_row(cfg), **summary_row(res.summary)}


@pytest.mark.parametrize("sched, cache, key, figure", [
    ({"max_num_seqs": 1}, None, "max_num_seqs", "max_num_seqs = 1 running sequences"),
    ({}, {"allocator": "contiguous", "reserve": "oracle", "block_size": 4, "num_blocks": 5}, "kv_memory",
     "a full KV cache (KV peak 60% of 20 tokens)"),
    ({"max_batched_tokens": 10}, None, "token_budget", "max_num_batched_tokens = 10"),
])
def test_each_admission_limit_is_named_with_its_figures(sched, cache, key, figure):
    # two requests (prompt 10, 3 outputs) at t=0; one runs, the other waits 3 of the 6 steps of C:
    # the limit held it back half the time, and the GPU never idled
    summary, row = row_of([(0.0, 10, 3), (0.0, 10, 3)], cache, **sched)
    assert summary["gpu_busy_fraction"] == 1.0
    limit = limit_of(row)
    assert limit.key == key
    assert figure in limit.text and "held waiting requests back 50% of the time; GPU busy 100%" in limit.text


def test_compute_when_the_gpu_is_busy_and_nothing_waits():
    # three requests at t=0 all admitted together: 3 steps of C back to back, nothing held back
    summary, row = row_of([(0.0, 10, 3)] * 3)
    assert summary["limited_by"] == {"kv_memory": 0.0, "max_num_seqs": 0.0, "token_budget": 0.0}
    assert summary["gpu_busy_fraction"] == 1.0
    assert limit_of(row).key == "compute" and "the GPU ran steps 100% of the time" in limit_of(row).text


def test_latency_when_the_gpu_idles():
    # two lone requests 100 s apart: 3 steps of C each (prefill, 2 decodes) over a span of 103 s
    summary, row = row_of([(0.0, 10, 3), (100.0, 10, 3)])
    assert summary["gpu_busy_fraction"] == pytest.approx(6 / 103)
    limit = limit_of(row)
    assert limit.key == "latency" and "the GPU was idle 94% of the time" in limit.text


def test_a_cache_full_a_tenth_of_the_time_is_kv_memory_not_compute():
    # issue 41: the old rule took compute = 1 - 0.1 = 0.9 > 0.1 and said "compute"
    row = {"limited_by_kv_memory": 0.1, "limited_by_max_num_seqs": 0.0, "limited_by_token_budget": 0.0,
           "gpu_busy_fraction": 0.97, "kv_peak_allocated_fraction": 1.0, "kv_capacity_tokens": 12_480}
    limit = limit_of(row)
    assert limit.key == "kv_memory"
    assert limit.text == ("kv_memory: a full KV cache (KV peak 100% of 12,480 tokens) held waiting requests back "
                          "10% of the time; GPU busy 97%")
    # the thresholds' edges: held just under MIN_HELD and the GPU just under BUSY is latency
    edge = {**row, "limited_by_kv_memory": MIN_HELD * 0.99, "gpu_busy_fraction": BUSY * 0.99}
    assert limit_of(edge).key == "latency"
    assert limit_of({**edge, "gpu_busy_fraction": BUSY}).key == "compute"
