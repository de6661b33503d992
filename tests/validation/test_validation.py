"""kvsim validate / calibrate (issue 37): workload regeneration, metric definitions, errors, the fit's
solver and the calibrated cost, bad input. Every expected number is worked out by hand in the comment
beside it."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.cost.adjusted import AdjustedCost
from kvsim.cost.roofline import ConstantCost
from kvsim.validation.bench import bench_arrivals, random_lengths, read_bench_result
from kvsim.validation.client_path import ClientPath
from kvsim.validation.compare import ape, medians, rows
from kvsim.validation.fit_rows import Row, identifiable, solve
from kvsim.validation.measured import read_run
from kvsim.validation.metrics import summarize
from kvsim.validation.replay import replay
from kvsim.validation.workload import arrivals, quantile_lengths, shared_prefix

runner = CliRunner()
#: A tiny Llama-shaped model (2 layers, hidden 256): runs in milliseconds.
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 2048,
      "vocab_size": 1000, "torch_dtype": "bfloat16"}


def test_constant_stages_run_back_to_back():
    # 2 req/s for 3 s: 6 sends at 0, .5, ..., 2.5; then 4 req/s for 1 s from 3 s: 3, 3.25, 3.5, 3.75
    t, stage = arrivals("constant", [{"rate": 2, "duration_s": 3}, {"rate": 4, "duration_s": 1}])
    assert t.tolist() == [0, .5, 1, 1.5, 2, 2.5, 3, 3.25, 3.5, 3.75]
    assert stage.tolist() == [0] * 6 + [1] * 4


def test_poisson_arrivals_have_the_stage_rate():
    t, _ = arrivals("poisson", [{"rate": 50, "duration_s": 100}], seed=1)
    assert len(t) == 5000 and t[0] == 0
    assert np.diff(t).mean() == pytest.approx(1 / 50, rel=0.05)      # 5,000 gaps: ~1.4 % standard error


def test_quantile_lengths_read_the_curve_at_mid_ranks():
    # min 100, max 200, 4 prompts: at 0.125, 0.375, 0.625, 0.875 -> 112.5, 137.5, 162.5, 187.5 (half to even)
    assert quantile_lengths({"min": 100, "max": 200, "mean": 150}, 4).tolist() == [112, 138, 162, 188]


def _shared_prefix(mean=48.0):
    return {"generator": "inference-perf shared_prefix", "params": {"num_groups": 2, "num_prompts_per_group": 3,
            "system_prompt_len": 32, "question_len": 16, "output_len": 5},
            "arrival": {"type": "constant", "stages": [{"rate": 1, "duration_s": 12}]},
            "measured_prompt_len": [{"min": mean, "max": mean, "mean": mean}]}


def test_shared_prefix_resends_each_prompt_and_shares_the_system_blocks_within_a_group():
    trace, stage = shared_prefix(_shared_prefix(), block_size=16)
    assert len(trace) == 12 and set(stage) == {0}        # 1 req/s for 12 s
    assert set(trace.prompt_tokens) == {48} and set(trace.output_tokens) == {5}
    ids = [tuple(trace.prompt_block_ids(i, 16)) for i in range(12)]
    assert all(len(b) == 3 for b in ids)                 # 48 tokens = 3 full blocks
    assert all(ids[i] == ids[i + 6] for i in range(6))   # request i and i + 6 send the same prompt
    assert len(set(ids[:6])) == 6                        # six different prompts
    firsts = {b[:2] for b in ids}                        # 32 system tokens = 2 shared blocks per group
    assert len(firsts) == 2 and len({b[2] for b in ids}) == 6


def test_shared_prefix_scales_the_system_prompt_by_the_retokenization_factor():
    # measured mean 72 over 32 + 16 = 48 configured: factor 1.5, system part 48 tokens = 3 full blocks
    trace, _ = shared_prefix(_shared_prefix(mean=72.0), block_size=16)
    ids = [tuple(trace.prompt_block_ids(i, 16)) for i in range(6)]
    assert len({b[:3] for b in ids}) == 2 and len({b[3] for b in ids}) == 6


def test_metrics_follow_the_client_definitions():
    # two requests sent at 0 and 1 s, first token 0.1 / 1.3 s, done 1.1 / 2.3 s, 11 tokens; path 10 ms:
    # TTFT 110, 310 -> 210 ms; e2e 1110, 1310 -> 1210 ms; e2e - TTFT = 1000 ms over 10 gaps = 100 ms;
    # 2 requests over 2.3 s = 0.8696 req/s
    got = summarize(np.array([0.0, 1.0]), np.array([0.1, 1.3]), np.array([1.1, 2.3]), np.array([11, 11]), 0.01)
    assert got["ttft_ms"] == pytest.approx(210) and got["e2e_ms"] == pytest.approx(1210)
    assert got["itl_ms"] == pytest.approx(100) and got["tpot_ms"] == pytest.approx(100)
    assert got["throughput_rps"] == pytest.approx(2 / 2.3)
    # inference-perf re-counts 6 tokens: its ITL is 1000 / (6 - 1) = 200 ms; TPOT keeps the 10 real gaps
    counted = summarize(np.array([0.0, 1.0]), np.array([0.1, 1.3]), np.array([1.1, 2.3]), np.array([11, 11]), 0.01, 6.0)
    assert counted["itl_ms"] == pytest.approx(200) and counted["tpot_ms"] == pytest.approx(100)


def test_client_path_applies_to_http_clients_only():
    path = ClientPath(0.003, 3e-6)
    assert path.seconds(1000.0, "inference-perf") == pytest.approx(0.006)     # 3 ms + 1000 x 3 us
    assert path.seconds(1000.0, "vllm-engine") == 0.0


def test_ape_and_medians():
    assert ape(200.0, 250.0) == pytest.approx(25.0) and ape(200.0, None) is None and ape(0.0, 1.0) is None
    table = [{"metric": "e2e_ms", "ape_pct": v} for v in (10.0, 30.0, 20.0)] + [{"metric": "ttft_ms", "ape_pct": None}]
    assert medians(table, ("e2e_ms", "ttft_ms")) == {"e2e_ms": 20.0, "ttft_ms": None}


def _run_folder(tmp_path: Path, **server_changes) -> Path:
    run = tmp_path / "tiny-run"
    run.mkdir()
    server = {"model": "tiny", "hf_config": HF, "gpu": "H100-SXM-80GB", "num_gpus": 1, "tensor_parallel_size": 1,
              "flags": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 16,
                        "gpu_memory_utilization": 0.9, "enable_prefix_caching": True, "max_model_len": 1024}}
    server.update(server_changes)
    (run / "server.json").write_text(json.dumps(server))
    (run / "workload.json").write_text(json.dumps(_shared_prefix()))
    stage = {"stage_index": -1, "count": 12, "ttft_ms": {"mean": 20.0}, "e2e_ms": {"mean": 100.0},
             "itl_ms": {"mean": 25.0}, "throughput": {"requests_per_sec": 1.0}, "output_len": {"mean": 4.2}}
    (run / "measured.json").write_text(json.dumps({"summary": stage, "stages": []}))
    return run


def test_error_table_of_a_tiny_made_up_run(tmp_path):
    run = read_run(_run_folder(tmp_path))
    assert run.client == "inference-perf" and run.measured[-1]["tpot_ms"] == pytest.approx((100 - 20) / 4)
    rep = replay(run)
    assert not rep.skip and rep.sim["finished"] == 12
    table = {r["metric"]: r for r in rows([rep])}
    for metric, row in table.items():
        assert row["ape_pct"] == pytest.approx(abs(row["predicted"] - row["measured"]) / row["measured"] * 100)
    # the predicted ITL divides the same e2e - TTFT by the client's count (4.2 - 1), TPOT by the 4 real gaps
    pred = rep.predicted[-1]
    assert pred["itl_ms"] * 3.2 == pytest.approx(pred["tpot_ms"] * 4)
    assert rep.sim["prefix_cache_hit_rate"] > 0.3        # 6 of 12 requests re-send a cached prompt


def test_cli_validate_json_is_strict_and_names_the_definitions(tmp_path):
    out, png = tmp_path / "v.json", tmp_path / "v.png"
    res = runner.invoke(app, ["validate", str(_run_folder(tmp_path)), "--json", str(out), "--figure", str(png),
                              "--quiet"])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert doc["format"] == "kvsim-validation/1" and "inference-perf" in doc["metric_definitions"]
    assert set(doc["median_ape_pct"]) == {"e2e_ms", "ttft_ms", "itl_ms", "throughput_rps"}


@pytest.mark.parametrize("change, named", [
    ({"flags": {"block_size": 16}}, "max_num_seqs"),
    ({"num_gpus": 4}, "num_gpus"),
    ({"hf_config": None}, "hf_config"),
])
def test_bad_server_fields_exit_2_naming_the_field(tmp_path, change, named):
    res = runner.invoke(app, ["validate", str(_run_folder(tmp_path, **change))])
    assert res.exit_code == 2 and named in res.output and "Traceback" not in res.output


def test_missing_measured_file_exits_2(tmp_path):
    run = _run_folder(tmp_path)
    (run / "measured.json").unlink()
    res = runner.invoke(app, ["validate", str(run)])
    assert res.exit_code == 2 and "measured.json" in res.output


def test_offloading_connector_stores_every_block():
    from kvsim.validation.server import server_flags
    flags = {"max_num_seqs": 8, "max_num_batched_tokens": 512,
             "kv_offloading": {"connector": "OffloadingConnector", "cpu_gib": 8}}
    got = server_flags({"flags": flags}, "server.json")
    assert got["cpu_kv_gib"] == 8 and got["cpu_kv_policy"] == "store-all"
    assert server_flags({"flags": {**flags, "gpu_memory_utilization": "0.85 (set)"}}, "s")["gpu_mem_util"] == 0.85


def test_unknown_gpu_is_reported_not_replayed(tmp_path):
    rep = replay(read_run(_run_folder(tmp_path, gpu="RTX-9999")))
    assert rep.skip.startswith("no such GPU: RTX-9999") and rep.predicted == {}


def test_bench_serve_result_with_detailed_lengths(tmp_path):
    doc = {"request_rate": "inf", "num_prompts": 3, "completed": 3, "mean_ttft_ms": 30.0, "mean_tpot_ms": 5.0,
           "mean_itl_ms": 5.0, "mean_e2el_ms": 80.0, "request_throughput": 2.0,
           "input_lens": [100, 200, 300], "output_lens": [10, 11, 12]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    run = read_bench_result(path, {})
    assert run.client == "vllm-bench-serve" and run.measured[-1]["e2e_ms"] == 80.0
    from kvsim.validation.bench import bench_trace
    trace, _ = bench_trace(run.workload, 0, 1.0, "bench.json")
    assert trace.arrival_s.tolist() == [0, 0, 0] and trace.prompt_tokens.tolist() == [100, 200, 300]


def test_bench_random_dataset_lengths_and_gamma_arrivals():
    # range ratio 0: every prompt is prefix + input_len, every output output_len
    inputs, outputs = random_lengths(5, 128, 64, 0.0, 10, seed=3)
    assert inputs.tolist() == [138] * 5 and outputs.tolist() == [64] * 5
    inputs, _ = random_lengths(2000, 100, 10, 0.5, 0, seed=3)     # [50, 150]
    assert inputs.min() >= 50 and inputs.max() <= 150
    t = bench_arrivals(4000, 10.0, 0.5, seed=1)                     # gamma, mean gap 1 / rate
    assert t[0] == 0 and np.diff(t).mean() == pytest.approx(0.1, rel=0.06)


def test_solver_recovers_known_parameters_and_respects_bounds():
    # tpot = 0.8 K + 2e-3 + 1e-5 n (TP 1 rows): the solver finds exactly these
    rows_ = [Row("r", i, (k, 0.0, 1.0, n), 0.8 * k + 2e-3 + 1e-5 * n)
             for i, (k, n) in enumerate([(0.01, 10), (0.02, 40), (0.015, 80), (0.03, 20), (0.025, 60), (0.012, 100)])]
    free, why = identifiable(rows_)
    assert "allreduce_delta_s" not in free and "TP 1" in why["allreduce_delta_s"]
    got = solve(rows_, free, {"gpu_time_scale": 1.0, "allreduce_delta_s": 0.0, "cpu_step_s": 0.0, "cpu_seq_s": 0.0})
    assert got["gpu_time_scale"] == pytest.approx(0.8) and got["cpu_step_s"] == pytest.approx(2e-3)
    assert got["cpu_seq_s"] == pytest.approx(1e-5, rel=1e-6)
    # a target needing a negative CPU time pins it at its bound 0
    neg = [Row("r", i, (k, 0.0, 1.0, 1.0), k - 1e-3) for i, k in enumerate([0.01, 0.02, 0.03])]
    got = solve(neg, ["gpu_time_scale", "cpu_step_s"], {"gpu_time_scale": 1.0, "allreduce_delta_s": 0.0,
                                                         "cpu_step_s": 0.0, "cpu_seq_s": 0.0})
    assert got["cpu_step_s"] == 0.0


def test_two_rows_fit_one_parameter_only():
    free, why = identifiable([Row("r", 0, (0.01, 0, 1, 5), 0.01), Row("r", 1, (0.02, 0, 1, 9), 0.02)])
    assert free == ["gpu_time_scale"] and "too few" in why["cpu_step_s"]


def test_adjusted_cost_scales_kernel_time_and_not_cpu_time():
    cost = AdjustedCost(ConstantCost(0.01), 2.0, 1e-3)
    assert cost.step_time(0, 0, 4, 100) == pytest.approx(0.021)                  # 2 x 10 ms + 1 ms
    assert cost.decode_step_times(4, 100, 2, plus_s=5e-4) == pytest.approx([0.0215, 0.0215])


def test_calibrated_profile_file_reaches_the_cost_model(tmp_path):
    from kvsim.cost.profiles import CalibratedProfile, get_profile
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"base": "vllm-v1", "cpu_step_s": 1e-3, "cpu_seq_s": 0.0, "gpu_time_scale": 0.5,
                                "allreduce_delta_s": 0.0, "client_path": {"fixed_s": 0.02}}))
    prof = get_profile(str(path))
    assert isinstance(prof, CalibratedProfile) and prof.gpu_time_scale == 0.5 and prof.cpu_step_s == 1e-3
    import kvsim
    from kvsim.engine.build import build_run
    tr = kvsim.Trace.from_arrays([0.0], [32], [4])
    base = build_run(tr, kvsim.make_config(model="llama-2-7b", gpu="h100-80gb")).cost
    half = build_run(tr, kvsim.make_config(model="llama-2-7b", gpu="h100-80gb", engine_profile=str(path))).cost
    assert half.step_time(0, 0, 8, 800) == pytest.approx(0.5 * base.step_time(0, 0, 8, 800))
    from kvsim.validation.run_set import profile_and_path
    assert profile_and_path(str(path))[1].fixed_s == 0.02
    assert math.isfinite(prof.cpu_seconds(3))
