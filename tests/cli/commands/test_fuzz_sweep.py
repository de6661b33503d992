"""Generated bad sweeps through the real CLI, in process: every grid (bad values, unknown, repeated and
aliased keys, keys also fixed with --set, bad trace files) ends with exit status 0 or 2, never a traceback,
with one error line and no results table on 2; every damaged `rows.jsonl` (edited, negative, non-finite,
torn, junk and non-UTF-8 lines) resumes to the table a clean sweep gives, naming the rows it runs again.
The numbers tried are printed at the end (`-s`)."""

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvsim.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()
TRIED = {"grids": 0, "grid exit 0": 0, "grid exit 2": 0, "resumes": 0, "resume exit 0": 0, "tracebacks": 0}
EXAMPLES = 60 if settings.default.max_examples < 5000 else 600

VALUES = {
    "block_size": ["16", "8", "0", "abc", "16.5", "1e400", "-1"], "max_num_seqs": ["4", "0", "x", "1e9"],
    "kv_gib": ["12", "0.5", "-1", "nan", "inf", "x"], "allocator": ["paged", "contiguous", "bogus", "1"],
    "prefix_caching": ["true", "no", "2", "maybe"], "rate": ["2", "0.5", "0", "-1", "nan"],
    "duration_s": ["5", "0", "inf", "abc"], "num_requests": ["4", "0", "-2", "3.5", "2e6"],
    "max_requests": ["3", "0", "x"], "time_scale": ["0.5", "0", "-1"],
    "preset": ["alpaca", "sharegpt", "nope", "[dist]"], "trace": ["TINY", "MISSING", "EMPTY", "JUNK"],
    "tp": ["1", "0", "two"], "tensor_parallel_size": ["1", "2"], "block-size": ["32"], "blok": ["1"],
    "seed": ["0", "1", "-1", "x"], "preemption": ["swap", "recompute", "none"], "max_model_len": ["none", "abc"],
}


def _files(tmp: Path) -> dict[str, str]:
    (tmp / "empty.jsonl").write_text("")
    (tmp / "junk.jsonl").write_text('{"arrival_s": "x"}\n')
    return {"TINY": str(ROOT / "traces/tiny.jsonl"), "MISSING": str(tmp / "missing.jsonl"),
            "EMPTY": str(tmp / "empty.jsonl"), "JUNK": str(tmp / "junk.jsonl")}


def rarely(draw, n: int) -> bool:
    """True about once in `n` draws (a sampled index; plain integers lean to 0 under hypothesis)."""
    return draw(st.sampled_from(range(n))) == n - 1


@st.composite
def sweep_args(draw) -> list[str]:
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=3, unique=True))
    if rarely(draw, 6):
        keys.append(keys[0])                                          # a key given twice
    args = []
    for key in keys:
        vals = draw(st.lists(st.sampled_from(VALUES[key]), min_size=1, max_size=3, unique=not rarely(draw, 8)))
        args += ["--grid", f"{key}={','.join(vals)}"]
    if rarely(draw, 10):
        args += ["--grid", draw(st.sampled_from(["block_size", "=5", "", "block_size=,", " =1"]))]
    if rarely(draw, 8):                                               # a grid key fixed as well
        args += ["--set", f"{keys[0]}={VALUES[keys[0]][0]}"]
    if "trace" not in keys and "preset" not in keys:
        if draw(st.booleans()):
            args += ["--preset", "alpaca"]
            if "num_requests" not in keys:
                args += ["--set", "num_requests=4"]
        else:
            args.insert(0, "TINY")
    return args


def _check(r, out: Path) -> None:
    text = r.output
    if r.exit_code not in (0, 2) or "Traceback" in text or "internal error" in text:
        TRIED["tracebacks"] += 1
    assert r.exit_code in (0, 2), text
    assert "Traceback" not in text and "internal error" not in text, text


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=sweep_args())
def test_generated_bad_grids_exit_0_or_2_without_traceback(tmp_path_factory, args):
    tmp = tmp_path_factory.mktemp("g")
    files = _files(tmp)
    args = [files.get(a, a) for a in args]
    args = [a if not a.startswith("trace=") else "trace=" + ",".join(files.get(v, v) for v in a[6:].split(","))
            for a in args]
    out = tmp / "out"
    r = runner.invoke(app, ["sweep", *args, "--workers", "1", "-o", str(out)])
    TRIED["grids"] += 1
    TRIED[f"grid exit {r.exit_code}"] = TRIED.get(f"grid exit {r.exit_code}", 0) + 1
    _check(r, out)
    if r.exit_code == 2:
        assert len([x for x in r.output.splitlines() if x.strip()]) == 1, r.output
        assert not (out / "results.parquet").exists()
    else:
        df = pd.read_parquet(out / "results.parquet")
        assert set(df.status) <= {"ok", "error"} and len(df) >= 1
        assert not any(p.name.endswith(".tmp") for p in out.iterdir())


GRID = ["--preset", "alpaca", "--grid", "block_size=16,32", "--set", "kv_gib=12", "--set", "num_requests=10",
        "--workers", "1"]
INF, NAN = math.inf, math.nan
#: Edits a resume must catch: (column, new value), or (column, None) to delete it.
EDITS = [("requests_finished", 999), ("requests_finished", -1), ("requests_finished", "10"),
         ("requests_total", 11), ("requests_rejected", 5), ("throughput_rps", -1.0), ("throughput_rps", INF),
         ("throughput_rps", NAN), ("throughput_tokens_per_s", -5), ("mean_batch_size", -2.0),
         ("ttft_s_p99", INF), ("wall_s", -1), ("block_size", 64), ("block_size", "16"), ("kv_gib", 13),
         ("allocator", "contiguous"), ("model", "opt-66b"), ("requests_total", None), ("block_size", None),
         ("run_id", None), ("status", "error"), ("kv_num_blocks", [1])]
JUNK = ["[1, 2]", "3", "null", "not json", "{}", '{"run_id": 5}', '{"run_id": "abcdef012345"}', "\x00", "", "  "]


@pytest.fixture(scope="module")
def clean_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "s"
    r = runner.invoke(app, ["sweep", *GRID, "-o", str(out)])
    assert r.exit_code == 0, r.output
    return (out / "rows.jsonl").read_text(), pd.read_parquet(out / "results.parquet")


@settings(max_examples=EXAMPLES * 2 // 3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(EDITS)), max_size=3),
       junk=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(JUNK)), max_size=3),
       torn=st.integers(0, 3), bad_bytes=st.booleans())
def test_damaged_rows_resume_to_the_clean_table(tmp_path_factory, clean_sweep, edits, junk, torn, bad_bytes):
    text, clean = clean_sweep
    rows = [json.loads(x) for x in text.splitlines()]
    ids = [r["run_id"] for r in rows]
    for i, (key, value) in edits:
        if value is None:
            rows[i].pop(key, None)
        else:
            rows[i][key] = value
    lines = [json.dumps(r) for r in rows]
    for pos, line in junk:
        lines.insert(min(pos, len(lines)), line)
    data = "".join(x + "\n" for x in lines).encode()
    if bad_bytes:
        data += b"\xff\xfe{\n"
    if torn:                                         # a row cut off by a full disk, no newline
        data += json.dumps(rows[torn % 2]).encode()[: 17 * torn]
    out = tmp_path_factory.mktemp("r") / "s"
    out.mkdir()
    (out / "rows.jsonl").write_bytes(data)
    r = runner.invoke(app, ["sweep", *GRID, "--resume", "-o", str(out)])
    TRIED["resumes"] += 1
    _check(r, out)
    assert r.exit_code == 0, r.output
    TRIED["resume exit 0"] += 1
    df = pd.read_parquet(out / "results.parquet")
    assert df.status.tolist() == ["ok", "ok"] and df.requests_finished.tolist() == [10, 10]
    assert df.normalized_latency_s_per_token.tolist() == clean.normalized_latency_s_per_token.tolist()
    assert df.block_size.tolist() == [16, 32] and df.allocator.tolist() == ["paged", "paged"]
    edited = {i for i, _ in edits}
    # rerun, or served by the process's run cache when an earlier example made the same run
    ran = re.search(r"(\d+) run, (?:(\d+) shared \(the same run earlier in this process\), )?(\d+) resumed", r.output)
    assert ran and int(ran[1]) + int(ran[2] or 0) == len(edited) and int(ran[3]) == 2 - len(edited), r.output
    unnamed = {i for i, (key, _) in edits if key in ("run_id", "status")}   # dropped or failed rows
    for i in edited - unnamed:
        assert f"run {ids[i]} " in r.output, (edits, r.output)
    after = (out / "rows.jsonl").read_bytes()
    assert after.endswith(b"\n")
    assert all(isinstance(json.loads(x).get("run_id"), str) for x in after.decode().splitlines())


def test_report_how_many_sweeps_were_tried():
    """Prints the counts (run with -s); the generators must make both good and bad inputs."""
    print(f"\nsweep fuzz: {TRIED}")
    if TRIED["grids"]:
        assert TRIED["grid exit 0"] > 0 and TRIED["grid exit 2"] > 0, TRIED
        assert TRIED["tracebacks"] == 0, TRIED
