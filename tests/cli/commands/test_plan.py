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
               "--slo", "ttft_p99=1", "--workers", "1", "--max-span", "30", "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    out = json.loads((tmp_path / "c.json").read_text())["rate"]
    assert "highest rate meeting ttft_p99 <= 1" in r.output and f"{out['rate_rps']:.3g} req/s" in r.output
    assert f"the knee lies below {out['knee_below_rps']:.3g} req/s" in r.output
    assert out["rate_rps"] < out["knee_below_rps"] and out["judged_on_s"] == 30
    words = " ".join(r.output.split())          # (rich folds long lines)
    assert " ".join(out["limited_by"].split()) in words and len(out["curve"]) >= 3


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


def test_gpus_for_sizes_at_the_smallest_tp_that_holds_the_weights(tmp_path):
    """The README's example: Llama-2-70B's 138 GB of bf16 weights do not fit one A100-80GB (79.25 GiB x
    0.9 = 71.3 GiB), half of them (64.3 GiB) plus the 3 GiB activation reserve fit two, so without --tp
    the single-replica figures are at TP 2 (said in a note) instead of an error."""
    out = tmp_path / "c.json"
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-2-70b", "--gpu", "a100-80gb", "--preset", "alpaca",
                                   "--slo", "ttft_p99=2", "--gpus-for", "20", "--duration", "20", "--max-runs", "3",
                                   "--tp-options", "1,2", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "at --tp 2, the smallest of 1,2 whose GPUs hold the weights" in res.output
    gpus = json.loads(out.read_text())["gpus"]
    assert [(g["tp"], g["fits"]) for g in gpus] == [(1, False), (2, True)]


def test_gpus_for_refuses_a_fixed_kv_size():
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-2-7b", "--slo", "ttft_p99=2", "--gpus-for", "5",
                                   "--kv-gib", "12"])
    assert res.exit_code == 2 and "--gpus-for sizes each TP degree's KV cache" in res.output


def test_gpus_for_table_prints_each_note_whole_on_a_narrow_terminal():
    """The note column folds instead of cutting its text at 60 characters (issue 22)."""
    import io

    import pandas as pd
    from rich.console import Console

    from kvsim.cli.commands.plan import _print_gpus
    note = "the weights (130.4 GiB per GPU) do not fit one A100-80GB's 71.3 GiB budget at TP 1"
    df = pd.DataFrame([{"tp": 1, "fits": False, "max_rate_rps": None, "replicas": None, "gpus": None,
                        "limited_by": "-", "note": note, "best": False},
                       {"tp": 2, "fits": True, "max_rate_rps": 2.5, "replicas": 8.0, "gpus": 16.0,
                        "limited_by": "compute", "note": "", "best": True}])
    out = io.StringIO()
    _print_gpus(Console(file=out, width=80), df, 20.0)
    text = "".join(ch for ch in out.getvalue() if ch.isalnum() or ch in ".()")
    assert "".join(ch for ch in note if ch.isalnum() or ch in ".()") in "".join(text.split())
