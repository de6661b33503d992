"""Refusals that name the culprit and the remedy (issue 40, family 5): the one-sequence refusal of the
hybrid and Jenga allocators names the trace file, line and request id and says `--no-hybrid-kv-cache`
(before the run, not when the request arrives); a huge `kv_lora_rank` names the field and its ceiling;
Ctrl-C says "interrupted" in one line; `--json` is strict JSON."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

import kvsim.engine.sim
from kvsim.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
runner = CliRunner()


def _trace(tmp_path: Path, last: dict) -> Path:
    lines = [json.dumps({"arrival_s": 0.01 * i, "prompt_tokens": 20, "output_tokens": 4}) for i in range(300)]
    lines.insert(5, "")                                 # a blank line: request 300 is on line 301
    lines.append(json.dumps({"arrival_s": 9.0, "prompt_tokens": 20, "output_tokens": 4, "id": "last", **last}))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_hybrid_refusal_names_file_line_request_and_remedy(tmp_path):
    path = _trace(tmp_path, {"n": 2})
    res = runner.invoke(app, ["run", str(path), "--quiet", "--model-config", str(CONFIGS / "gpt-oss-20b.json"),
                              "--gpu", "h200"])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"{path} line 302, request 'last'" in lines[0] and "--no-hybrid-kv-cache" in lines[0]
    ok = runner.invoke(app, ["run", str(path), "--quiet", "--model-config", str(CONFIGS / "gpt-oss-20b.json"),
                             "--gpu", "h200", "--no-hybrid-kv-cache"])
    assert ok.exit_code == 0, ok.output


def test_jenga_refusal_names_the_request_and_beams(tmp_path):
    path = _trace(tmp_path, {"beam_width": 3})
    res = runner.invoke(app, ["run", str(path), "--quiet", "--model-config", str(CONFIGS / "gpt-oss-20b.json"),
                              "--gpu", "h200", "--allocator", "jenga"])
    assert res.exit_code == 2 and "request 'last'" in res.output and "beam_width = 3" in res.output
    assert "--no-hybrid-kv-cache" in res.output


def test_kv_lora_rank_1e9_is_named_with_its_ceiling(tmp_path):
    cfg = json.loads((CONFIGS / "deepseek-v3.json").read_text())
    for value in (10**9, 1e9):
        cfg["kv_lora_rank"] = value
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        res = runner.invoke(app, ["capacity", "--model-config", str(tmp_path / "config.json"), "--gpu", "h200",
                                  "--tp", "8"])
        assert res.exit_code == 2 and "kv_lora_rank" in res.output and "1,048,576" in res.output, res.output
        assert "the KV memory holds" not in res.output


def test_ctrl_c_says_interrupted_in_one_line(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(kvsim.engine.sim, "simulate", interrupted)
    res = runner.invoke(app, ["run", str(ROOT / "traces" / "tiny.jsonl"), "--quiet"])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 130 and lines == ["kvsim: interrupted"], res.output


def test_json_is_strict_json_where_a_ratio_is_undefined(tmp_path):
    """contiguous-max fits no request in 0.5 GiB of llama-3-8b KV: ratios to it are x/0 (was Infinity/NaN)."""
    out = tmp_path / "c.json"
    res = runner.invoke(app, ["capacity", str(ROOT / "traces" / "tiny.jsonl"), "--model", "llama-3-8b",
                              "--kv-gib", "0.5", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text(), parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))
    text = json.dumps(doc)
    assert '"ratio_to_max": null' in text and "ratio_to_max_null_reason" in text


def test_data_parallel_engines_share_the_one_cap(tmp_path):
    """--data-parallel-size N runs N engines: the same cap as --replicas, named by its own flag, before
    any run; the cap is the fleet's number (specs repeats it below the fleet package)."""
    from kvsim.fleet.config import MAX_UNITS
    from kvsim.specs.deployment import MAX_DP
    assert MAX_DP == MAX_UNITS == 1024
    res = CliRunner().invoke(app, ["run", "traces/tiny.jsonl", "--data-parallel-size", "1025"])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "--data-parallel-size 1025" in lines[0] and "1,024" in lines[0]
