"""Covers: simulated generated tokens per second of `sim_wall_s`, this tree against an older commit,
side by side in one run (on a shared machine absolute times drift; only paired ratios mean much).

Scenario: the one-hour ShareGPT-like preset at 2 req/s and the one-hour Alpaca-like preset at 30 req/s
(seed 0), OPT-13B on one A100-40GB with 12 GiB of KV, paged (block 16). Each run is a fresh process;
runs alternate old, new, old, new, ... The old tree is a git worktree of `--old` (default a64768e,
the commit issue 7 measured against), made under /tmp if missing. Each run also prints a digest of its
per-request times and per-step memory, so the table shows whether both trees computed the same thing.

Run: python bench/speed_vs_old.py [--old a64768e] [--repeats 3] [--duration 3600]
Target (issue 7): >= 1.8x on both presets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {"sharegpt": 2.0, "alpaca": 30.0}

ONE = r"""
import hashlib, json, sys
import numpy as np
try:                                  # the layout since issue 17
    from kvsim.engine.config import CacheConfig, SimConfig
    from kvsim.engine.sim import simulate
    from kvsim.trace.synthetic import generate
except ImportError:                   # the flat layout of older commits
    from kvsim.config import CacheConfig, SimConfig
    from kvsim.sim import simulate
    from kvsim.tracegen import generate
from kvsim.specs import Deployment, get_gpu, get_model
preset, rate, duration = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
trace = generate(preset, rate_rps=rate, duration_s=duration, seed=0)
import dataclasses
# the kernels-only profile where one exists: the old commit had no engine profiles (outputs must match)
extra = {"engine_profile": "ideal"} if "engine_profile" in {f.name for f in dataclasses.fields(SimConfig)} else {}
cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb")), CacheConfig(kv_gib=12), **extra)
r = simulate(trace, cfg)
req, steps = r.requests, r.steps
done = (req.status == "finished").to_numpy()
tokens = int((req.output_tokens * req.n).to_numpy()[done].sum())
digest = hashlib.sha256()
for col in (req.finished_s, req.first_token_s, steps.time_s, steps.used_blocks, steps.token_states):
    digest.update(np.ascontiguousarray(col.to_numpy(), dtype=np.float64).tobytes())
print(json.dumps({"wall": r.summary["sim_wall_s"], "tokens": tokens, "steps": len(steps),
                  "digest": digest.hexdigest()[:12]}))
"""


def run_one(tree: Path, preset: str, duration: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ONE, preset, str(WORKLOADS[preset]), str(duration)],
                         env=env, cwd=tree, check=True, text=True, stdout=subprocess.PIPE)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="a64768e", help="commit to compare against")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs per preset (median reported)")
    ap.add_argument("--duration", type=float, default=3600.0, help="trace length, seconds")
    args = ap.parse_args()
    old = Path(f"/tmp/kvsim-old-{args.old}")
    if not old.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old],
                       check=True, stdout=subprocess.DEVNULL)
    print(f"old = {args.old} ({old}), new = {ROOT}; {args.repeats} paired runs, median")
    print("preset | old tokens/s | new tokens/s | ratio | steps | same outputs")
    for preset in WORKLOADS:
        olds, news = [], []
        for _ in range(args.repeats):
            olds.append(run_one(old, preset, args.duration))
            news.append(run_one(ROOT, preset, args.duration))
        old_tps = statistics.median(r["tokens"] / r["wall"] for r in olds)
        new_tps = statistics.median(r["tokens"] / r["wall"] for r in news)
        same = {r["digest"] for r in olds} == {r["digest"] for r in news} and len({r["digest"] for r in news}) == 1
        print(f"{preset} {WORKLOADS[preset]:g} req/s | {old_tps:,.0f} | {new_tps:,.0f} | "
              f"{new_tps / old_tps:.2f}x | {news[0]['steps']:,} | {'yes' if same else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
