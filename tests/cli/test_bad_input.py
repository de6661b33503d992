"""Issue 8's failing cases: every bad file, number and output path ends with one message naming the
file and line or the flag, and exit status 2, before any simulation runs."""

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvsim.cli.app
import kvsim.engine.sim
from kvsim.cli.app import app

runner = CliRunner()
ROW = '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n'


def files(tmp: Path) -> dict[str, Path]:
    """The bad inputs, written under `tmp`."""
    made = {
        "ok": ROW,
        "bom": b"\xef\xbb\xbf" + ROW.encode(),
        "gzip": gzip.compress(ROW.encode()),
        "latin1": (ROW + '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 3, "id": "café"}\n').encode("latin-1"),
        "binary": bytes(range(256)),
        "utf16": ROW.encode("utf-16"),
        "dup": ROW + '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 3, "prompt_tokens": 9}\n',
        "zero_heads": json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0,
                                       "max_position_embeddings": 128}),
        "string_layers": json.dumps({"num_hidden_layers": "32", "hidden_size": 64,
                                          "num_attention_heads": 4, "max_position_embeddings": 128}),
        "a_file": "x",
    }
    paths = {}
    for name, content in made.items():
        path = tmp / (f"{name}.json" if "_" in name and name != "a_file" else name if name == "a_file"
                      else f"{name}.jsonl")
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        paths[name] = path
    return paths


CASES = [   # (args with {name} placeholders, expected message)
    ("run {tmp}/nope.jsonl", "{tmp}/nope.jsonl: no such file"),
    ("run {tmp}", "{tmp}: is a folder, not a trace file"),
    ("compare {tmp}/nope.jsonl", "{tmp}/nope.jsonl: no such file"),
    ("run {gzip}", "{gzip}:1: the file is gzip-compressed; decompress it first (gunzip)"),
    ("run {latin1}", "{latin1}:2: not UTF-8 text (byte 0xe9 at column 68)"),
    ("run {binary}", "{binary}:1: a NUL byte at column 1; this is a binary file"),
    ("run {utf16}", "{utf16}:1: the file is UTF-16 text; kvsim reads UTF-8"),
    ("trace stats {latin1}", "{latin1}:2: not UTF-8 text (byte 0xe9 at column 68)"),
    ("run {dup}", "{dup}:2: field 'prompt_tokens' appears twice in one request"),
    ("run {ok} --out {a_file}", "--out {a_file}: exists and is not a folder"),
    ("run {ok} --out {a_file}/sub", "--out {a_file}/sub: {a_file} is a file, not a folder"),
    ("run {ok} --out /proc/kvsim-out", "--out /proc/kvsim-out: cannot write in /proc"),
    ("run {ok} --json /proc/kvsim.json", "--json /proc/kvsim.json: cannot write in /proc"),
    ("run {ok} --json {tmp}", "--json {tmp}: is a folder; give a file name"),
    ("run {ok} --json {tmp}/no/such/s.json", "--json {tmp}/no/such/s.json: folder {tmp}/no/such does not exist"),
    ("compare {ok} --json {tmp}", "--json {tmp}: is a folder; give a file name"),
    ("trace convert {ok} -o {tmp}", "-o {tmp}: is a folder; give a file name"),
    ("run {ok} --kv-gib inf", "--kv-gib must be positive and finite, got inf"),
    ("run {ok} --kv-gib nan", "--kv-gib must be positive and finite, got nan"),
    ("run {ok} --block-size 1000000", "--block-size 1000000 is larger than the whole KV cache"),
    ("run {ok} --tp 1000", "--tp 1000: opt-13b's 40 attention heads cannot be split evenly over 1000 GPUs"),
    ("run {ok} --model-config {zero_heads}",
     "{zero_heads}: field 'num_attention_heads' must be an integer in [1, 65,536], got 0"),
    ("run {ok} --model-config {string_layers}",
     "{string_layers}: field 'num_hidden_layers' must be an integer in [1, 4,096], got \"32\""),
]


@pytest.mark.parametrize("args, message", CASES)
def test_bad_input_is_one_message_and_exit_2(tmp_path, monkeypatch, args, message):
    if "-o " in args or "--out" in args or "--json" in args or "--" not in args:   # files: refused up front
        def no_simulation(*a, **k):
            raise AssertionError("simulated although the input was bad")
        monkeypatch.setattr(kvsim.engine.sim, "simulate", no_simulation)
    names = {k: str(v) for k, v in files(tmp_path).items()} | {"tmp": str(tmp_path)}
    res = runner.invoke(app, args.format(**names).split())
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert message.format(**names) in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


def test_bom_jsonl_is_read_as_jsonl(tmp_path):
    bom = files(tmp_path)["bom"]
    res = runner.invoke(app, ["run", str(bom), "--kv-gib", "1", "--json", str(tmp_path / "s.json"), "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "s.json").read_text())["requests_finished"] == 1


def test_largest_capacities_run(tmp_path):
    ok = files(tmp_path)["ok"]
    for flags in (["--kv-gib", "1e9"], ["--num-blocks", str(10**12)]):
        res = runner.invoke(app, ["run", str(ok), *flags, "--json", str(tmp_path / "s.json"), "--quiet"])
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / "s.json").read_text())["requests_finished"] == 1
    assert json.loads((tmp_path / "s.json").read_text())["kv"]["num_blocks"] == 10**12


def test_a_kvsim_bug_is_one_line_and_exit_1(tmp_path, monkeypatch):
    def bug(*a, **k):
        return {}["missing"]
    monkeypatch.setattr(kvsim.engine.sim, "simulate", bug)
    res = runner.invoke(app, ["run", str(files(tmp_path)["ok"]), "--kv-gib", "1", "--quiet"])
    assert res.exit_code == 1
    assert res.output.startswith("error: internal error, please report it: KeyError: 'missing' (at ")
    assert "test_bad_input.py" in res.output and len(res.output.strip().splitlines()) == 1
