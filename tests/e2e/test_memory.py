"""Memory follows use, not capacity: peak RSS of `kvsim run` in a fresh process stays under a ceiling
whatever --kv-gib or --num-blocks says (the paged allocator once built a free list over every block:
--kv-gib 1e9 was killed at 23.5 GB). The 100,000-request run is a release check (pytest --long)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "traces" / "tiny.jsonl"
#: Peak RSS allowed for one run, MiB (Python + numpy + pandas + SimPy alone take about 110).
CEILING_MIB = 400

# VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec from the forking (pytest) process
_MEASURE = """
import re, sys
from kvsim.cli.app import app
try:
    app(sys.argv[1:], prog_name="kvsim")
except SystemExit as exc:
    code = exc.code
hwm = re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)
print("peak_rss_kib", hwm, "exit", code, file=sys.stderr)
"""


def peak_rss_mib(*args: str) -> float:
    """Run `kvsim ARGS` in a fresh interpreter; its peak resident set size in MiB (exit 0 asserted)."""
    res = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=600)
    words = res.stderr.split()
    assert "peak_rss_kib" in words, res.stderr
    assert words[words.index("exit") + 1] in ("0", "None"), res.stderr
    return int(words[words.index("peak_rss_kib") + 1]) / 1024


@pytest.mark.parametrize("capacity", [["--kv-gib", "1e9"], ["--num-blocks", str(10**12)]])
def test_largest_capacity_runs_in_bounded_memory(tmp_path, capacity):
    rss = peak_rss_mib("run", str(TINY), *capacity, "--out", str(tmp_path / "o"), "--quiet")
    assert rss < CEILING_MIB, f"{capacity}: peak RSS {rss:.0f} MiB"


@pytest.mark.long
def test_100k_requests_with_out_in_bounded_memory_whatever_the_capacity(tmp_path):
    trace = tmp_path / "alpaca_100k.jsonl"
    subprocess.run([sys.executable, "-m", "kvsim.cli.app", "trace", "gen", "--preset", "alpaca", "--num-requests",
                    "100000", "--rate", "30", "-o", str(trace)], check=True, cwd=ROOT,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True)
    peaks = {}
    for kv_gib in ("12", "1e9"):
        peaks[kv_gib] = peak_rss_mib("run", str(trace), "--kv-gib", kv_gib, "--out", str(tmp_path / kv_gib), "--quiet")
        assert (tmp_path / kv_gib / "summary.json").exists()
    print(f"\npeak RSS, 100,000 requests with --out: {peaks} MiB")
    assert max(peaks.values()) < CEILING_MIB, peaks
    assert abs(peaks["1e9"] - peaks["12"]) < 50, f"memory depends on --kv-gib: {peaks}"
