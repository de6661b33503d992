"""The harness commands through typer's CliRunner, on the CPU interpreter."""

import json
from pathlib import Path

from typer.testing import CliRunner

from gpu_harness.cli import harness_app
from kvsim.cost.calibration import load_calibration
from kvsim.cli.app import app as kvsim_app

runner = CliRunner()


def test_check_command_passes():
    result = runner.invoke(harness_app, ["check"])
    assert result.exit_code == 0, result.output
    # the small grids: 11 base cases (check._small_grid) + 2 sliding-window, 1 chunked and 2 MLA cases
    assert "16/16 cases passed" in result.output
    assert "paged window W8 null=pad" in result.output and "mla bf16 h16 r32+16" in result.output


def test_check_grid_selects_kernels():
    result = runner.invoke(harness_app, ["check", "--grid", "hybrid"])
    assert result.exit_code == 0, result.output
    assert "5/5 cases passed" in result.output and "store_kv" not in result.output
    bad = runner.invoke(harness_app, ["check", "--grid", "mamba"])
    assert bad.exit_code == 2 and "--grid must be one of all, base, hybrid" in bad.output


def test_calibrate_writes_format_file(tmp_path):
    out = tmp_path / "cal.json"
    result = runner.invoke(harness_app, ["calibrate", "--out", str(out), "--gpu", "h200"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "kvsim-calibration/1"
    assert doc["backend"] == "interpreter" and doc["usable_for_prediction"] is False
    assert doc["device"] == "cpu-interpreter"
    assert doc["hbm"]["datasheet_bytes_per_s"] == 4.8e12
    assert doc["shape"] == {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 64, "dtype": "bfloat16"}
    assert set(doc["fit"]["paged_overhead"]) == {"8", "16", "32"}
    # The CPU grid: batches 1, 2 x contexts 16, 48, each timed contiguous and paged (3 block sizes x
    # 2 tables) = 28 decode points, plus store_kv of 2 and 16 tokens.
    points = sorted((m["kernel"], m["block_size"] or 0, m["table"] or "", m["batch"], m["context"] or 0)
                    for m in doc["measurements"])
    assert len(points) == 30 and len(set(points)) == 30
    assert points[:4] == [("contiguous_decode", 0, "", 1, 16), ("contiguous_decode", 0, "", 1, 48),
                          ("contiguous_decode", 0, "", 2, 16), ("contiguous_decode", 0, "", 2, 48)]
    by_point = {(m["kernel"], m["block_size"], m["table"], m["batch"], m["context"]): m
                for m in doc["measurements"]}
    # KERNELS.md section 5, bf16: K+V 2 x 2 x 48 x 2 heads x 64 x 2 B = 49,152; Q+O 2 x 2 x 4 x 64 x 2
    # = 2,048; table 4 B x 2 x ceil(48/16) = 24; split partials 2 x 2 x 4 x splits x 65 x 4 B each split.
    paged = by_point[("paged_decode", 16, "permuted", 2, 48)]
    assert paged["bytes"] == 49_152 + 2_048 + 24 + (4_160 * paged["splits"] if paged["splits"] > 1 else 0)
    # store_kv of 16 tokens: rows read and written 2 x 2 x 16 x 2 x 64 x 2 B = 16,384, slots 16 x 8 B
    assert by_point[("store_kv", 16, None, 16, None)]["bytes"] == 16_384 + 128
    cal = load_calibration(out, force=True)  # the simulator's reader accepts it (when forced)
    assert cal.paged_overhead_at(16) == doc["fit"]["paged_overhead"]["16"]
    assert cal.decode_attn_bytes_per_s == doc["fit"]["decode_attn_bytes_per_s"]

    # `kvsim run` refuses interpreter timings, and uses them (slower steps) only when forced.
    trace = str(Path(__file__).resolve().parents[2] / "traces" / "tiny.jsonl")
    refused = runner.invoke(kvsim_app, ["run", trace, "--gpu", "h200", "--calibration", str(out)])
    assert refused.exit_code == 2 and "interpreter" in refused.output
    summaries = []
    for extra in ([], ["--calibration", str(out), "--force-calibration"]):
        res = runner.invoke(kvsim_app, ["run", trace, "--gpu", "h200", "--quiet", "--json",
                                        str(tmp_path / "s.json"), *extra])
        assert res.exit_code == 0, res.output
        summaries.append(json.loads((tmp_path / "s.json").read_text()))
    # interpreter rates are MB/s against the H200's TB/s: decode steps many times slower
    assert summaries[1]["tpot_s"]["mean"] > 10 * summaries[0]["tpot_s"]["mean"]


def test_calibrate_rejects_unknown_gpu(tmp_path):
    result = runner.invoke(harness_app, ["calibrate", "--out", str(tmp_path / "x.json"), "--gpu", "tpu"])
    assert result.exit_code == 2
    assert "unknown GPU" in result.output
