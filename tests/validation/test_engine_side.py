"""Engine-side metrics (issue 37, Build 2): vLLM's per-request timestamps (queued, scheduled, first and
last token) give queue, engine TTFT, prefill and decode; kvsim's prediction exposes them per request and
in `kvsim validate`'s table and JSON with their definitions, and inputs that carry them are compared on
them. Expected numbers are worked out by hand beside each assert."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.trace.table import Trace
from kvsim.validation.client_path import ClientPath
from kvsim.validation.measured import read_run
from kvsim.validation.metrics import engine_from_requests, engine_summary, predicted
from kvsim.validation.replay import replay, request_times

runner = CliRunner()
RUNS = Path(__file__).resolve().parents[2] / "real-runs"
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 2048,
      "vocab_size": 1000, "torch_dtype": "bfloat16"}
SERVER = {"model": "tiny", "hf_config": HF, "gpu": "H100-SXM-80GB", "num_gpus": 1, "tensor_parallel_size": 1,
          "flags": {"max_num_seqs": 2, "max_num_batched_tokens": 512, "block_size": 16, "max_model_len": 1024}}


def test_engine_intervals_by_hand():
    # queued 0 / 1, scheduled 0.5 / 1.0, first token 0.7 / 1.4, last 2.7 / 3.4 (s):
    # queue 500, 0 -> 250 ms; engine TTFT 700, 400 -> 550; prefill 200, 400 -> 300; decode 2000, 2000
    got = engine_summary([0, 1], [0.5, 1.0], [0.7, 1.4], [2.7, 3.4])
    assert got == pytest.approx({"queue_ms": 250, "engine_ttft_ms": 550, "prefill_ms": 300, "decode_ms": 2000})
    # an unfinished request (NaN last token) is left out: only the first counts
    assert engine_summary([0, 1], [0.5, 1.0], [0.7, 1.4], [2.7, np.nan])["queue_ms"] == pytest.approx(500)


def test_rows_with_vllm_timestamps_or_engine_clock_durations():
    stamps = [{"queued_ts": 100.0, "scheduled_ts": 100.5, "first_token_ts": 100.7, "last_token_ts": 102.7},
              {"queued_ts": 101.0, "scheduled_ts": 101.0, "first_token_ts": 101.4, "last_token_ts": 103.4}]
    assert engine_from_requests(stamps, "vllm-bench-serve", "r.jsonl") == pytest.approx(
        {"queue_ms": 250, "engine_ttft_ms": 550, "prefill_ms": 300, "decode_ms": 2000})
    # LLMServingSim rows: ttft_ms and e2e_ms from queued_ts, and queue_ms: prefill = ttft - queue
    rows = [{"ttft_ms": 700, "e2e_ms": 2700, "queue_ms": 500}, {"ttft_ms": 400, "e2e_ms": 2400, "queue_ms": 0}]
    assert engine_from_requests(rows, "vllm-engine", "r.jsonl") == pytest.approx(
        {"queue_ms": 250, "engine_ttft_ms": 550, "prefill_ms": 300, "decode_ms": 2000})
    # an HTTP client's TTFT is not the engine's: only the queue is taken
    assert engine_from_requests(rows, "vllm-bench-serve", "r.jsonl") == {"queue_ms": 250}
    assert engine_from_requests([{"ttft_ms": 1.0}], "vllm-bench-serve", "r.jsonl") == {}


@pytest.mark.parametrize("rows, named", [
    ([{"queued_ts": 0, "scheduled_ts": 0, "first_token_ts": 1, "last_token_ts": 2}, {"queued_ts": 0}],
     "request 2 has no field 'scheduled_ts'"),
    ([{"queued_ts": 1, "scheduled_ts": 0.5, "first_token_ts": 2, "last_token_ts": 3}],
     "request 1: field 'scheduled_ts' (0.5) is before 'queued_ts' (1.0)"),
    ([{"ttft_ms": 10, "e2e_ms": 20, "queue_ms": 30}], "request 1: field 'ttft_ms' (10.0) is before 'queue_ms'"),
    ([{"ttft_ms": 10, "e2e_ms": 20, "queue_ms": "soon"}], "field 'queue_ms' must be a number"),
])
def test_missing_or_contradictory_engine_times_name_the_request_and_field(rows, named):
    with pytest.raises(ValueError, match=None) as err:
        engine_from_requests(rows, "vllm-engine", "r.jsonl")
    assert str(err.value).startswith("r.jsonl: ") and named in str(err.value)


def _fake_result():
    # two requests queued at 0 and 1 s, admitted 0.5 / 1.0, first token 0.7 / 1.4, done 2.7 / 3.4
    cols = {"admitted_s": np.array([0.5, 1.0]), "first_token_s": np.array([0.7, 1.4]),
            "finished_s": np.array([2.7, 3.4]), "status": np.array(["finished", "finished"], dtype=object),
            "output_tokens": np.array([11, 11]), "prompt_tokens": np.array([1000, 1000])}
    trace = Trace.from_arrays(np.array([0.0, 1.0]), np.array([1000, 1000]), np.array([11, 11]))
    return SimpleNamespace(request_columns=cols), trace


def test_prediction_exposes_engine_times_beside_the_clients():
    result, trace = _fake_result()
    got = predicted(result, trace, np.zeros(2, dtype=np.int64), 0.006, {})[-1]
    # engine side as by hand above; the client's TTFT adds the 6 ms path: 550 + 6 ms
    assert got["queue_ms"] == pytest.approx(250) and got["prefill_ms"] == pytest.approx(300)
    assert got["engine_ttft_ms"] == pytest.approx(550) and got["ttft_ms"] == pytest.approx(556)
    # per request: 3 ms + 1000 x 3 us = 6 ms of client path for an HTTP client, none on the engine clock
    per = request_times((None, trace, np.zeros(2), result), ClientPath(0.003, 3e-6), "inference-perf")
    assert per["queue_ms"].tolist() == pytest.approx([500, 0]) and per["decode_ms"].tolist() == pytest.approx([2000, 2000])
    assert per["ttft_ms"].tolist() == pytest.approx([706, 406]) and per["client_path_ms"].tolist() == pytest.approx([6, 6])
    engine = request_times((None, trace, np.zeros(2), result), ClientPath(0.003, 3e-6), "vllm-engine")
    assert engine["ttft_ms"].tolist() == pytest.approx(engine["engine_ttft_ms"].tolist())


def test_shipped_llmservingsim_run_measures_the_engine_side():
    run = read_run(RUNS / "rtx4090-llama-3.1-8b-llmservingsim")
    m = run.measured[-1]
    # measured.json (LLMServingSim's own summary): mean TTFT 65,456.574 ms, mean e2e 86,578.254 ms;
    # the rows' engine TTFT is the same mean, and decode = e2e - TTFT = 21,121.68 ms
    assert m["engine_ttft_ms"] == pytest.approx(65456.574, abs=1e-3)
    assert m["decode_ms"] == pytest.approx(86578.254 - 65456.574, abs=1e-3)
    assert m["queue_ms"] + m["prefill_ms"] == pytest.approx(m["engine_ttft_ms"])


def test_simulated_engine_times_agree_with_kvsims_own_summary(tmp_path):
    rows = [{"arrival_s": 0.0, "prompt_tokens": 300, "output_tokens": 20, "ttft_ms": 30.0, "e2e_ms": 200.0,
             "queued_ts": 10 + 0.05 * i, "scheduled_ts": 10.01 + 0.05 * i, "first_token_ts": 10.03 + 0.05 * i,
             "last_token_ts": 10.2 + 0.05 * i, "client": "vllm-bench-serve"} for i in range(8)]
    trace = tmp_path / "req.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "server.json").write_text(json.dumps(SERVER))
    run = read_run(trace, tmp_path / "server.json")
    # every row: queue 10 ms, engine TTFT 30, prefill 20, decode 170
    assert run.measured[-1]["queue_ms"] == pytest.approx(10) and run.measured[-1]["decode_ms"] == pytest.approx(170)
    rep = replay(run, keep=True)
    pred, summary = rep.predicted[-1], rep.parts[3].summary
    # the engine's own summary (kvsim.engine.metrics) times TTFT from arrival: kvsim's engine TTFT
    assert pred["engine_ttft_ms"] == pytest.approx(summary["ttft_s"]["mean"] * 1e3)
    assert pred["engine_ttft_ms"] == pytest.approx(pred["queue_ms"] + pred["prefill_ms"])
    assert pred["decode_ms"] + pred["engine_ttft_ms"] == pytest.approx(summary["e2e_s"]["mean"] * 1e3)
    # max_num_seqs 2 and 8 requests at once: the first two start at 0, the others wait for a free seat
    times = rep.requests
    assert times["queue_ms"][:2].tolist() == [0, 0] and (times["queue_ms"][2:] > 0).all()
    assert (times["scheduled_s"][2:] >= times["last_token_s"][:2].min()).all()      # none before a seat frees
    assert pred["queue_ms"] == pytest.approx(times["queue_ms"].mean())


def test_cli_table_json_and_request_file(tmp_path):
    folder = RUNS / "rtx4090-llama-3.1-8b-llmservingsim"
    out, csv = tmp_path / "v.json", tmp_path / "req.csv"
    res = runner.invoke(app, ["validate", str(folder), "--scale", "0.05", "--json", str(out), "--requests", str(csv)])
    assert res.exit_code == 0, res.output
    assert "engine side" in res.output and "queue = scheduled_ts - queued_ts" in res.output
    doc = json.loads(out.read_text())
    assert "engine-side (vLLM request timestamps)" in doc["metric_definitions"]
    assert set(doc["median_ape_pct_engine"]) == {"queue_ms", "engine_ttft_ms", "prefill_ms", "decode_ms"}
    assert {r["metric"] for r in doc["table"]} >= {"queue_ms", "prefill_ms", "decode_ms"}
    lines = csv.read_text().splitlines()
    header = lines[0].split(",")
    assert header[:3] == ["run", "id", "stage"] and {"queued_s", "scheduled_s", "prefill_ms"} <= set(header)
    assert len(lines) == 1 + 15                # 5 % of 300 requests
