"""Generated malformed inputs through the real CLI, in process: every one ends with exit status 0 or 2,
never a traceback, and never leaves an output folder that looks complete unless the run succeeded.

Inputs vary the bytes (encodings, BOM, compression, truncation, NUL), the JSON (field types and values,
unknown, missing and duplicate keys, non-objects), line endings, blank lines and ordering, the format
(kvsim JSONL, Mooncake JSONL, Azure and Vidur CSV) and the flags (numbers out of range, NaN, inf, bad
output paths). `pytest --long` (make test-long) tries many more. The number tried is printed at the end.
"""

import gzip
import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.files import INCOMPLETE_MARKER, is_complete_result

runner = CliRunner()
TRIED = {"inputs": 0, "exit 0": 0, "exit 2": 0}

numbers = st.one_of(
    st.integers(-3, 40), st.integers(-2**70, 2**70), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**63, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1e300, -0.0, 3.0]))
values = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=6),
                   st.lists(st.integers(-5, 2**64), max_size=4), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
KEYS = ["arrival_s", "prompt_tokens", "output_tokens", "id", "n", "beam_width", "prefix_group",
        "prefix_tokens", "block_hashes", "timestamp", "input_length", "output_length", "hash_ids", "extra"]


@st.composite
def record(draw) -> str:
    """One line of JSON (or not quite JSON)."""
    kind = draw(st.sampled_from(["kvsim", "kvsim", "mooncake", "junk"]))
    if kind == "junk":
        return draw(st.sampled_from(["[1, 2]", "3", '"x"', "null", "{", "{}", '{"arrival_s": }', "\x00",
                                     '{"arrival_s": NaN, "prompt_tokens": 1, "output_tokens": 1}']))
    if kind == "kvsim":
        rec = {"arrival_s": draw(st.floats(0, 50)), "prompt_tokens": draw(st.integers(1, 300)),
               "output_tokens": draw(st.integers(1, 60))}
    else:
        rec = {"timestamp": draw(st.integers(0, 50_000)), "input_length": draw(st.integers(0, 2000)),
               "output_length": draw(st.integers(0, 60)), "hash_ids": draw(st.lists(st.integers(0, 9), max_size=4))}
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=2)):   # break or add fields
        rec[key] = draw(values)
    if draw(st.integers(0, 9)) == 0 and rec:
        del rec[draw(st.sampled_from(sorted(rec)))]
    text = json.dumps(rec)
    if draw(st.integers(0, 11)) == 0 and rec:                      # a duplicate key
        key = draw(st.sampled_from(sorted(rec)))
        text = text[:-1] + f', "{key}": {json.dumps(draw(values))}}}'
    return text


@st.composite
def trace_bytes(draw) -> tuple[str, bytes]:
    """(file suffix, content)."""
    if draw(st.integers(0, 4)) == 0:                                # a CSV trace
        header = draw(st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", "arrived_at,num_prefill_tokens,"
                                       "num_decode_tokens", "num_prefill_tokens,num_decode_tokens", "a,b"]))
        cells = st.one_of(st.integers(-2, 500).map(str), st.sampled_from(["", "x", "nan", "inf", "1e400", "2.5",
                                                                         "2023-11-16 18:15:46.6805900"]))
        rows = draw(st.lists(st.lists(cells, min_size=1, max_size=4).map(",".join), max_size=5))
        lines, suffix = [header, *rows], ".csv"
    else:
        lines, suffix = draw(st.lists(record(), min_size=0, max_size=6)), ".jsonl"
        if draw(st.booleans()):
            lines = sorted(lines, reverse=draw(st.booleans()))       # reorder (arrivals may decrease)
    if draw(st.integers(0, 5)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["", "  ", "\t"])))
    eol = draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
    text = eol.join(lines) + draw(st.sampled_from([eol, ""]))
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["utf-8-sig", "latin-1", "utf-16", "gzip", "cut", "nul"]))
    if encoding == "latin-1":
        data = text.replace("x", "é").encode("latin-1", "replace") + b"\xe9"
    elif encoding == "gzip":
        data = gzip.compress(text.encode())
    elif encoding == "cut":
        data = text.encode()[: draw(st.integers(0, max(len(text) - 1, 0)))]
    elif encoding == "nul":
        data = text.encode() + b"\x00\xff\xfe"
    else:
        data = text.encode(encoding)
    return suffix, data


FLAG_VALUES = {
    "--kv-gib": ["1", "0.01", "0", "-1", "nan", "inf", "1e30", "1e9", "abc"],
    "--num-blocks": ["1", "64", "0", str(10**12), str(10**20)],
    "--block-size": ["1", "16", "1000000", "0"],
    "--tp": ["1", "2", "3", "8", "1000"],
    "--allocator": ["paged", "contiguous", "buddy"],
    "--reserve": ["max", "pow2", "oracle"],
    "--max-num-seqs": ["1", "4", "0"],
    "--max-batched-tokens": ["16", "2048", "0"],
    "--preemption": ["recompute", "swap"],
    "--swap-gib": ["0", "0.001", "nan", "inf", "-1"],
    "--max-requests": ["1", "3", "0"],
    "--format": ["auto", "jsonl", "mooncake", "azure", "vidur", "xml"],
    "--hash-block-size": ["1", "512", "0"],
    "--model": ["opt-13b", "llama-3-8b", "gpt-9"],
}
SWITCHES = ["--chunked-prefill", "--prefix-caching"]


@st.composite
def command(draw, trace: str, tmp: Path) -> tuple[list[str], Path | None]:
    cmd = draw(st.sampled_from(["run", "run", "run", "compare", "trace stats", "trace convert"]))
    args = [*cmd.split(), trace]
    out = None
    if cmd in ("run", "compare"):
        if not draw(st.integers(0, 3)) == 0 and cmd == "run":
            args += ["--kv-gib", "0.05"]                             # small enough to preempt sometimes
        for flag in draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=3, unique=True)):
            args += [flag, draw(st.sampled_from(FLAG_VALUES[flag]))]
        args += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
        args += ["--quiet"]
        target = draw(st.sampled_from(["none", "none", "new", "file", "proc", "dir"]))
        if target != "none":
            path = {"new": tmp / "out", "file": tmp / "a_file", "proc": Path("/proc/kvsim-fuzz"),
                    "dir": tmp}[target]
            if cmd == "run" and draw(st.booleans()):
                args += ["--out", str(path)]
                out = path
            else:
                args += ["--json", str(path if target != "new" else tmp / "s.json")]
    elif cmd == "trace convert":
        args += ["-o", str(draw(st.sampled_from([tmp / "c.jsonl", tmp, Path("/proc/kvsim-fuzz.jsonl")])))]
    return args, out


@settings(max_examples=120 if settings.default.max_examples < 5000 else 1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_bad_inputs_exit_0_or_2_without_traceback(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "a_file").write_text("x")
    if data.draw(st.integers(0, 9), label="plain run") == 0:
        # one input in ten is a plain valid run, so the success path is always among those tried (how
        # many generated ones pass shifts with the constants Hypothesis collects from the project's code)
        trace = tmp / "trace.jsonl"
        trace.write_text('{"arrival_s": 0.5, "prompt_tokens": 20, "output_tokens": 4}\n')
        out = tmp / "out" if data.draw(st.booleans(), label="--out") else None
        args = ["run", str(trace), "--quiet"] + (["--out", str(out)] if out is not None else [])
    else:
        suffix, content = data.draw(trace_bytes(), label="trace")
        trace = tmp / f"trace{suffix}"
        trace.write_bytes(content)
        args, out = data.draw(command(str(trace), tmp), label="args")
    res = runner.invoke(app, args)
    TRIED["inputs"] += 1
    TRIED[f"exit {res.exit_code}"] = TRIED.get(f"exit {res.exit_code}", 0) + 1
    assert res.exit_code in (0, 2), f"exit {res.exit_code} for {args}:\n{res.output}"
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
    assert "Traceback" not in res.output
    if res.exit_code == 2:
        assert res.output.strip(), "exit 2 without a message"
    if out is not None and out.is_dir() and out != tmp:
        assert is_complete_result(out) == (res.exit_code == 0), (args, res.output)
        assert res.exit_code == 0 or not (out / "summary.json").exists() or (out / INCOMPLETE_MARKER).exists()


def test_report_how_many_inputs_were_tried():
    """Runs after the fuzz test (file order) and prints the count (pytest -s shows it)."""
    if TRIED["inputs"]:
        print(f"\nfuzz: {TRIED}")
        assert TRIED["exit 0"] > 0 and TRIED["exit 2"] > 0, "the generator only makes one kind of input"
