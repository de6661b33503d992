"""The development set shipped in real-runs/ (issue 37): every folder reads, and `kvsim calibrate` on a
few shortened runs writes a profile that says what it could not fit and that `--engine-profile` takes."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.validation.measured import read_run

runner = CliRunner()
RUNS = Path(__file__).resolve().parents[2] / "real-runs"


def test_every_shipped_run_reads_with_its_client_and_stages():
    runs = [read_run(p) for p in sorted(RUNS.iterdir()) if p.is_dir()]
    assert len(runs) == 20                                   # real-runs/README.md: 16 H100 + 4 RTX
    assert sum(r.client == "inference-perf" for r in runs) == 16
    assert sum(bool(r.published) for r in runs) == 8         # the sim-to-real study's 8 shared runs
    general = next(r for r in runs if r.name == "h100-llama-2-7b-tp1-general")
    assert sorted(general.measured) == [-1, 0, 1]            # two stages and the whole run
    # the physical TPOT: (3557.9929 - 44.7843) / (248 - 1) ms
    assert general.measured[-1]["tpot_ms"] == pytest.approx((3557.9929 - 44.7843) / 247)
    trace_run = next(r for r in runs if r.name == "rtx4090-llama-3.1-8b-llmservingsim")
    assert trace_run.client == "vllm-engine" and len(trace_run.requests) == 300


def test_calibrate_on_shortened_runs_says_what_it_kept(tmp_path):
    out = tmp_path / "cal.json"
    runs = [str(RUNS / f"h100-llama-2-7b-tp1-{w}") for w in ("codegen", "general", "roleplay")]
    res = runner.invoke(app, ["calibrate", *runs, "-o", str(out), "--scale", "0.02", "--no-loo"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert "every run is at TP 1" in doc["kept_at_base"]["h100-80gb"]["allreduce_delta_s"]
    assert doc["fitted_on"] == [Path(r).name for r in runs] and 0.2 <= doc["by_gpu"]["h100-80gb"]["gpu_time_scale"] <= 5
    assert doc["gpu_time_scale"] == 1.0              # another GPU: the H100's efficiency does not carry
    val = runner.invoke(app, ["validate", runs[0], "--engine-profile", str(out), "--scale", "0.02",
                              "--json", str(tmp_path / "v.json"), "--quiet"])
    assert val.exit_code == 0, val.output
    assert json.loads((tmp_path / "v.json").read_text())["client_path"]["fixed_s"] == doc["client_path"]["fixed_s"]


@pytest.mark.long
def test_validate_replays_all_twenty_runs(tmp_path):
    res = runner.invoke(app, ["validate", str(RUNS), "--json", str(tmp_path / "v.json"), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "v.json").read_text())
    assert len(doc["runs"]) == 20 and all(v is not None for v in doc["median_ape_pct"].values())
