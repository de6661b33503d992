"""Inputs that used to change an answer without a word (issue 21) are refused with one line naming the
flag, file or field: model config fields, calibration fits, sweep tables, trace flags that do not apply,
numbers out of range and work without a ceiling. Each case was accepted (or crashed) before.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.specs.hf.config import load_hf_config

runner = CliRunner()

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 8192,
         "vocab_size": 128256, "torch_dtype": "bfloat16"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}
BNB = {"quant_method": "bitsandbytes", "load_in_4bit": True}


@pytest.mark.parametrize("change, field", [
    ({"quantization_config": {**BNB, "load_in_4bit": "no"}}, "quantization_config.load_in_4bit"),
    ({"quantization_config": {**BNB, "load_in_8bit": 1}}, "quantization_config.load_in_8bit"),
    ({"quantization_config": {**GPTQ, "group_size": 0}}, "quantization_config.group_size"),
    ({"hidden_size": 4100}, "'hidden_size'"),                        # 4100 / 32 heads is not whole
    ({"num_key_value_heads": 5}, "'num_attention_heads'"),           # 32 heads in groups of 5 KV heads
    ({"torch_dtype": "int4"}, "'torch_dtype'"),
    ({"torch_dtype": 16}, "'torch_dtype'"),
    ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings'"),
])
def test_model_config_fields_that_change_the_answer_are_checked(tmp_path, change, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **change}))
    with pytest.raises(ValueError) as err:
        load_hf_config(path)
    assert str(path) in str(err.value) and field in str(err.value), err.value
    res = runner.invoke(app, ["capacity", "--model-config", str(path), "--kv-gib", "1"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and field in res.output, res.output


def test_valid_model_configs_still_load(tmp_path):
    """The checks refuse only what is wrong: explicit head_dim with an odd hidden size, group_size -1,
    and the checked-in configs."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "hidden_size": 4100, "head_dim": 128,
                                "quantization_config": {**GPTQ, "group_size": -1}}))
    spec = load_hf_config(path)
    assert spec.head_dim == 128 and spec.weight_bytes_per_param == 0.5          # 4 bits, per channel
    for config in sorted((Path(__file__).parents[1] / "data" / "hf_configs").glob("*.json")):
        load_hf_config(config)


def _trace(tmp: Path, n: int = 3) -> Path:
    path = tmp / "t.jsonl"
    path.write_text("".join(f'{{"arrival_s": {i}, "prompt_tokens": {10 + i}, "output_tokens": 3}}\n'
                            for i in range(n)))
    return path


def _mooncake(tmp: Path) -> Path:
    path = tmp / "mc.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 1000, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n')
    return path


def _fails(args: list[str], *expected: str) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert all(e in res.output for e in expected), res.output
    return res.output


def test_hash_block_size_on_a_mooncake_file_says_it_does_not_apply(tmp_path):
    mc = _mooncake(tmp_path)
    _fails(["trace", "stats", str(mc), "--hash-block-size", "16"], "does not apply", "512-token")
    _fails(["run", str(mc), "--hash-block-size", "16", "--quiet"], "does not apply")
    res = runner.invoke(app, ["trace", "stats", str(mc), "--hash-block-size", "512"])   # its own size: fine
    assert res.exit_code == 0, res.output
    plain = _trace(tmp_path)                             # no block_hashes at all
    for cmd in (["trace", "stats"], ["run"], ["compare"]):
        _fails([*cmd, str(plain), "--hash-block-size", "16", *(["--quiet"] if cmd != ["trace", "stats"] else [])],
               "--hash-block-size", "does not apply")


def test_trace_stats_hash_block_size_zero_is_refused_without_numpy_warnings(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # a numpy divide-by-zero warning would raise
        out = _fails(["trace", "stats", str(_mooncake(tmp_path)), "--hash-block-size", "0"], "--hash-block-size")
    assert "RuntimeWarning" not in out


def test_trace_convert_max_requests_below_one_is_refused(tmp_path):
    _fails(["trace", "convert", str(_trace(tmp_path)), "-o", str(tmp_path / "c.jsonl"), "--max-requests", "-1"],
           "--max-requests")
    assert not (tmp_path / "c.jsonl").exists()


def test_trace_gen_num_requests_has_a_stated_ceiling(tmp_path):
    _fails(["trace", "gen", "--preset", "alpaca", "-o", str(tmp_path / "g.jsonl"), "--num-requests", "100000000"],
           "--num-requests", "10,000,000")
    _fails(["trace", "gen", "--preset", "alpaca", "-o", str(tmp_path / "g.jsonl"), "--rate", "1000",
            "--duration", "1e6"], "10,000,000")                      # 10^9 expected requests


@pytest.mark.parametrize("flags, named", [
    (["--rel-tol", "nan"], "--rel-tol"), (["--rel-tol", "-1"], "--rel-tol"),
    (["--gpus-for", "inf", "--slo", "ttft_p99=2"], "--gpus-for"),
    (["--gpus-for", "1e12", "--slo", "ttft_p99=2"], "100,000 req/s"),
    (["--duration", "nan"], "--duration"),
    (["--tp-options", "1,x", "--gpus-for", "2", "--slo", "ttft_p99=2"], "--tp-options"),
])
def test_capacity_numbers_checked_before_work(tmp_path, flags, named):
    out = _fails(["capacity", str(_trace(tmp_path)), *flags], named)
    assert out.count("\n") == 1                          # refused before the capacity table


def test_calibrate_engine_refuses_a_fit_worse_than_the_spread_of_its_data(tmp_path):
    csv = tmp_path / "steps.csv"      # step times of 1 ms at 10^12 tokens of context: far below the kernel time
    csv.write_text("batch_size,step_ms,context_tokens\n1,1,1e12\n2,1,1e12\n")
    _fails(["calibrate-engine", str(csv), "-o", str(tmp_path / "p.json")], "rms error", "spread")
    assert not (tmp_path / "p.json").exists()
    good = tmp_path / "cpu.csv"       # 4 ms + 1 ms per sequence exactly: rms 0
    good.write_text("batch_size,cpu_ms\n1,5\n2,6\n4,8\n")
    res = runner.invoke(app, ["calibrate-engine", str(good), "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    fit = json.loads((tmp_path / "p.json").read_text())
    assert fit["cpu_step_s"] == pytest.approx(4e-3) and fit["cpu_seq_s"] == pytest.approx(1e-3)
    _fails(["calibrate-engine", str(good), "-o", str(tmp_path / "q.json"), "--model", "llama-3-8b"],
           "--model", "does not apply")


def test_report_sweep_refuses_a_table_without_the_sweep_columns(tmp_path):
    table = tmp_path / "results.csv"
    table.write_text("rate,throughput_rps\n1,0.9\n2,1.8\n")
    _fails(["report", "--sweep", str(table), "-o", str(tmp_path / "rep")], "--sweep", "not a sweep table",
           "status")
    assert not (tmp_path / "rep").exists()


def test_tune_block_size_refuses_set_flags_it_overrides(tmp_path):
    _fails(["tune-block-size", str(_trace(tmp_path)), "--kv-gib", "0.05", "--set", "block_size=8"],
           "--set block_size", "--block-sizes")
    _fails(["tune-block-size", str(_trace(tmp_path)), "--kv-gib", "0.05", "--set", "allocator=contiguous"],
           "--set allocator")


def test_duration_with_a_trace_says_it_does_not_apply(tmp_path):
    """`tune-block-size TRACE --duration 60`: the trace replays its own arrivals, so --duration is named
    as not applying (it was silently ignored); without --duration nothing is said."""
    trace = str(Path(__file__).resolve().parents[2] / "traces" / "tiny.jsonl")
    args = ["tune-block-size", trace, "--block-sizes", "16", "--workers", "1", "--kv-gib", "1"]
    res = CliRunner().invoke(app, [*args, "--duration", "60"])
    assert res.exit_code == 0, res.output
    assert "--duration does not apply to TRACE" in res.stderr
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "--duration" not in res.stderr, res.stderr
