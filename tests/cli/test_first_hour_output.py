"""What a new user reads (issue 22, problem 8): the compare table keeps its labels when piped, the progress
bar never counts past its total, rejected requests say why, tune-block-size names what it ran on."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.cli.output import progress_text

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_compare_piped_does_not_truncate_its_labels_or_values():
    """CliRunner's output is not a terminal (as `kvsim compare ... | less`). Five columns whose widest
    cell, "0 (0.0% of prompt tokens)", is 25 characters: wider than the 120 columns a pipe was given."""
    res = runner.invoke(app, ["compare", str(ROOT / "traces" / "tiny.jsonl"), "--kv-gib", "1"])
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert "prefix-cache hits (tok)" in res.output and "waited on KV / seqs / budget" in res.output


def test_progress_text_never_counts_past_its_total():
    assert progress_text(0, 600) == "t = 0 / 600 s"
    assert progress_text(600, 600) == "t = 600 / 600 s"
    text = progress_text(3152, 600)
    assert "3,152 / 600" not in text and text == "t = 3,152 s: draining after the last arrival at 600 s"


def test_run_says_why_requests_were_rejected():
    """Qwen2.5-7B's maximum length is 32,768 tokens (its config.json max_position_embeddings); the Mooncake
    excerpt's requests longer than that, counted here from the file itself, are rejected on arrival."""
    path = ROOT / "traces" / "mooncake_conversation_excerpt.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    too_long = sum(r["prompt_tokens"] + r["output_tokens"] > 32768 for r in rows)
    assert too_long > 0
    res = runner.invoke(app, ["run", str(path), "--model", "qwen2.5-7b", "--gpu", "h100-80gb",
                              "--hash-block-size", "512"])
    assert res.exit_code == 0, res.output
    assert f"{too_long} of {len(rows)} requests rejected on arrival" in res.output
    assert "exceeds the model's maximum length 32768" in res.output and "--max-model-len" in res.output


def test_tune_block_size_names_the_model_gpu_and_kv_memory(tmp_path):
    res = runner.invoke(app, ["tune-block-size", "--preset", "alpaca", "--num-requests", "40", "--kv-gib", "1",
                              "--block-sizes", "8,16", "--workers", "1", "--model", "llama-3-8b", "--gpu",
                              "h100-80gb", "--report", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "llama-3-8b on 1 x h100-80gb, 1 GiB KV" in " ".join(res.output.split())
    title = (tmp_path / "r" / "report.md").read_text().splitlines()[0]
    assert "llama-3-8b on 1 x h100-80gb" in title


def test_summary_latencies_print_without_exponents():
    """A TTFT of 1,344.2 s and 2,801 s reads '1,344 / 2,801', not '1.34e+03 / 2.8e+03'; small ones
    keep 3 significant digits."""
    from pathlib import Path

    import kvsim
    from kvsim.cli.output import _rows

    tiny = Path(__file__).resolve().parents[2] / "traces" / "tiny.jsonl"
    summary = kvsim.simulate(str(tiny), model="opt-13b", gpu="a100-40gb").summary
    summary.update(ttft_s={**summary["ttft_s"], "p50": 1344.2, "p99": 2801.0},
                   tpot_s={**summary["tpot_s"], "p50": 0.05141, "p99": 7.764})
    rows = dict(_rows(summary))
    assert rows["TTFT p50 / p99 (s)"] == "1,344 / 2,801"
    assert rows["TPOT p50 / p99 (s)"] == "0.0514 / 7.76"
