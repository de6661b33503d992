"""One table of run flags and where each applies (`kvsim.planning.flag_table`), read by `run`, `report`,
`sweep` and the Python API; one cap on per-unit counts (issue 40, families 1 and 3). Each case was
accepted and silently ignored (or ran unbounded) before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.fleet.config import MAX_UNITS
from kvsim.planning.flag_table import ROWS, TABLE, Setup, check_flags
from kvsim.planning.runs import make_config
from kvsim.planning.sweep.grid import grid_points

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "traces" / "tiny.jsonl")
HYBRID = str(ROOT / "tests" / "data" / "hf_configs" / "gpt-oss-20b.json")
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["run", TINY, "--quiet", *args])


@pytest.mark.parametrize("args,named", [
    (["--replicas", "2", "--prefill-replicas", "1", "--decode-replicas", "1"], "--replicas"),
    (["--ttft-slo", "0"], "--ttft-slo"),
    (["--ttft-slo", "-1"], "--ttft-slo"),
    (["--tpot-slo", "nan"], "--tpot-slo"),
    (["--ttft-slo", "0.5"], "--ttft-slo"),            # a valid value that a colocated run ignores
    (["--kv-link", "pcie"], "--kv-link"),
    (["--prefill-tp", "2"], "--prefill-tp"),
    (["--router", "least-kv"], "--router"),
    (["--replicas", "2", "--router-cache-threshold", "0.5"], "--router-cache-threshold"),
    (["--replicas", "2", "--router", "least-kv", "--router-balance-abs", "3"], "--router-balance-abs"),
    (["--allocator", "contiguous", "--no-hybrid-kv-cache"], "--hybrid-kv-cache"),
    (["--reserve", "pow2"], "--reserve"),
    (["--placement", "first-fit"], "--placement"),
])
def test_run_refuses_a_flag_that_cannot_apply(args, named):
    res = _run(*args)
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and named in lines[0], res.output


def test_quantization_against_the_checkpoints_own_method():
    res = runner.invoke(app, ["run", TINY, "--quiet", "--model-config", HYBRID, "--gpu", "h200",
                              "--quantization", "awq"])
    assert res.exit_code == 2 and "mxfp4" in res.output and "--quantization" in res.output


def test_flags_that_apply_still_run():
    assert _run("--replicas", "2", "--router", "prefix-aware", "--router-cache-threshold", "0.5").exit_code == 0
    assert _run("--allocator", "contiguous", "--reserve", "pow2", "--placement", "first-fit").exit_code == 0
    one_seq = str(ROOT / "traces" / "alpaca_30rps_2min.jsonl")
    res = runner.invoke(app, ["run", one_seq, "--quiet", "--max-requests", "5", "--prefill-replicas", "1",
                              "--decode-replicas", "1", "--ttft-slo", "0.5", "--kv-link", "pcie"])
    assert res.exit_code == 0, res.output


def test_vllm_accepts_and_ignores_the_hybrid_switch_on_a_full_attention_model():
    res = _run("--no-hybrid-kv-cache")
    assert res.exit_code == 0 and "note: --no-hybrid-kv-cache has no effect" in res.output


@pytest.mark.parametrize("args", [["--replicas", "1000000"], ["--prefill-replicas", "1000000", "--decode-replicas", "1"],
                                  ["--prefill-replicas", "1", "--decode-replicas", str(MAX_UNITS + 1)]])
def test_one_cap_on_replicas_with_the_cap_in_the_message(args):
    res = _run(*args)
    assert res.exit_code == 2 and f"{MAX_UNITS:,}" in res.output, res.output


def test_report_uses_the_same_cap_and_refuses_fleet_flags_without_replicas(tmp_path):
    res = runner.invoke(app, ["report", TINY, "-o", str(tmp_path / "r"), "--replicas", str(MAX_UNITS + 1)])
    assert res.exit_code == 2 and f"{MAX_UNITS:,}" in res.output
    for args in (["--routers", "least-kv"], ["--ttft-slo", "1"], ["--kv-link", "pcie"]):
        res = runner.invoke(app, ["report", TINY, "-o", str(tmp_path / "r"), *args])
        assert res.exit_code == 2 and args[0] in res.output and "--replicas" in res.output, res.output
    res = runner.invoke(app, ["report", TINY, "-o", str(tmp_path / "r"), "--replicas", "2", "--kv-link", "pcie"])
    assert res.exit_code == 2 and "--kv-link needs --pd" in res.output


@pytest.mark.parametrize("grid,named", [("allocator=bogus", "allocator"), ("router=bogus", "router"),
                                        ("cpu_kv_gib=-1", "cpu_kv_gib"), ("router=least-kv", "router")])
def test_sweep_grid_values_are_checked_before_any_run(tmp_path, grid, named):
    out = tmp_path / "sw"
    res = runner.invoke(app, ["sweep", TINY, "--grid", grid, "-o", str(out)])
    assert res.exit_code == 2 and f"grid key {named}" in res.output, res.output
    assert not out.exists()


def test_grid_and_set_take_dtype_and_quantization_like_run():
    points = grid_points({"dtype": ["bfloat16", "float16"]}, {"quantization": "fp8"})
    assert [p["dtype"] for p in points] == ["bfloat16", "float16"]


def test_a_grid_key_that_applies_to_some_point_is_kept():
    points = grid_points({"replicas": [1, 2]}, {"router": "least-kv"})
    assert len(points) == 2


def test_python_api_checks_values_with_the_same_table():
    with pytest.raises(ValueError, match="unknown --allocator 'bogus'"):
        make_config(allocator="bogus")
    with pytest.raises(ValueError, match="--cpu-kv-gib -1"):
        make_config(cpu_kv_gib=-1)


def test_python_api_refuses_a_flag_that_cannot_apply():
    import kvsim
    tr = kvsim.generate_trace("alpaca", rate_rps=2, num_requests=3, seed=0)
    with pytest.raises(ValueError, match="--reserve pow2: only the contiguous allocator"):
        kvsim.simulate(tr, kv_gib=12, reserve="pow2")
    assert kvsim.simulate(tr, kv_gib=12, allocator="contiguous", reserve="pow2").summary["requests_finished"] == 3


def test_the_table_is_one_row_per_flag_and_every_refusal_says_why():
    assert len(TABLE) == len(ROWS)
    for row in ROWS:
        if row.applies is not TABLE["allocator"].applies:
            assert row.why, row.flag
    with pytest.raises(ValueError, match="--router least-kv: one engine has nothing to route"):
        check_flags({"router": "least-kv"}, Setup("single"))
    assert check_flags({"router": "least-kv"}, Setup("replicas")) == []


def test_json_is_strict_even_where_a_metric_is_undefined(tmp_path):
    from kvsim.files import strict_json
    text = strict_json({"x": float("nan"), "y": {"z": float("inf")}, "w": [1.0, float("-inf")]})
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["x"] is None and "NaN" in doc["x_null_reason"]
    assert doc["y"]["z"] is None and "Infinity" in doc["y"]["z_null_reason"]
    assert doc["w"] == [1.0, None] and "Infinity" in doc["w_null_reason"]


def test_a_grid_no_point_of_which_can_be_served_stops_before_any_run(tmp_path):
    out = tmp_path / "sw"
    res = runner.invoke(app, ["sweep", TINY, "--grid", "model=llama-2-70b", "-o", str(out)])
    assert res.exit_code == 2 and "no point of the grid can be served" in res.output, res.output
    assert "weights leave no memory" in res.output and not out.exists()


def test_a_grid_with_some_unservable_points_warns_up_front_and_keeps_failed_rows(tmp_path):
    res = runner.invoke(app, ["sweep", TINY, "--grid", "tp=1,3", "--set", "model=llama-3-8b", "--set", "gpu=h100-80gb",
                              "-o", str(tmp_path / "sw")])
    assert res.exit_code == 0 and "1 of 2 grid points cannot be served" in res.output, res.output
