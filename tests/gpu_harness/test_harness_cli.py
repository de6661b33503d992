"""The harness commands through typer's CliRunner, on the CPU interpreter."""

import json
from pathlib import Path

from typer.testing import CliRunner

from gpu_harness.cli import harness_app
from kvsim.calibration import load_calibration
from kvsim.cli import app as kvsim_app

runner = CliRunner()


def test_check_command_passes():
    result = runner.invoke(harness_app, ["check"])
    assert result.exit_code == 0, result.output
    assert "11/11 cases passed" in result.output


def test_calibrate_writes_format_file(tmp_path):
    out = tmp_path / "cal.json"
    result = runner.invoke(harness_app, ["calibrate", "--out", str(out), "--gpu", "h200"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "kvsim-calibration/1"
    assert doc["backend"] == "interpreter" and doc["usable_for_prediction"] is False
    assert doc["device"] == "cpu-interpreter"
    assert doc["hbm"]["datasheet_bytes_per_s"] == 4.8e12 and doc["hbm"]["copy_bytes_per_s"] > 0
    assert set(doc["fit"]["paged_overhead"]) == {"8", "16", "32"}
    kinds = {(m["kernel"], m["table"]) for m in doc["measurements"]}
    assert kinds == {("contiguous_decode", None), ("paged_decode", "sequential"),
                     ("paged_decode", "permuted"), ("store_kv", None)}
    for m in doc["measurements"]:
        assert m["median_s"] > 0 and m["bytes_per_s"] == m["bytes"] / m["median_s"]
    cal = load_calibration(out, force=True)  # the simulator's reader accepts it (when forced)
    assert cal.decode_attn_bytes_per_s > 0

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
    assert summaries[1]["tpot_s"]["mean"] > summaries[0]["tpot_s"]["mean"]


def test_calibrate_rejects_unknown_gpu(tmp_path):
    result = runner.invoke(harness_app, ["calibrate", "--out", str(tmp_path / "x.json"), "--gpu", "tpu"])
    assert result.exit_code == 2
    assert "unknown GPU" in result.output
