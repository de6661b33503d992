"""Generated bad flag values for every flag of the planning, report and trace commands (issue 21): each
ends with exit status 2 and one `error:` line naming the flag or the value, never a traceback, before any
work (no table printed, no output file made). `run` and `compare` are fuzzed in tests/cli/test_fuzz_cli.py,
`sweep` in its own tests.

Every generated command line has at least one bad value (NaN, infinity, a negative or zero count, a value
past a ceiling, a word where a number belongs, an output path that cannot be written), on top of a cheap
valid base (a three-request trace), so a value that is not refused shows as exit 0 and fails the test.
The counts per command are printed at the end (pytest -s) and kept in FUZZ_COUNTS.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvsim.cli.app import app

runner = CliRunner()
FUZZ_COUNTS: dict[str, dict[str, int]] = {}

NAN_ETC = ["nan", "inf", "-inf", "-1", "abc", ""]
RATE = NAN_ETC + ["0", "1e9", "100001"]
DURATION = NAN_ETC + ["0", "1e12"]
COUNT = ["0", "-1", "abc", "1.5", str(10**9)]
WORKERS = ["0", "-1", str(10**6), "abc"]
OUT_FILE = ["{proc}/x.json", "{tmp}", "{tmp}/missing/x.json", "{file}/x.json"]
OUT_DIR = ["{proc}/r", "{file}", "{tmp}/existing", "{file}/sub"]
DEPLOYMENT = {"--kv-gib": ["nan", "-1", "0", "inf", "1e30", "abc"], "--num-blocks": ["0", "-1", str(10**20)],
              "--tp": ["0", "-1", "abc"], "--model": ["gpt-9"], "--gpu": ["tpu-v9"],
              "--set": ["max_num_seqs=0", "bogus_flag=1", "noequals", "kv_gib=nan", "block_size=abc"]}

#: command -> (base arguments, {flag: bad values}); {trace}, {tmp}, {file}, {csv}, {proc} are filled in.
COMMANDS: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "capacity": (["capacity", "{trace}", "--workers", "1", "--max-runs", "2"], {
        **DEPLOYMENT, "--gpus-for": RATE, "--rel-tol": NAN_ETC + ["0", "1", "5"], "--duration": DURATION,
        "--max-runs": COUNT, "--workers": WORKERS, "--tp-options": ["a,b", "0", "-1", ",", "1,x", "100000"],
        "--json": OUT_FILE, "--gpu-mem-util": ["nan", "0", "1.5", "-1", "inf"], "--block-size": ["0", "-1", "x"],
        "--max-model-len": ["0", "-1"], "--max-batched-tokens": ["0", "-1"], "--seed": ["-1", "abc"],
        "--slo": ["ttft_p99=nan", "ttft_p99=-1", "ttft_p99=0", "foo=1", "ttft_p99", "e2e_p42=1"],
        "--model-config": ["{tmp}/none.json", "{file}"], "--placement": ["diagonal"]}),
    "tune-block-size": (["tune-block-size", "{trace}", "--kv-gib", "0.05", "--block-sizes", "8,16",
                         "--workers", "1"], {
        **DEPLOYMENT, "--rate": RATE, "--duration": DURATION, "--num-requests": COUNT, "--seed": ["-1"],
        "--block-sizes": ["", "0", "a", "-4", str(10**9), "8,,x"], "--bookkeeping": ["{tmp}/none.json", "{file}"],
        "--workers": WORKERS, "--report": OUT_DIR, "--json": OUT_FILE, "--preset": ["nope", "alpaca"]}),
    "report": (["report", "{trace}", "-o", "{tmp}/rep", "--kv-gib", "0.05", "--rates", "1",
                "--block-sizes", "16", "--workers", "1"], {
        **DEPLOYMENT, "-o": OUT_DIR, "--sweep": ["{trace}", "{csv}", "{tmp}/none"], "--rates": RATE + ["1,nan"],
        "--block-sizes": ["0", "a", "-1"], "--rate": RATE, "--duration": DURATION, "--num-requests": COUNT,
        "--seed": ["-1"], "--workers": WORKERS}),
    "paper": (["paper", "--quick", "-o", "{tmp}/paper"], {"-o": OUT_DIR, "--workers": WORKERS}),
    "trace convert": (["trace", "convert", "{trace}", "-o", "{tmp}/c.jsonl"], {
        "-o": OUT_FILE, "--format": ["xml", "azure"], "--rate": RATE, "--time-scale": NAN_ETC + ["0", "1e9"],
        "--seed": ["-1"], "--max-requests": COUNT[:4], "--max-duration": DURATION}),
    "trace gen": (["trace", "gen", "--preset", "alpaca", "-o", "{tmp}/g.jsonl", "--num-requests", "5"], {
        "-o": OUT_FILE, "--preset": ["nope"], "--rate": RATE, "--num-requests": COUNT,
        "--n": COUNT, "--beam-width": COUNT, "--max-len": ["0", "1", "-1", str(10**9)],
        "--shared-prefix": ["-1", str(10**6)], "--seed": ["-1"]}),
    "trace gen --duration": (["trace", "gen", "--preset", "alpaca", "-o", "{tmp}/g.jsonl", "--rate", "1"], {
        "--duration": DURATION, "--rate": RATE}),
    "calibrate-engine": (["calibrate-engine", "{csv}", "-o", "{tmp}/p.json"], {
        "-o": OUT_FILE, "--base": ["nope"], "--model": ["gpt-9", "llama-3-8b"], "--gpu": ["tpu-v9", "h100-80gb"],
        "--tp": ["0", "-1", "2"], "--block-size": ["0", "32"], "--calibration": ["{tmp}/none.json"],
        "csv": ["{trace}", "{tmp}/none.csv", "{badfit}"]}),
}


def _files(tmp: Path) -> dict[str, str]:
    trace = tmp / "t.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {i * 0.5}, "prompt_tokens": {10 + i}, "output_tokens": 3}}\n'
                             for i in range(3)))
    (tmp / "a_file").write_text("x")
    (tmp / "existing").mkdir(exist_ok=True)
    csv = tmp / "cpu.csv"
    csv.write_text("batch_size,cpu_ms\n1,5\n2,6\n4,8\n")
    bad = tmp / "badfit.csv"          # step times far below any kernel time: the fit cannot follow them
    bad.write_text("batch_size,step_ms,context_tokens\n1,1,1e12\n2,1,1e12\n")
    return {"trace": str(trace), "tmp": str(tmp), "file": str(tmp / "a_file"), "csv": str(csv),
            "badfit": str(bad), "proc": "/proc/kvsim-fuzz"}


@st.composite
def bad_command(draw, name: str, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """(arguments, the bad flags and values, which the message should name)."""
    base, table = COMMANDS[name]
    args = [a.format(**files) for a in base]
    flags = draw(st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=2, unique=True))
    named = []
    for flag in flags:
        value = draw(st.sampled_from(table[flag])).format(**files)
        named += [flag, value]
        if flag == "csv":
            args[1] = value
            continue
        if flag in args:                        # replace the base's value of this flag
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
        if flag == "--gpus-for":
            args += ["--slo", "ttft_p99=5"]
        if flag in ("--kv-gib", "--num-blocks") and "--gpus-for" in args:
            args.remove("--gpus-for")          # a real conflict, refused too, but it names the other flag
    return args, named


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.lower().startswith("error")]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_bad_flag_values_exit_2_with_one_line(name, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    files = _files(tmp)
    counts = FUZZ_COUNTS.setdefault(name, {"inputs": 0, "exit 2": 0, "tracebacks": 0})

    @settings(max_examples=25 if settings.default.max_examples < 5000 else 400, deadline=None,
              derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def check(data):
        args, named = data.draw(bad_command(name, files))
        for leftover in ("rep", "paper", "c.jsonl", "g.jsonl", "p.json"):
            assert not (tmp / leftover).exists(), leftover
        res = runner.invoke(app, args)
        counts["inputs"] += 1
        counts["exit 2"] += res.exit_code == 2
        counts["tracebacks"] += "Traceback" in res.output
        assert "Traceback" not in res.output, (args, res.output)
        assert res.exit_code == 2, f"exit {res.exit_code} for {args}:\n{res.output}"
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
        line = _one_error_line(res.output)
        if "Usage:" not in res.output:          # our own message: nothing done before it
            assert res.output.strip() == line, (args, res.output)
        words = {w for w in named if w and w != "csv"} | {Path(w).name for w in named if "/" in w} \
            | {w.partition("=")[0] for w in named if "=" in w} \
            | {"--" + w.partition("=")[0].replace("_", "-") for w in named if "=" in w} | {"t.jsonl:", "cpu.csv:"}   # input files
        assert any(w in line for w in words) or "Usage:" in res.output, (args, line)
        for made in ("rep", "paper", "c.jsonl", "g.jsonl", "p.json"):
            assert not (tmp / made).exists(), (args, made)

    check()


def test_report_fuzz_counts():
    """Runs after the fuzz tests (file order): the counts per command (pytest -s shows them)."""
    if FUZZ_COUNTS:
        print("\nfuzz per command:", FUZZ_COUNTS)
        assert all(c["tracebacks"] == 0 and c["exit 2"] == c["inputs"] for c in FUZZ_COUNTS.values())
