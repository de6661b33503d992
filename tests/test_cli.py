"""`kvsim run` and `kvsim compare` end to end through typer's runner."""

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app

ROOT = Path(__file__).resolve().parents[1]
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


def test_run_is_deterministic(tmp_path):
    args = ["run", str(TINY), "--kv-gib", "1", "--quiet", "--json"]
    runner.invoke(app, args + [str(tmp_path / "a.json")])
    runner.invoke(app, args + [str(tmp_path / "b.json")])
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


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
    (["--block-size", "1000000"], "--block-size 1000000 is larger than the whole KV cache (12520 token slots)"),
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
    assert res.exit_code != 0
