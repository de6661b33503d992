"""`kvsim trace gen|convert|stats` through typer's CliRunner, mounted as kvsim.cli.app will mount it."""

import json

import typer
from typer.testing import CliRunner

from kvsim.cli.commands.trace import trace_app
from kvsim.trace.jsonl import read_jsonl

app = typer.Typer()
app.add_typer(trace_app, name="trace")
runner = CliRunner()


def test_gen_then_stats(tmp_path):
    out = tmp_path / "g.jsonl"
    r = runner.invoke(app, ["trace", "gen", "--preset", "alpaca", "--rate", "30", "--duration", "60",
                            "--n", "2", "--seed", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    t = read_jsonl(out)
    assert 1600 < len(t) < 2000 and set(t.n.tolist()) == {2}
    r = runner.invoke(app, ["trace", "stats", str(out), "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["requests"] == len(t) and s["n"]["max"] == 2
    assert "prompt" in r.output and f"{s['prompt_tokens']['mean']:.2f}" in r.output


def test_gen_is_reproducible(tmp_path):
    for name in ("a", "b"):
        runner.invoke(app, ["trace", "gen", "--preset", "sharegpt", "--num-requests", "50", "-o", str(tmp_path / name)])
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text()
    assert len((tmp_path / "a").read_text().splitlines()) == 50


def test_convert_azure_excerpt(tmp_path):
    src = tmp_path / "az.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,48,10\n"
                   "2023-11-16 18:17:04.0,31,0\n2023-11-16 18:27:04.0,11,2\n")
    r = runner.invoke(app, ["trace", "convert", str(src), "-o", str(tmp_path / "o.jsonl"), "--max-duration", "300"])
    assert r.exit_code == 0, r.output
    assert "2 of 3 requests" in r.output and "0 prompt, 1 output" in r.output
    t = read_jsonl(tmp_path / "o.jsonl")
    assert t.arrival_s.tolist() == [0.0, 1.0] and t.output_tokens.tolist() == [10, 1]


def test_bad_file_exits_non_zero_with_the_message(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}\n'
                   '{"arrival_s": 1, "prompt_tokens": -3, "output_tokens": 1}\n')
    for args in (["stats", str(bad)], ["convert", str(bad), "-o", str(tmp_path / "o.jsonl")]):
        r = runner.invoke(app, ["trace", *args])
        assert r.exit_code == 2
        assert "bad.jsonl:2: field 'prompt_tokens' must be an integer >= 1, got -3" in r.output
    assert not (tmp_path / "o.jsonl").exists()
    r = runner.invoke(app, ["trace", "gen", "--preset", "nope", "-o", str(tmp_path / "g.jsonl")])
    assert r.exit_code == 2 and "unknown preset 'nope'" in r.output


def test_help_states_units():
    r = runner.invoke(app, ["trace", "gen", "--help"])
    assert r.exit_code == 0 and "requests per" in r.output and "seconds" in r.output
