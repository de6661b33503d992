"""An inference-perf report folder as `kvsim validate` input (issue 37, Build 1): a folder written back
from a shipped real-runs/ H100 run (the inverse of real-runs/README.md's mapping: ms back to seconds, the
stages' rates into config.yaml) reads as the same workload and the same measured values as the shipped
folder; bad folders exit 2 with one line naming the file and field."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.validation.measured import read_run
from kvsim.validation.workload import regenerate

runner = CliRunner()
RUNS = Path(__file__).resolve().parents[3] / "real-runs"
#: measured.json latency names -> inference-perf's (real-runs/README.md, "Metrics")
LATENCIES = {"e2e_ms": "request_latency", "ttft_ms": "time_to_first_token",
             "tpot_ms_inference_perf": "time_per_output_token",
             "inter_token_latency_ms_inference_perf": "inter_token_latency"}

CONFIG = """\
# the configuration inference-perf resolved (block style, as a YAML dump writes it)
api:
  type: completion
  streaming: true
data:
  type: shared_prefix
  path: null
  shared_prefix:
    num_groups: {num_groups}
    num_prompts_per_group: {num_prompts_per_group}
    system_prompt_len: {system_prompt_len}
    question_len: {question_len}
    output_len: {output_len}
load:
  type: constant
  interval: 1.0
  num_workers: 224
  stages:
{stages}
server:
  type: vllm
  model_name: {model}
  base_url: http://0.0.0.0:8000
  ignore_eos: true
report:
  request_lifecycle:
    summary: true
    per_stage: true
"""


def lifecycle(stage: dict, rate=None) -> dict:
    """A measured.json stage written back as inference-perf's lifecycle report (ms -> s)."""
    latency = {ip: {q: v / 1e3 for q, v in stage[ours].items()} for ours, ip in LATENCIES.items()}
    report = {"load_summary": {"count": stage["count"] + stage["failures"], "achieved_rate": stage["achieved_rate"]},
              "successes": {"count": stage["count"], "latency": latency, "throughput": stage["throughput"],
                            "prompt_len": stage["prompt_len"], "output_len": stage["output_len"]},
              "failures": {"count": stage["failures"]}}
    if rate is not None:
        report["load_summary"]["requested_rate"] = rate
    return report


def write_folder(run: Path, out: Path) -> Path:
    """`out`/results/ as inference-perf writes it, and the run's server.json beside it."""
    measured = json.loads((run / "measured.json").read_text())
    workload = json.loads((run / "workload.json").read_text())
    server = json.loads((run / "server.json").read_text())
    results = out / "results"
    results.mkdir(parents=True)
    stages = "\n".join(f"  - rate: {s['rate']}\n    duration: {s['duration_s']}" for s in workload["arrival"]["stages"])
    (results / "config.yaml").write_text(CONFIG.format(**workload["params"], stages=stages, model=server["model"]))
    for stage in measured["stages"]:
        doc = lifecycle(stage, stage["rate"])
        (results / f"stage_{stage['stage_index']}_lifecycle_metrics.json").write_text(json.dumps(doc))
    (results / "summary_lifecycle_metrics.json").write_text(json.dumps(lifecycle(measured["summary"])))
    shutil.copy(run / "server.json", out / "server.json")
    return out


@pytest.mark.parametrize("name", ["h100-llama-2-7b-tp1-general", "h100-mixtral-8x7b-v0-1-tp2-reasoning"])
def test_a_written_back_folder_reads_as_the_shipped_run(tmp_path, name):
    shipped = read_run(RUNS / name)
    got = read_run(write_folder(RUNS / name, tmp_path / name))
    assert (got.name, got.client, got.overloaded) == (name, "inference-perf", shipped.overloaded)
    assert got.workload["params"] == shipped.workload["params"]
    assert got.workload["arrival"]["stages"] == shipped.workload["arrival"]["stages"]
    assert got.client_output_mean == pytest.approx(shipped.client_output_mean)
    assert sorted(got.measured) == sorted(shipped.measured)
    for stage, values in shipped.measured.items():
        assert set(got.measured[stage]) == set(values)
        for metric, value in values.items():
            # itl_ms is derived here from the means measured.json stores to 4 decimals (and stores itself
            # to 4 decimals): 1e-5 relative covers that rounding and nothing more
            assert got.measured[stage][metric] == pytest.approx(value, rel=1e-5), (stage, metric)
    # the same requests: lengths, prefix blocks and send times (a twentieth of each stage)
    a, sa = regenerate(shipped, 16, seed=3, scale=0.05)
    b, sb = regenerate(got, 16, seed=3, scale=0.05)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(sa, sb)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens) and np.array_equal(a.output_tokens, b.output_tokens)
    assert all(a.prompt_block_ids(i, 16) == b.prompt_block_ids(i, 16) for i in range(0, len(a), 37))


def test_the_general_runs_figures_by_hand(tmp_path):
    run = read_run(write_folder(RUNS / "h100-llama-2-7b-tp1-general", tmp_path / "ip") / "results")
    # results/ given directly: the run is named after its parent, server.json found there
    assert run.name == "ip" and run.server["model"] == "meta-llama/Llama-2-7b-hf"
    # stage 0: request_latency 2.0576003 s, time_to_first_token 0.0271091 s, 210.0275 counted tokens:
    # ITL (2057.6003 - 27.1091) / 209.0275 = 9.7140 ms; TPOT with the 248 generated: 2030.4912 / 247 = 8.2206
    s0 = run.measured[0]
    assert s0["itl_ms"] == pytest.approx(9.7140, abs=5e-5) and s0["tpot_ms"] == pytest.approx(8.2206, abs=5e-5)
    assert (s0["rate"], s0["duration_s"], s0["count"], s0["failures"]) == (8, 600, 4800, 0)
    assert run.measured[-1]["throughput_rps"] == 13.9237


def _folder(tmp_path):
    return write_folder(RUNS / "h100-llama-2-7b-tp1-general", tmp_path / "ip")


def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("breaks, named", [
    (lambda f: (f / "results/stage_1_lifecycle_metrics.json").unlink(), "stage_1_lifecycle_metrics.json: missing"),
    (lambda f: shutil.copy(f / "results/stage_1_lifecycle_metrics.json", f / "results/stage_2_lifecycle_metrics.json"),
     "stage_2_lifecycle_metrics.json: config.yaml field 'load.stages' has 2 stage(s)"),
    (lambda f: _edit_json(f / "results/stage_0_lifecycle_metrics.json",
                          lambda d: d["successes"]["latency"].pop("time_to_first_token")),
     "stage_0_lifecycle_metrics.json: field 'successes.latency.time_to_first_token' is missing"),
    (lambda f: _edit_json(f / "results/stage_1_lifecycle_metrics.json",
                          lambda d: d["load_summary"].update(requested_rate=10)),
     "field 'load_summary.requested_rate' (10) contradicts config.yaml load.stages[1].rate (20)"),
    (lambda f: _edit_json(f / "results/summary_lifecycle_metrics.json", lambda d: d["successes"].update(count=1)),
     "summary_lifecycle_metrics.json: field 'successes.count' (1) is not the stages' sum (16800)"),
    (lambda f: (f / "results/config.yaml").write_text((f / "results/config.yaml").read_text()
                                                      .replace("type: shared_prefix", "type: random")),
     "config.yaml: field 'data.type' is 'random'"),
    (lambda f: (f / "results/config.yaml").write_text((f / "results/config.yaml").read_text()
                                                      .replace("    output_len: 248\n", "")),
     "config.yaml: field 'data.shared_prefix.output_len' is missing"),
    (lambda f: (f / "results/config.yaml").write_text((f / "results/config.yaml").read_text()
                                                      .replace("model_name: meta-llama/Llama-2-7b-hf",
                                                               "model_name: other/model")),
     "field 'server.model_name' (other/model) contradicts"),
    (lambda f: (f / "server.json").unlink(), "needs --server SERVER.json"),
    (lambda f: (f / "results/config.yaml").write_text("load: &a\n  type: constant\n"), "config.yaml:1:"),
])
def test_a_bad_folder_exits_2_naming_the_file_and_field(tmp_path, breaks, named):
    folder = _folder(tmp_path)
    breaks(folder)
    res = runner.invoke(app, ["validate", str(folder)])
    assert res.exit_code == 2 and named in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_validate_and_calibrate_take_the_folder_with_server_given_apart(tmp_path):
    folder = _folder(tmp_path)
    server = folder / "server.json"
    moved = tmp_path / "server.json"
    server.rename(moved)
    out = tmp_path / "v.json"
    res = runner.invoke(app, ["validate", str(folder), "--server", str(moved), "--scale", "0.01", "--quiet",
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["runs"][0]["client"] == "inference-perf" and doc["runs"][0]["measured"]["0"]["rate"] == 8
    cal = runner.invoke(app, ["calibrate", str(folder), "--server", str(moved), "-o", str(tmp_path / "c.json"),
                              "--scale", "0.01", "--no-loo"])
    assert cal.exit_code == 0, cal.output
    assert json.loads((tmp_path / "c.json").read_text())["fitted_on"] == ["ip"]
