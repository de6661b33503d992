"""Faults around output files (issue 21): a full disk, paths that cannot be written, temporary files of
killed runs, an interrupted `compare`, and Ctrl-C while `kvsim` starts.

A full disk is a size-limited process (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write past the limit
fails with EFBIG "File too large", as ENOSPC would on a full disk). Each command must then exit 2 with one
line naming the flag and the final path (never a temporary name), leave no temporary file and no output
that looks complete.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _trace(tmp: Path, n: int = 20) -> Path:
    path = tmp / "t.jsonl"
    path.write_text("".join(f'{{"arrival_s": {i * 0.1:.1f}, "prompt_tokens": {20 + i}, "output_tokens": 6}}\n'
                            for i in range(n)))
    return path


def _kvsim(args: list[str], limit_bytes: int | None = None, cwd: Path | None = None):
    """`python -m kvsim ARGS` in a subprocess, its file size limited to `limit_bytes`."""
    def limit():
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "kvsim", *args], capture_output=True, text=True, env=env,
                          preexec_fn=limit, cwd=cwd, timeout=120)


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp"))


DISK_FULL = {   # name -> (arguments, flag, output path relative to tmp, limit in bytes)
    "trace gen -o": (["trace", "gen", "--preset", "alpaca", "--num-requests", "300", "-o", "{tmp}/g.jsonl"],
                     "-o", "g.jsonl", 2000),
    "capacity --json": (["capacity", "{trace}", "--kv-gib", "0.05", "--json", "{tmp}/cap.json"], "--json",
                        "cap.json", 200),
    "compare --json": (["compare", "{trace}", "--kv-gib", "0.05", "--quiet", "--json", "{tmp}/cmp.json"], "--json",
                       "cmp.json", 2000),
    "run --out": (["run", "{trace}", "--kv-gib", "0.05", "--quiet", "--out", "{tmp}/out"], "--out", "out", 1000),
    "trace stats --json": (["trace", "stats", "{trace}", "--json", "{tmp}/st.json"], "--json", "st.json", 100),
}


@pytest.mark.parametrize("name", sorted(DISK_FULL))
def test_disk_full_names_flag_and_final_path_and_leaves_nothing(name, tmp_path):
    args, flag, target, limit = DISK_FULL[name]
    trace = _trace(tmp_path)
    res = _kvsim([a.format(tmp=tmp_path, trace=trace) for a in args], limit_bytes=limit)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    line = errors[0]
    assert f"{flag} {tmp_path / target}" in line and "File too large" in line, line
    assert ".tmp" not in line, line
    assert _temps(tmp_path) == [], _temps(tmp_path)
    out = tmp_path / target
    if out.suffix:
        assert not out.exists()                                  # whole or not at all
    else:
        assert not (out / "summary.json").exists()


#: Commands whose output path is checked before any work: (arguments, flag).
UNWRITABLE = {
    "capacity --json": (["capacity", "{trace}", "--kv-gib", "0.05", "--json", "{bad}.json"], "--json"),
    "tune-block-size --json": (["tune-block-size", "{trace}", "--kv-gib", "0.05", "--block-sizes", "16",
                                "--json", "{bad}.json"], "--json"),
    "tune-block-size --report": (["tune-block-size", "{trace}", "--kv-gib", "0.05", "--block-sizes", "16",
                                  "--report", "{bad}"], "--report"),
    "report -o": (["report", "{trace}", "--kv-gib", "0.05", "-o", "{bad}"], "-o"),
    "paper -o": (["paper", "--quick", "-o", "{bad}"], "-o"),
    "hybrid-study -o": (["hybrid-study", "--quick", "-o", "{bad}"], "-o"),
    "calibrate-engine -o": (["calibrate-engine", "{csv}", "-o", "{bad}.json"], "-o"),
    "trace gen -o": (["trace", "gen", "--preset", "alpaca", "--num-requests", "3", "-o", "{bad}.jsonl"], "-o"),
    "trace convert -o": (["trace", "convert", "{trace}", "-o", "{bad}.jsonl"], "-o"),
    "harness bookkeeping --out": (["harness", "bookkeeping", "--out", "{bad}.json"], "--out"),
}


@pytest.mark.parametrize("bad", ["/proc/kvsim-x", "{file}/x"])
@pytest.mark.parametrize("name", sorted(UNWRITABLE))
def test_unwritable_output_refused_before_any_work(name, bad, tmp_path):
    args, flag = UNWRITABLE[name]
    (tmp_path / "a_file").write_text("x")
    csv = tmp_path / "cpu.csv"
    csv.write_text("batch_size,cpu_ms\n1,5\n2,6\n")
    bad = bad.format(file=tmp_path / "a_file")
    res = runner.invoke(app, [a.format(trace=_trace(tmp_path, 3), bad=bad, csv=csv) for a in args])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("error:"), res.output   # nothing before it
    assert f"{flag} {bad}" in res.output, res.output
    assert ".tmp" not in res.output


def test_stale_temporary_files_of_dead_runs_are_removed(tmp_path):
    out = tmp_path / "s.json"
    dead = tmp_path / ".s.json.99999999.abc123.tmp"             # no process has pid 99999999
    live = tmp_path / f".s.json.{os.getpid()}.def456.tmp"       # this process: still writing
    other = tmp_path / ".other.json.99999999.x.tmp"             # another file's
    for p in (dead, live, other):
        p.write_text("partial")
    res = runner.invoke(app, ["trace", "stats", str(_trace(tmp_path, 3)), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["requests"] == 3
    assert not dead.exists() and live.exists() and other.exists()


def test_stale_report_folders_of_dead_runs_are_removed(tmp_path):
    stale = tmp_path / ".rep.tmp99999999"
    (stale / "figures").mkdir(parents=True)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    res = runner.invoke(app, ["report", "--sweep", str(bad), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 2 and "not a sweep table" in res.output, res.output
    assert not stale.exists()


def test_interrupted_compare_leaves_no_json(tmp_path, monkeypatch):
    import kvsim.engine.sim as sim
    real, calls = sim.simulate, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sim, "simulate", interrupted)
    out = tmp_path / "cmp.json"
    res = runner.invoke(app, ["compare", str(_trace(tmp_path, 3)), "--kv-gib", "0.05", "--quiet",
                              "--json", str(out)])
    assert res.exit_code != 0 and len(calls) == 2
    assert not out.exists(), out.read_text()                    # not one system's results as if complete
    assert _temps(tmp_path) == []


def _console_script() -> str:
    """The wrapper pip writes for pyproject's `kvsim` console script."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvsim"]
    module, attr = target.split(":")
    return f"import sys\nfrom {module} import {attr}\nsys.exit({attr}())\n"


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
def test_ctrl_c_while_starting_prints_no_traceback(delay, tmp_path):
    """SIGINT at several moments of start-up, from when the program begins loading typer (before that is
    Python's own start-up, which no program controls; `-X importtime` says when that point is passed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-c", _console_script(), "trace", "stats",
                             str(_trace(tmp_path, 3))], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)
    seen = b""
    while b"typer" not in seen:
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        seen += chunk
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    err = (seen + rest).decode(errors="replace")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    # 130 from kvsim's handler, 0 when the run ended first, or -SIGINT (the shell's 130) when the signal
    # lands as the program hands SIGINT back to the default action on its way out (seen on a loaded machine)
    assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err[-2000:])
