"""Sweeps (local processes, Ray, resume, failed rows), the rate search and the GPU search."""

import json

import pandas as pd
import pytest

import kvsim
from kvsim.planning.rate.search import limiting_factor, meets, parse_slo, slo_value
from kvsim.planning.sweep.runner import grid_points, run_id

SMALL = {"kv_gib": 12, "num_requests": 20}


def test_grid_points_order_and_errors():
    pts = grid_points({"block-size": [8, 16], "allocator": ["paged", "contiguous"]}, {"kv_gib": 12})
    assert [(p["block_size"], p["allocator"]) for p in pts] == [
        (8, "paged"), (8, "contiguous"), (16, "paged"), (16, "contiguous")]
    assert all(p["kv_gib"] == 12 for p in pts)
    assert run_id(pts[0]) == run_id(dict(reversed(list(pts[0].items())))) != run_id(pts[1])
    with pytest.raises(ValueError, match="empty grid: give at least one"):
        grid_points({})
    with pytest.raises(ValueError, match="empty grid: flag 'block_size' has no values"):
        grid_points({"block_size": []})
    with pytest.raises(ValueError, match="unknown flag 'blocksize' in the grid"):
        grid_points({"blocksize": [8]})


def test_sweep_local_processes_records_failures_and_resumes(tmp_path):
    out = tmp_path / "sw"
    grid = {"block_size": [0, 16], "allocator": ["paged", "contiguous"]}
    df = kvsim.run_sweep(grid, SMALL, preset="alpaca", workers=2, out_dir=out)
    assert df.block_size.tolist() == [0, 0, 16, 16]                     # grid order, not finish order
    assert df.status.tolist() == ["error", "error", "ok", "ok"]
    assert df.error[0] == "ValueError: block size must be >= 1 token, got 0"
    assert df.requests_finished[2:].tolist() == [20, 20]
    assert set(df.kv_capacity_tokens[2:]) == {15728} and df.model[3] == "opt-13b"
    same = kvsim.simulate(kvsim.generate_trace("alpaca", num_requests=20, seed=0), kv_gib=12,
                          allocator="contiguous").summary
    assert df.normalized_latency_s_per_token[3] == same["normalized_latency_s_per_token"]
    for table in (pd.read_parquet(out / "results.parquet"), pd.read_csv(out / "results.csv")):
        assert table.status.tolist() == df.status.tolist() and len(table.columns) == len(df.columns)
    assert len((out / "rows.jsonl").read_text().splitlines()) == 4
    with pytest.raises(ValueError, match="already holds a sweep"):
        kvsim.run_sweep(grid, SMALL, preset="alpaca", workers=1, out_dir=out)
    grid["block_size"] = [0, 16, 32]
    again = kvsim.run_sweep(grid, SMALL, preset="alpaca", workers=1, out_dir=out, resume=True)
    lines = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    # the two finished points are kept; the two failed ones and the two new ones run
    assert len(lines) == 4 + 4 and len(again) == 6
    assert again.status.tolist() == ["error", "error", "ok", "ok", "ok", "ok"]
    assert again.wall_s[2] == df.wall_s[2]                                  # not rerun


def test_sweep_rate_rescales_a_trace():
    df = kvsim.run_sweep({"rate": [0.5, 2.0]}, {"kv_gib": 12}, trace="traces/tiny.jsonl", workers=1)
    assert df.status.tolist() == ["ok", "ok"]
    assert df.duration_s[0] > df.duration_s[1]


def test_sweep_on_local_ray(tmp_path):
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")
    df = kvsim.run_sweep({"block_size": [16, 32]}, SMALL, preset="alpaca", ray=True, workers=2,
                         out_dir=tmp_path / "r")
    local = kvsim.run_sweep({"block_size": [16, 32]}, SMALL, preset="alpaca", workers=1)
    assert df.status.tolist() == ["ok", "ok"]
    cols = ["block_size", "requests_finished", "normalized_latency_s_per_token", "kv_num_blocks"]
    assert df[cols].values.tolist() == local[cols].values.tolist()


def test_sweep_ray_address_that_does_not_answer(tmp_path):
    with pytest.raises(ValueError, match="Ray address 127.0.0.1:9 does not answer"):
        kvsim.run_sweep({"block_size": [16]}, SMALL, preset="alpaca", ray_address="127.0.0.1:9",
                        out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_parse_slo_and_meets():
    assert parse_slo(["ttft_p99=2", "normalized_latency=0.1"]) == {"ttft_p99": 2.0, "normalized_latency": 0.1}
    for bad, msg in (("ttft=2", "unknown metric"), ("ttft_p99", "expected metric=seconds"),
                     ("tpot_p50=x", "must be a number"), ("e2e_p90=0", "must be > 0")):
        with pytest.raises(ValueError, match=msg):
            parse_slo([bad])
    row = {"status": "ok", "ttft_s_p99": 1.5, "normalized_latency_s_per_token": 0.2, "tpot_s_p50": None}
    assert slo_value(row, "ttft_p99") == 1.5 and slo_value(row, "normalized_latency") == 0.2
    assert meets(row, {"ttft_p99": 2}) and not meets(row, {"ttft_p99": 1})
    assert not meets(row, {"tpot_p50": 1})                   # no finished request: not met
    assert not meets({**row, "status": "error"}, {"ttft_p99": 2})


def test_limiting_factor():
    base = {"limited_by_kv_memory": 0.1, "limited_by_max_num_seqs": 0.6, "limited_by_token_budget": 0.0}
    assert limiting_factor(base) == "max_num_seqs"
    # the largest limit that held requests back (issue 41: not "compute" for the 85 % nothing explains)
    assert limiting_factor({**base, "limited_by_max_num_seqs": 0.05}) == "kv_memory"
    idle = {**base, "limited_by_kv_memory": 0.0, "limited_by_max_num_seqs": 0.0}
    assert limiting_factor({**idle, "gpu_busy_fraction": 0.95}) == "compute"
    assert limiting_factor({**idle, "gpu_busy_fraction": 0.5}) == "latency"
    assert limiting_factor({"kv_peak_allocated_fraction": 1.0}) == "kv_memory"
    # contiguous: 81 % allocated at peak, but only 4 % truly free (the rest fragmented)
    assert limiting_factor({"kv_peak_allocated_fraction": 0.81, "kv_mean_fraction_free": 0.04}) == "kv_memory"
    assert limiting_factor({"kv_peak_allocated_fraction": 0.5, "kv_mean_fraction_free": 0.4, "max_batch_size": 8,
                            "max_num_seqs": 8}) \
        == "max_num_seqs"


def test_max_rate_brackets_the_knee():
    slo = {"ttft_p99": 1.0}
    r = kvsim.max_rate(slo, preset="alpaca", duration_s=30, model="opt-13b", kv_gib=1, rel_tol=0.2,
                       max_span_s=30)
    curve = r.curve.set_index("rate")
    assert curve.loc[r.rate_rps, "meets_slo"] and not r.knee["meets_slo"]
    assert r.rate_rps < r.knee["rate"] <= r.rate_rps * 1.2
    assert r.knee["ttft_s_p99"] > 1.0 and list(curve.index) == sorted(curve.index)
    assert r.limit_key in ("kv_memory", "max_num_seqs", "token_budget", "compute", "latency")
    assert r.limited_by.startswith(r.limit_key + ": ")
    with pytest.raises(ValueError, match="no rate meets the SLO ttft_p99 <= 1e-06"):
        kvsim.max_rate({"ttft_p99": 1e-6}, preset="alpaca", duration_s=10, kv_gib=12, max_runs=3)


def test_gpus_for_rate_skips_tp_degrees_the_weights_do_not_fit():
    # OPT-66B: 131 GB of weights; 36 GB usable per A100-40GB leaves nothing at TP 1 or 2
    df = kvsim.gpus_for_rate(0.5, {"normalized_latency": 5}, model="opt-66b", gpu="a100-40gb",
                             preset="alpaca", duration_s=20, max_runs=3).set_index("tp")
    assert not df.fits[1] and not df.fits[2] and "no memory for the KV cache" in df.note[1]
    assert df.fits[4] and df.replicas[4] == 1 and df.gpus[4] == 4 and df.best[4]
    assert df.note[8].startswith("not tried")
    with pytest.raises(ValueError, match="drop --kv-gib"):
        kvsim.gpus_for_rate(1, {"ttft_p99": 1}, kv_gib=12)


def test_rate_search_replays_one_draw_of_requests():
    from kvsim.planning.rate.search import BASE_BLOCK, _base_trace

    short, long = _base_trace("alpaca", 10.0, 3), _base_trace("alpaca", BASE_BLOCK * 1.5, 3)
    assert len(short) == BASE_BLOCK and len(long) == 2 * BASE_BLOCK
    assert long.prompt_tokens[:BASE_BLOCK].tolist() == short.prompt_tokens.tolist()
    assert long.arrival_s[:BASE_BLOCK].tolist() == short.arrival_s.tolist()
    # each rate runs the same requests, rescaled and cut at the duration
    # (max_span_s=20: no rate is run again on a longer trace)
    r = kvsim.max_rate({"ttft_p99": 1.0}, preset="alpaca", duration_s=20, kv_gib=1, rel_tol=0.3, max_span_s=20)
    assert (r.curve.requests_total.diff().dropna() >= 0).all()
