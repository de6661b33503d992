"""`kvsim run` and `kvsim compare` end to end through typer's runner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "traces" / "tiny.jsonl"
runner = CliRunner()


def test_run_writes_summary_config_and_tables(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", str(TINY), "--kv-gib", "1", "--out", str(out), "--json",
                              str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "finished / total" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads((tmp_path / "s.json").read_text())
    requests = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    assert summary["requests_total"] == len(requests) == sum(1 for _ in TINY.open())
    assert summary["engine_steps"] == len(steps)
    assert list(requests.columns[:9]) == ["id", "arrival_s", "admitted_s", "first_token_s", "finished_s",
                                          "prompt_tokens", "output_tokens", "n", "preemptions"]
    total = steps.token_states + steps.reserved + steps.internal_fragmentation + \
        steps.external_fragmentation + steps.free
    assert (total == summary["kv"]["capacity_tokens"]).all()
    config = json.loads((out / "config.json").read_text())
    assert config["deployment"]["model"]["name"] == "opt-13b"
    assert config["cache"]["kv_gib"] == 1


def test_summary_agrees_with_its_tables_by_the_documented_definitions(tmp_path):
    """The summary's metrics recomputed from requests.csv and steps.csv as DESIGN.md defines them:
    latencies from arrival, duration to the end of the last step, memory fractions weighted by step
    duration (the real cost model's steps differ in length), batch size averaged per step."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", str(TINY), "--kv-gib", "1", "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    req, steps = pd.read_csv(out / "requests.csv"), pd.read_csv(out / "steps.csv")
    done = req[req.status == "finished"]
    assert len(done) == 10 and steps.duration_s.nunique() > 3
    for key, values in (("ttft_s", done.first_token_s - done.arrival_s), ("e2e_s", done.finished_s - done.arrival_s)):
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        assert s[key] == pytest.approx({"p50": p50, "p90": p90, "p99": p99, "mean": values.mean()}, rel=1e-9)
    duration = steps.time_s.iloc[-1] + steps.duration_s.iloc[-1]
    assert s["duration_s"] == pytest.approx(duration, rel=1e-12)
    assert s["throughput_rps"] == pytest.approx(10 / duration, rel=1e-12)
    assert s["mean_batch_size"] == pytest.approx(steps.running.mean(), rel=1e-12)
    cap, w = s["kv"]["capacity_tokens"], steps.duration_s / steps.duration_s.sum()
    for column, fraction in s["kv"]["mean_fraction"].items():
        assert fraction == pytest.approx((steps[column] * w).sum() / cap, rel=1e-9, abs=1e-12)
    allocated = steps.token_states + steps.reserved + steps.internal_fragmentation
    assert s["kv"]["peak_allocated_fraction"] == pytest.approx(allocated.max() / cap, rel=1e-12)


def test_run_is_deterministic_across_processes(tmp_path):
    """The same run in this process and in a fresh interpreter with another string-hash seed (set and
    dict-of-str orders change with it) writes the same summary, prefix caching included."""
    args = ["run", str(TINY), "--kv-gib", "1", "--quiet", "--prefix-caching", "--json"]
    res = runner.invoke(app, args + [str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "kvsim.cli.app", *args, str(tmp_path / "b.json")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b and a["prefix_cache_hit_tokens"] > 0


def test_compare_runs_all_five_configurations(tmp_path):
    res = runner.invoke(app, ["compare", str(TINY), "--kv-gib", "2", "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    summaries = json.loads((tmp_path / "c.json").read_text())
    assert list(summaries) == ["paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle", "static"]
    frac = summaries["contiguous-max"]["kv"]["mean_fraction"]
    assert frac["internal_fragmentation"] > summaries["paged"]["kv"]["mean_fraction"]["internal_fragmentation"]
    assert summaries["contiguous-oracle"]["kv"]["mean_fraction"]["internal_fragmentation"] == 0


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--gpu", "tpu-v9"], "unknown GPU 'tpu-v9'"),
    (["--kv-gib", "-1"], "--kv-gib must be positive"),
    (["--calibration", "/nonexistent/cal.json"], "cal.json"),
    (["--kv-gib", "inf"], "--kv-gib must be positive and finite, got inf"),
    (["--kv-gib", "nan"], "--kv-gib must be positive and finite, got nan"),
    # vllm-v1 on an A100-40GB budgets 2,048 tokens: test_specs' 12,520 slots + 1,536 (its reserve arithmetic)
    (["--block-size", "1000000"], "--block-size 1000000 is larger than the whole KV cache (14056 token slots)"),
    (["--num-blocks", str(10**17)], "--num-blocks 100000000000000000 x --block-size 16: 1.6e+18 KV token slots"),
])
def test_bad_values_give_a_clear_message_and_exit_2(args, message):
    res = runner.invoke(app, ["run", str(TINY), *args])
    assert res.exit_code == 2
    assert message in res.output


def test_bad_trace_names_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n'
                   '{"arrival_s": 1, "prompt_tokens": -5, "output_tokens": 3}\n')
    res = runner.invoke(app, ["run", str(bad)])
    assert res.exit_code == 2
    assert "bad.jsonl:2" in res.output and "prompt_tokens" in res.output


def test_unknown_enum_flag_is_refused():
    res = runner.invoke(app, ["run", str(TINY), "--allocator", "buddy"])
    assert res.exit_code == 2
    assert "Invalid value for '--allocator'" in res.output and "'buddy'" in res.output
