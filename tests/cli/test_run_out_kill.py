"""`kvsim run --out DIR` killed (SIGKILL: no clean-up runs) at any moment over an older result never leaves
DIR looking complete with files of two runs (issue 40, family 4).

A folder is a complete result exactly when it holds `summary.json` and no INCOMPLETE marker
(kvsim.files.is_complete_result). After every kill the test asserts: either the folder says it is
incomplete, or it holds exactly one run's four files and nothing else, all of the same run: the old
result (5 requests) or the new one (the whole trace), told apart by the row counts, which the summary
states independently of the CSV files (requests_total rows in requests.csv, engine_steps in steps.csv).

The aimed trial kills the run the moment its steps start streaming (the window where, before the fix,
the old summary sat in DIR beside the new run's temporary steps file without a marker; now the steps
stream beside DIR and the older result stays whole until the end); the other trials kill at
moments drawn uniformly over a whole run. Default suite: the aimed trial and 2 random ones; `--long`: 40.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "sharegpt_2rps_10min.jsonl"
FILES = {"summary.json", "config.json", "requests.csv", "steps.csv"}


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kvsim", "run", str(TRACE), "--quiet", "--kv-gib", "4", "--out", str(out), *extra]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def old_result(tmp_path_factory) -> Path:
    """A complete older result (the trace's first 5 requests), made once and copied for each trial."""
    out = tmp_path_factory.mktemp("old") / "run"
    subprocess.run(_cmd(out, "--max-requests", "5"), env=_env(), check=True, capture_output=True)
    return out


def _copy(old: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(old, out)


def _rows(path: Path) -> int:
    with path.open() as f:
        return sum(1 for _ in f) - 1


def _check(out: Path) -> str:
    """'incomplete', 'old' or 'new'; AssertionError when the folder looks complete but mixes runs."""
    if (out / "INCOMPLETE").exists() or not (out / "summary.json").exists():
        return "incomplete"
    names = {p.name for p in out.iterdir()}
    assert names == FILES, f"a complete-looking folder holds {sorted(names)}"
    summary = json.loads((out / "summary.json").read_text())
    assert _rows(out / "requests.csv") == summary["requests_total"], "requests.csv of another run"
    assert _rows(out / "steps.csv") == summary["engine_steps"], "steps.csv of another run"
    return "old" if summary["requests_total"] == 5 else "new"


def _kill_when(out: Path, ready) -> None:
    proc = subprocess.Popen(_cmd(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not ready() and time.monotonic() < deadline:
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def _streaming(out: Path) -> bool:
    """Whether the run's steps are streaming (a temporary steps file inside or beside `out`)."""
    return any(out.glob(".steps.csv.*.tmp")) or any(out.parent.glob(f".{out.name}.steps.csv.*.tmp"))


def test_kill_while_steps_stream_leaves_the_older_result_whole(tmp_path, old_result):
    out = tmp_path / "run"
    _copy(old_result, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert _check(out) == "old"
    _kill_when(out, lambda: _streaming(out))
    assert _check(out) in ("incomplete", "old")
    if _check(out) == "old":                      # untouched, byte for byte
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # the next run over it cleans the killed run's temporary file and completes
    subprocess.run(_cmd(out, "--max-requests", "50"), env=_env(), check=True, capture_output=True)
    assert _check(out) == "new"
    assert not list(tmp_path.glob(".*.tmp")), "the killed run's temporary file was not cleaned"


def _random_trials(tmp_path: Path, old: Path, trials: int, whole: float | None = None) -> dict:
    """Kill `trials` runs over copies of `old` at moments drawn uniformly over `whole` x 1.1 seconds (default:
    one whole run, timed here)."""
    if whole is None:
        start = time.monotonic()
        subprocess.run(_cmd(tmp_path / "ref"), env=_env(), check=True, capture_output=True)
        whole = time.monotonic() - start
    rng = random.Random(40)
    seen = {"incomplete": 0, "old": 0, "new": 0}
    for trial in range(trials):
        out = tmp_path / f"t{trial}"
        _copy(old, out)
        moment = rng.uniform(0.0, whole * 1.1)
        t0 = time.monotonic()
        _kill_when(out, lambda: time.monotonic() - t0 >= moment)
        seen[_check(out)] += 1
    return seen


def test_kill_at_random_moments(tmp_path, old_result):
    seen = _random_trials(tmp_path, old_result, 2, whole=2.0)     # (a run takes about 1-2 s here)
    assert sum(seen.values()) == 2


@pytest.mark.long
def test_kill_at_many_random_moments(tmp_path, old_result):
    seen = _random_trials(tmp_path, old_result, 40)
    print(f"kill trials: {seen}")
    assert sum(seen.values()) == 40
    assert seen["incomplete"] + seen["old"] > 0          # the kills did land inside runs
