"""Covers: simulated generated tokens per second of `sim_wall_s`, this tree against an older commit,
side by side in one run (on a shared machine absolute times drift; only paired ratios mean much).

Scenario: the one-hour ShareGPT-like preset at 2 req/s and the one-hour Alpaca-like preset at 30 req/s
(seed 0), OPT-13B on one A100-40GB with 12 GiB of KV, paged (block 16), each tree with its own default
engine (issue 19: the new tree's default profile `vllm-v1`, chunked prefill and CPU time; the old commit
had no profiles) unless `--profile` names one (`ideal`: kernels only, the old commit's engine, so both
trees must compute the same thing). Prefix caching is each tree's default (the new tree's `vllm-v1`
profile turns it on, as `kvsim run` does; a64768e had it off); `--prefix-caching` turns it on in both
trees. (Until 2 December 2026 the default here was off in both trees: not the path `kvsim run` takes.)
Each run is a fresh process; pairs alternate which tree runs first (old, new, new, old, old, new, ...):
on this machine the second of two back-to-back runs is the slower. The old tree is `git archive` of
`--old` (default a64768e, the commit issues 7 and 19 measured against) unpacked under /tmp if missing.
Each run prints a digest of its per-request times and per-step memory, and the table says whether both
trees computed the same thing: they must against a commit with the same engine (`--profile ideal`
against a64768e, any profile against a commit that has profiles); a64768e's default engine is `ideal`,
so against it the default profile's outputs differ by design.

Run: python bench/speed_vs_old.py [--old a64768e] [--repeats 3] [--duration 3600] [--profile NAME]
     [--prefix-caching]
Target (issue 19): >= 1.8x on both presets with the default profile.
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
preset, rate, duration, profile, prefix = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
trace = generate(preset, rate_rps=rate, duration_s=duration, seed=0)
import dataclasses
# the old commit had no engine profiles: its engine is the kernels-only `ideal`
extra = ({"engine_profile": profile} if profile != "default"
         and "engine_profile" in {f.name for f in dataclasses.fields(SimConfig)} else {})
cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb")),
                CacheConfig(kv_gib=12, **({"prefix_caching": True} if prefix == "1" else {})), **extra)
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


def run_one(tree: Path, preset: str, duration: float, profile: str, prefix: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ONE, preset, str(WORKLOADS[preset]), str(duration), profile,
                          "1" if prefix else "0"],
                         env=env, cwd=tree, check=True, text=True, stdout=subprocess.PIPE)
    return json.loads(out.stdout.splitlines()[-1])


def old_tree(commit: str) -> Path:
    """An unpacked copy of `commit` under /tmp (no git worktree: the repository's list stays as it is)."""
    old = Path(f"/tmp/kvsim-old-{commit}")
    if not (old / "kvsim").exists():
        old.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True,
                                 stdout=subprocess.PIPE).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    return old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="a64768e", help="commit to compare against")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs per preset (median reported)")
    ap.add_argument("--duration", type=float, default=3600.0, help="trace length, seconds")
    ap.add_argument("--profile", default="default", help="engine profile of the new tree (default: its default)")
    ap.add_argument("--prefix-caching", action="store_true", help="prefix caching on in both trees")
    ap.add_argument("--presets", default=",".join(WORKLOADS), help="comma-separated presets to run")
    args = ap.parse_args()
    old = old_tree(args.old)
    print(f"old = {args.old} ({old}), new = {ROOT}; profile {args.profile}, prefix caching "
          f"{'on in both' if args.prefix_caching else 'as each tree defaults'}; {args.repeats} paired runs, median")
    print("preset | old tokens/s | new tokens/s | ratio (median of pairs) | old steps | new steps | same outputs")
    for preset in args.presets.split(","):
        olds, news = [], []
        for k in range(args.repeats):
            # the first of two back-to-back runs is the faster on this machine, whichever tree it is
            # (10-15% in CPU time, measured 2 December 2026): each pair takes turns going first
            first, second = (old, ROOT) if k % 2 == 0 else (ROOT, old)
            done = {tree: run_one(tree, preset, args.duration, args.profile, args.prefix_caching)
                    for tree in (first, second)}
            olds.append(done[old])
            news.append(done[ROOT])
        old_tps = statistics.median(r["tokens"] / r["wall"] for r in olds)
        new_tps = statistics.median(r["tokens"] / r["wall"] for r in news)
        ratio = statistics.median((n["tokens"] / n["wall"]) / (o["tokens"] / o["wall"]) for o, n in zip(olds, news))
        same = {r["digest"] for r in olds} == {r["digest"] for r in news} and len({r["digest"] for r in news}) == 1
        print(f"{preset} {WORKLOADS[preset]:g} req/s | {old_tps:,.0f} | {new_tps:,.0f} | {ratio:.2f}x | "
              f"{olds[0]['steps']:,} | {news[0]['steps']:,} | "
              f"{'yes' if same else 'no'}", flush=True)


if __name__ == "__main__":
    main()
