"""Covers: the wall time of a rate search under an SLO against one `kvsim run` at the rate it finds
(issue 19: <= 2.5x), this tree and an older commit side by side in one run (whole processes).

Scenario: `kvsim capacity --preset sharegpt --duration 1800 --kv-gib 12 --slo ttft_p99=2 --workers 1`
(one worker), then `kvsim trace gen` of the same preset at the rate found and `kvsim run` of it
(default flags but --kv-gib 12). Wall and CPU seconds (user + system: steadier than wall on a shared,
loaded machine) of each process. The old tree is `git archive` of `--old` (default a472e18, main before issue 19) unpacked
under /tmp. Both trees run with their bytecode cached, as an installed package would (this machine sets
PYTHONDONTWRITEBYTECODE, so an unpacked tree would otherwise compile every module in every process):
`PYTHONPYCACHEPREFIX` is a scratch folder, and one untimed search and run of each tree writes it. Runs
alternate old, new; medians of `--repeats`.

Run: python bench/rate_search_cost.py [--old a472e18] [--repeats 1] [--duration 1800] [--slo ttft_p99=2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from speed_vs_old import old_tree  # noqa: E402


#: The processes' environment (main sets the bytecode cache).
ENV = dict(os.environ)


def _cli(tree: Path, *args: str) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one `kvsim` process of `tree`."""
    env = {**ENV, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", _app(tree), *args], env=env, cwd=tree, check=True, text=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _app(tree: Path) -> str:
    return "kvsim.cli.app" if (tree / "kvsim" / "cli" / "app.py").exists() else "kvsim.cli"


def one(tree: Path, duration: float, slo: str, tmp: Path) -> dict:
    """Search, then one run at the rate found: wall times (s) and the rate."""
    js = tmp / f"cap-{tree.name}.json"
    search_s, search_cpu = _cli(tree, "capacity", "--preset", "sharegpt", "--duration", str(duration), "--kv-gib", "12",
                       "--slo", slo, "--workers", "1", "--json", str(js))
    rate = json.loads(js.read_text())["rate"]["rate_rps"]
    trace = tmp / f"tr-{tree.name}.jsonl"
    _cli(tree, "trace", "gen", "--preset", "sharegpt", "--rate", str(rate), "--duration", str(duration),
         "-o", str(trace))
    run_s, run_cpu = _cli(tree, "run", str(trace), "--kv-gib", "12", "--quiet")
    return {"search_s": search_s, "run_s": run_s, "search_cpu": search_cpu, "run_cpu": run_cpu, "rate": rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="a472e18", help="commit to compare against (a64768e has no capacity command)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--slo", default="ttft_p99=2")
    args = ap.parse_args()
    old = old_tree(args.old)
    print(f"old = {args.old}, new = {ROOT}; sharegpt {args.duration:g} s, kv 12 GiB, --slo {args.slo}, 1 worker; "
          f"{args.repeats} paired runs, median")
    print("tree | rate found (req/s) | search wall (s) | one run at that rate (s) | search / run | "
          "search CPU (s) | run CPU (s) | CPU search / run")
    with tempfile.TemporaryDirectory() as d:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = str(Path(d) / "pycache")
        for tree in (old, ROOT):                 # warm-up: writes each tree's bytecode, untimed
            one(tree, args.duration, args.slo, Path(d))
        res = {"old": [], "new": []}
        for _ in range(args.repeats):
            for name, tree in (("old", old), ("new", ROOT)):
                res[name].append(one(tree, args.duration, args.slo, Path(d)))
        for name, rows in res.items():
            s, r = (statistics.median(x[k] for x in rows) for k in ("search_s", "run_s"))
            sc, rc = (statistics.median(x[k] for x in rows) for k in ("search_cpu", "run_cpu"))
            print(f"{name} | {rows[0]['rate']:.4g} | {s:.2f} | {r:.2f} | {s / r:.2f}x | {sc:.2f} | {rc:.2f} | "
                  f"{sc / rc:.2f}x", flush=True)


if __name__ == "__main__":
    main()
