"""Fleets worked out by hand (two replicas, a constant step cost, known routing sequences), the router's
rules on fake replicas, and one replica giving exactly the single engine's results."""

import numpy as np
import pytest

from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.fleet.config import FleetConfig
from kvsim.fleet.router import PrefixIndex, Router, prefix_keys
from kvsim.fleet.sim import simulate_fleet
from kvsim.planning.runs import make_config
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.formats import load_trace
from kvsim.trace.table import Trace

C = 0.1  # seconds per step


def config(prefix_caching=False):
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
    return SimConfig(dep, CacheConfig(block_size=16, num_blocks=200, prefix_caching=prefix_caching),
                     SchedulerConfig(), engine_profile="ideal")     # no CPU time: steps last C exactly


def fleet_run(trace, router, cfg=None, **kw):
    return simulate_fleet(trace, cfg or config(), FleetConfig(2, router, **kw), cost=ConstantCost(C))


def test_round_robin_alternates_and_each_replica_steps_on_its_own():
    # A, B, C, D arrive at 0, .05, .12, .17 with 3 output tokens: A -> 0 (steps at 0, .1, .2: done .3),
    # B -> 1 (steps at .05, .15, .25), C -> 0 (queued while A decodes; prefilled in the step at .2,
    # first token .3), D -> 1 (prefilled at .25, first token .35)
    tr = Trace.from_arrays([0.0, 0.05, 0.12, 0.17], [20] * 4, [3] * 4)
    res = fleet_run(tr, "round-robin")
    cols = res.request_columns
    assert cols["replica"].tolist() == [0, 1, 0, 1]
    assert cols["first_token_s"] == pytest.approx([0.1, 0.15, 0.3, 0.35])
    assert cols["finished_s"] == pytest.approx([0.3, 0.35, 0.5, 0.55])
    fleet = res.summary["fleet"]
    assert fleet["routed"] == [2, 2] and fleet["imbalance"]["requests_max_over_mean"] == 1.0
    assert [s["requests_finished"] for s in fleet["per_replica"]] == [2, 2]
    assert res.summary["requests_finished"] == 4
    assert res.summary["ttft_s"]["mean"] == pytest.approx((0.1 + 0.1 + 0.18 + 0.18) / 4)


def test_least_requests_sends_to_the_idle_replica_where_round_robin_queues():
    # A (10 outputs) -> 0; B (2 outputs) -> 1, done at .25; C at .32: replica 0 still decodes A.
    # round-robin: C -> 0, prefilled in the step at .4, first token .5; least-requests: C -> 1 (idle),
    # stepping at once: first token .42
    tr = Trace.from_arrays([0.0, 0.05, 0.32], [20] * 3, [10, 2, 2])
    rr, lr = fleet_run(tr, "round-robin"), fleet_run(tr, "least-requests")
    assert rr.request_columns["replica"].tolist() == [0, 1, 0]
    assert lr.request_columns["replica"].tolist() == [0, 1, 1]
    assert rr.request_columns["first_token_s"][2] == pytest.approx(0.5)
    assert lr.request_columns["first_token_s"][2] == pytest.approx(0.42)


def test_prefix_aware_follows_the_prefix_and_the_cache_hits_follow():
    # groups g1, g2, g2, g1 with a 64-token shared prefix (4 blocks of 16) in 100-token prompts:
    # round-robin sends C and D to the replica without their prefix (0 hits); prefix-aware sends A and B
    # to the least loaded replicas (0, then 1: it has none running) and C, D where their group lives.
    groups = ["g1", "g2", "g2", "g1"]
    tr = Trace.from_arrays([0.0, 0.05, 0.5, 0.55], [100] * 4, [3] * 4, prefix_group=groups,
                           prefix_tokens=[64] * 4)
    cfg = config(prefix_caching=True)
    rr, pa = fleet_run(tr, "round-robin", cfg), fleet_run(tr, "prefix-aware", cfg)
    assert rr.request_columns["replica"].tolist() == [0, 1, 0, 1]
    assert pa.request_columns["replica"].tolist() == [0, 1, 1, 0]
    assert pa.summary["fleet"]["decisions"] == {"least-loaded": 2, "prefix": 2}
    assert rr.summary["prefix_cache_hit_tokens"] == 0
    assert pa.summary["prefix_cache_hit_tokens"] == 2 * 64
    assert pa.summary["prefix_cache_hit_rate"] == pytest.approx(128 / 400)
    assert [s["prefix_cache_hit_tokens"] for s in pa.summary["fleet"]["per_replica"]] == [64, 64]


class _Sched:
    def __init__(self, load):
        self.waiting, self.running, self.swapped = [0] * load, [], []


class _Rep:
    def __init__(self, load):
        self.sched = _Sched(load)


def _router(loads, ids, **kw):
    reps = [_Rep(x) for x in loads]
    return Router(FleetConfig(len(loads), "prefix-aware", **kw), reps, lambda i: ids[i], capacity_blocks=100), reps


def test_prefix_aware_takes_the_least_loaded_when_out_of_balance():
    ids = {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}
    router, reps = _router([0, 0], ids, balance_abs=2, balance_rel=1.5)
    assert router.route(0) == 0                                 # no prefix anywhere: least loaded (tie: 0)
    reps[0].sched.waiting = [0] * 3                             # 3 - 0 > 2 and 3 > 1.5 x 0: out of balance
    assert router.route(1) == 1 and router.decisions["balance"] == 1
    reps[0].sched.waiting = [0] * 2                             # 2 - 0 is not > 2: in balance
    assert router.index.matched(prefix_keys(ids[1])) == {0: 4, 1: 4}
    assert router.route(1) == 1 and router.decisions["prefix"] == 1    # both hold it all: the idler


def test_prefix_aware_needs_the_cache_threshold_share_of_the_prompt():
    ids = {0: [1], 1: [1, 2, 3, 4]}
    router, reps = _router([0, 0], ids, cache_threshold=0.3)
    assert router.route(0) == 0
    reps[0].sched.running = [0]                                 # replica 0 holds 1 of 4 blocks: 25% < 30%
    assert router.route(1) == 1 and router.decisions == {"least-loaded": 2}
    router.cfg = FleetConfig(2, "prefix-aware", cache_threshold=0.25)
    assert router.route(0) == 1                                 # both hold its one block: the idler
    assert router.route(1) == 1 and router.decisions["prefix"] == 2    # 4 blocks at 1 beat 1 at 0


def test_prefix_index_forgets_least_recently_routed_blocks_beyond_capacity():
    index = PrefixIndex(2, capacity_blocks=2)
    a, c = prefix_keys([1, 2]), prefix_keys([7])
    index.record(0, a)
    assert index.matched(a) == {0: 2}
    index.record(0, c)                                          # 3 keys > 2: the oldest (a's first) goes
    assert index.matched(a) == {} and index.matched(c) == {0: 1}


@pytest.mark.parametrize("path,flags", [
    ("traces/tiny.jsonl", {}),
    ("traces/mooncake_conversation_excerpt.jsonl", {"prefix_caching": True, "kv_gib": 3}),
    ("traces/azure_conv_excerpt.jsonl", {"kv_gib": 4, "engine_profile": "vllm-2023"}),
])
@pytest.mark.parametrize("router", ["round-robin", "prefix-aware"])
def test_one_replica_is_the_single_engine_exactly(path, flags, router):
    tr = load_trace(path)
    if len(tr) > 400:
        tr = tr.head(400)
    cfg = make_config(**flags)
    single = simulate(tr, cfg, keep_steps=False).summary
    fleet = simulate_fleet(tr, cfg, FleetConfig(1, router)).summary
    for s in (single, fleet):
        s.pop("sim_wall_s")
    assert fleet.pop("fleet")["routed"] == [len(tr)]
    assert fleet == single


def test_replicas_that_get_nothing_report_an_empty_summary():
    tr = Trace.from_arrays([0.0], [20], [3])
    res = simulate_fleet(tr, config(), FleetConfig(3, "least-requests"), cost=ConstantCost(C))
    fleet = res.summary["fleet"]
    assert fleet["routed"] == [1, 0, 0] and res.summary["requests_finished"] == 1
    assert [s["engine_steps"] for s in fleet["per_replica"]] == [3, 0, 0]
    assert fleet["imbalance"]["requests_max_over_mean"] == pytest.approx(3.0)
    assert res.summary["duration_s"] == pytest.approx(3 * C)


def test_fleet_config_names_the_flag():
    with pytest.raises(ValueError, match="--replicas"):
        FleetConfig(0)
    with pytest.raises(ValueError, match="--router"):
        FleetConfig(2, "random")
    assert np.isclose(FleetConfig().balance_rel, 1.5)
    assert FleetConfig(np.int64(3)).replicas == 3
    with pytest.raises(ValueError, match="--replicas"):
        FleetConfig(2.5)


@pytest.mark.parametrize("flags", [{}, {"kv_gib": 1.5, "prefix_caching": False}])
def test_async_fleet_windows_match_stepping(flags, monkeypatch):
    # two llama-3-8b replicas under async scheduling (finished requests held a step), 200 ShareGPT-like
    # requests at 60 req/s: windows give every request's times and the summary of stepping one at a time
    from kvsim.trace.synthetic import generate
    tr = generate("sharegpt", rate_rps=60, duration_s=None, num_requests=200, seed=4)
    cfg = make_config(model="llama-3-8b", gpu="h100-80gb", **flags)
    from kvsim.fleet.replica import Replica
    windows, plan_window = [], Replica._plan_window

    def counted(self, *args):
        windows.append(plan_window(self, *args))
        return windows[-1]
    monkeypatch.setattr(Replica, "_plan_window", counted)
    rows = {True: ([], []), False: ([], [])}
    runs = {ff: simulate_fleet(tr, cfg, FleetConfig(2, "least-requests"), fast_forward=ff,
                               step_sinks=[r.append for r in rows[ff]]) for ff in (True, False)}
    a, b = runs[True].summary, runs[False].summary
    for s in (a, b):
        s.pop("sim_wall_s")
        for r in s["fleet"]["per_replica"]:
            r.pop("sim_wall_s", None)
    assert a == b and a["requests_finished"] == 200
    assert sum(w is not None for w in windows) >= 50          # (windows ran: 196 and 229 here)
    assert runs[True].requests.equals(runs[False].requests)
    for fast, slow in zip(*rows.values()):         # each replica's steps (columns, a chunk at a time)
        steps = {k: np.concatenate([c[k] for c in fast]) for k in fast[0]}
        assert len(steps["time_s"]) > 100
        for k, v in steps.items():
            assert np.array_equal(v, np.concatenate([c[k] for c in slow])), k
