"""Fleet planning: the replica search of `gpus_for_fleet` (on a stand-in fleet whose SLO outcome is
known), `kvsim capacity --gpus-for --router`, and sweep grids over replicas, router and cpu_kv_gib."""

import pytest
from typer.testing import CliRunner

import kvsim
import kvsim.planning.rate.fleet_gpus as fc
from kvsim.cli.app import app


def test_search_doubles_then_bisects_and_stops_at_the_gpus_already_found(monkeypatch):
    tried = []

    def fake(trace, cfg, fleet):         # a fleet meets ttft_p99 <= 1 from 5 replicas at TP 1, 4 at TP 2
        tried.append((cfg.deployment.tp, fleet.replicas))
        ok = fleet.replicas * cfg.deployment.tp >= 5 if cfg.deployment.tp == 1 else fleet.replicas >= 4
        cols = {k: [] for k in ("arrival_s", "first_token_s", "finished_s", "output_tokens", "status")}
        return {"ttft_s": {"p99": 0.5 if ok else 3.0}, "prefix_cache_hit_rate": 0.0}, cols

    monkeypatch.setattr(fc, "_simulate", fake)     # no requests: no trend, batch means undecided; the span
    df = fc.gpus_for_fleet(4.0, {"ttft_p99": 1.0}, router="round-robin", preset="alpaca", duration_s=10,
                           model="llama-3-8b", gpu="h100-80gb", tp_options=(1, 2), max_span_s=10)  # cap: 10 s
    # tp 1: 1, 2, 4 fail, 8 meets; bisect 4..8: 6 meets, 5 meets -> 5 replicas
    assert tried[:6] == [(1, 1), (1, 2), (1, 4), (1, 8), (1, 6), (1, 5)]
    # tp 2: at most (5 - 1) // 2 = 2 replicas can beat 5 GPUs: 1 and 2 fail (it needs 4)
    assert tried[6:] == [(2, 1), (2, 2)]
    row1, row2 = df.to_dict("records")
    assert (row1["replicas"], row1["gpus"], row1["runs"], row1["best"]) == (5, 5, 6, True)
    assert row1["span_s"] == 10 and row1["note"].startswith("uncertain: on 10 s")
    assert row2["replicas"] != row2["replicas"] and "up to 2 replicas" in row2["note"]


def test_capacity_gpus_for_with_a_router_simulates_fleets():
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--preset", "alpaca",
                                   "--slo", "ttft_p99=5", "--gpus-for", "4", "--duration", "20",
                                   "--router", "least-requests", "--tp-options", "1"])
    assert res.exit_code == 0, res.output
    assert "fleets simulated behind the least-requests router" in res.output and "fewest GPUs: 1 = 1" in res.output


@pytest.mark.parametrize("args,message", [
    (["--router", "prefix-aware"], "--router sizes a fleet"),
    (["--slo", "ttft_p99=1", "--gpus-for", "2", "--router", "nearest"], "--router"),
])
def test_capacity_router_bad_input(args, message):
    res = CliRunner().invoke(app, ["capacity", "--preset", "alpaca", "--duration", "5", *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_sweep_grid_over_replicas_router_and_cpu_tier():
    df = kvsim.run_sweep({"replicas": [1, 2], "router": ["round-robin"], "cpu_kv_gib": [0, 1]},
                         {"prefix_caching": True, "model": "llama-3-8b", "gpu": "h100-80gb"},
                         preset="alpaca", num_requests=20, workers=1)
    assert df.status.tolist() == ["ok"] * 4, df.error.tolist()
    assert df.fleet_replicas.tolist() == [1, 1, 2, 2]
    assert df.fleet_routed.tolist() == ["20", "20", "10 10", "10 10"]     # round-robin halves 20
    assert df.cpu_kv_capacity_blocks.notna().tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="replicas"):                    # refused before any run
        kvsim.run_sweep({"replicas": [0]}, preset="alpaca", num_requests=5, workers=1)
    with pytest.raises(ValueError, match="--router 'random'"):           # an unknown router too (issue 40)
        kvsim.run_sweep({"replicas": [2], "router": ["random"]}, preset="alpaca", num_requests=5, workers=1)
