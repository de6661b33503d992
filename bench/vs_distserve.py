"""Covers: `kvsim run` against DistServe's SimPy simulator as whole processes on the same real trace.

Scenario: the first N requests (default 3,000) of the Azure LLM inference 2023 conversation trace
(`../shared/traces/azure_llm_2023_conv.csv`), OPT-13B. kvsim: `kvsim run TRACE --max-requests N --quiet`
(one A100-40GB, default memory); DistServe: `simdistserve.benchmarks.simulate_dist --backend vllm` on
the same arrivals and lengths (a JSON workload, start times in ms), from the throwaway venv that
`../shared/peers/README.md` describes (`~/.cache/distserve-venv`). Runs alternate (kvsim, DistServe,
kvsim, ...) so drift on a shared machine hits both; the table gives the median wall time of each and
the ratio. Without the venv the DistServe side is skipped with a message.

Run: python bench/vs_distserve.py [--n 3000] [--repeats 3]
Target (issue 7): kvsim at least 10x faster at N = 3,000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KVSIM_SHARED", ROOT.parent / "shared"))   # ../shared beside the repo
TRACE = SHARED / "traces" / "azure_llm_2023_conv.csv"
DISTSERVE = SHARED / "peers" / "distserve"
VENV_PYTHON = Path.home() / ".cache" / "distserve-venv" / "bin" / "python"


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> float:
    """Wall-clock seconds of one whole process (it must succeed)."""
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000, help="requests from the start of the trace")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs (median reported)")
    args = ap.parse_args()
    if not TRACE.exists():
        print(f"skipped: {TRACE} is not here")
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kvsim = [sys.executable, "-m", "kvsim.cli.app", "run", str(TRACE), "--max-requests", str(args.n), "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        workload = Path(tmp) / "d.json"
        from kvsim.trace.formats import load_trace

        trace = load_trace(TRACE).head(args.n)
        workload.write_text(json.dumps([
            {"start_time": round(a * 1000.0, 3), "prompt_len": int(p), "output_len": int(o)}
            for a, p, o in zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens)]))
        distserve = [str(VENV_PYTHON), "-m", "simdistserve.benchmarks.simulate_dist", "--backend", "vllm",
                     "--model", "facebook/opt-13b", "--tp-prefill", "1", "--pp-prefill", "1",
                     "--workload", str(workload), "--arrival", "custom", "--N", str(args.n)]
        have_peer = VENV_PYTHON.exists()
        if not have_peer:
            print(f"DistServe skipped: no venv at {VENV_PYTHON} (set-up: {SHARED / 'peers' / 'README.md'})")
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(timed(kvsim, ROOT, env))
            if have_peer:
                theirs.append(timed(distserve, DISTSERVE, {**os.environ, "PYTHONPATH": str(DISTSERVE)}))
    print(f"N = {args.n:,} requests, {args.repeats} paired runs (median wall seconds, whole processes)")
    print(f"kvsim run:  {statistics.median(ours):.2f} s   (runs: {', '.join(f'{x:.2f}' for x in ours)})")
    if theirs:
        print(f"DistServe:  {statistics.median(theirs):.2f} s   (runs: {', '.join(f'{x:.2f}' for x in theirs)})")
        print(f"ratio:      {statistics.median(theirs) / statistics.median(ours):.1f}x (DistServe / kvsim)")


if __name__ == "__main__":
    main()
