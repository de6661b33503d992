"""`kvsim capacity`, `kvsim sweep` and `kvsim trace convert --rate/--time-scale` through CliRunner."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.trace.jsonl import read_jsonl

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_capacity_static_table_and_json(tmp_path):
    r = invoke("capacity", "--model", "opt-13b", "--kv-gib", "12", "--preset", "alpaca", "--json",
               tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    assert "15,728" in r.output and "983" in r.output and "7.68" in r.output
    rows = {x["allocator"]: x for x in json.loads((tmp_path / "c.json").read_text())["static"]}
    assert rows["paged"]["num_blocks"] == 983 and rows["contiguous-max"]["max_concurrency"] == 7


def test_capacity_rate_search(tmp_path):
    r = invoke("capacity", "--kv-gib", "1", "--preset", "alpaca", "--duration", "30", "--rel-tol", "0.2",
               "--slo", "ttft_p99=1", "--workers", "1", "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    out = json.loads((tmp_path / "c.json").read_text())["rate"]
    assert "highest rate meeting ttft_p99 <= 1" in r.output and f"{out['rate_rps']:.3g} req/s" in r.output
    assert out["limited_by"] in r.output and len(out["curve"]) >= 3


def test_capacity_bad_input_exits_2():
    for args, msg in ((["--slo", "ttft_p99=0.000001", "--duration", "5", "--max-runs", "2"], "no rate meets"),
                      (["--slo", "latency=1"], "unknown metric"),
                      (["--gpus-for", "3"], "--gpus-for needs at least one --slo"),
                      (["--model", "gpt-9"], "unknown model 'gpt-9'"),
                      (["--set", "bogus=1"], "unknown run flag 'bogus'")):
        r = invoke("capacity", "--kv-gib", "12", "--preset", "alpaca", *args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and "Traceback" not in r.output


def test_sweep_command(tmp_path):
    out = tmp_path / "s"
    r = invoke("sweep", "--preset", "alpaca", "--grid", "block_size=16,32", "--grid", "allocator=paged",
               "--set", "kv_gib=12", "--set", "num_requests=10", "--workers", "1", "-o", out)
    assert r.exit_code == 0, r.output
    assert "2 runs, 0 failed" in r.output
    df = pd.read_parquet(out / "results.parquet")
    assert df.block_size.tolist() == [16, 32] and df.kv_num_blocks.tolist() == [983, 491]


def test_sweep_bad_input_exits_2(tmp_path):
    for args, msg in ((["--grid", "block_size="], "empty grid"),
                      ([], "empty grid: give at least one --grid"),
                      (["--grid", "blok=1"], "unknown flag 'blok' in the grid"),
                      (["--grid", "block_size=8", "--ray-address", "127.0.0.1:9"], "does not answer"),
                      ([tmp_path / "missing.jsonl", "--grid", "block_size=8"], "missing.jsonl")):
        first = [] if args and str(args[0]).endswith(".jsonl") else ["--preset", "alpaca"]
        r = invoke("sweep", *first, *args, "-o", tmp_path / "bad")
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and "Traceback" not in r.output
    assert not (tmp_path / "bad").exists()


def test_trace_convert_rescales_timestamped_traces(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"arrival_s": t, "prompt_tokens": 5, "output_tokens": 2}) + "\n"
                           for t in (0.0, 3.0, 6.0, 9.0)))
    r = invoke("trace", "convert", src, "-o", tmp_path / "r.jsonl", "--rate", "2")
    assert r.exit_code == 0, r.output
    # 4 requests over 9 s is 4/9 req/s; at 2 req/s they span 2 s
    assert read_jsonl(tmp_path / "r.jsonl").arrival_s.tolist() == pytest.approx([0.0, 2 / 3, 4 / 3, 2.0])
    r = invoke("trace", "convert", src, "-o", tmp_path / "s.jsonl", "--time-scale", "0.5", "--max-duration", "3")
    assert r.exit_code == 0, r.output
    assert read_jsonl(tmp_path / "s.jsonl").arrival_s.tolist() == [0.0, 1.5]
    r = invoke("trace", "convert", src, "-o", tmp_path / "x.jsonl", "--rate", "2", "--time-scale", "2")
    assert r.exit_code == 2 and "not both" in r.output
