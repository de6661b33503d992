"""Mutation testing of the core modules with mutmut, one module group at a time (`make mutate`).

For each group the tracked files are copied to `mutants-work/<group>/` (ignored by git) with a
`[tool.mutmut]` section naming the group's files and the fast tests that exercise them; mutmut then
mutates those files, records which of the tests reach each function, and runs only those tests on each
mutant. Prints per group: mutants, killed (including timeouts), survived, no tests, the score
(killed / (total - skipped)), and every mutant not killed. On demand only: it takes tens of minutes.

    python bench/mutate.py                 # every group
    python bench/mutate.py metrics alloc   # some groups
    python bench/mutate.py --jobs 4        # mutmut workers per group (default 2)
    python bench/mutate.py metrics --recheck   # only the last run's survivors, against today's tests

`--recheck` runs the group's current tests (new ones included) against each mutant the last full run of
the group did not kill, in the mutated tree that run left behind; it refuses when a mutated file has
changed since (the mutants would no longer be the same). Tests only ever add kills, so the counts it
prints are those a full run with today's tests would give, at a fraction of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "mutants-work"
QUICK_EXAMPLES = 25

#: group -> (files to mutate, tests that exercise them). The tests are the fast, focused ones; the long
#: property runs (fast-forward equivalence) are left out, and the allocator state machines run
#: QUICK_EXAMPLES derandomized examples (KVSIM_QUICK_EXAMPLES) instead of 250.
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "metrics": (["kvsim/engine/metrics.py"],
                ["tests/engine/test_metrics_golden.py", "tests/engine/test_engine.py", "tests/engine/test_step_log.py",
                 "tests/engine/test_step_log_by_hand.py"]),
    "scheduler": (["kvsim/engine/batching/scheduler.py", "kvsim/engine/batching/preemption.py"],
                  ["tests/engine/test_metrics_golden.py", "tests/engine/test_engine.py", "tests/engine/test_step.py",
                   "tests/engine/test_reference_engine.py", "tests/engine/batching/test_multi_seq_preemption.py",
                   "tests/engine/batching/test_prefix_scheduler.py", "tests/engine/batching/test_beams.py", "tests/engine/batching/test_samples.py",
                   # vLLM's own step-by-step records (stored; the live rerun is off, see _ENV) and the
                   # lazy path against the per-sequence one: preemption, swap and chunked prefill
                   "tests/vllm/test_oracle.py", "tests/engine/batching/test_lazy_decode.py",
                   # swap, preemption, chunking and admission on tiny pools, worked out by hand
                   "tests/engine/batching/test_scheduler_by_hand.py"]),
    "alloc": (["kvsim/alloc/*.py", "kvsim/alloc/paged/*.py", "kvsim/alloc/contiguous/*.py"],
              ["tests/alloc/contiguous/test_contiguous.py", "tests/alloc/paged/test_paged.py", "tests/alloc/paged/test_prefix.py",
               "tests/alloc/test_stateful.py", "tests/engine/test_metrics_golden.py", "tests/engine/test_engine.py",
               # beams' refork and the lazy-decode ticks are reached only by these
               "tests/engine/batching/test_beams.py", "tests/alloc/paged/test_beams_stateful.py", "tests/engine/batching/test_lazy_decode.py",
               # by hand: fault injection into the checkers, ticks, windows, refork, placement edges
               "tests/alloc/test_checkers.py", "tests/alloc/paged/test_ticks.py", "tests/alloc/paged/test_windows.py",
               "tests/alloc/contiguous/test_placement.py", "tests/alloc/contiguous/test_edges.py"]),
    "cost": (["kvsim/cost/roofline.py"], ["tests/cost/test_cost.py", "tests/cost/test_calibration.py",
                                       "tests/cost/test_roofline_profiles.py"]),
    "specs": (["kvsim/specs/model.py", "kvsim/specs/gpu.py", "kvsim/specs/presets.py",
               "kvsim/specs/deployment.py"], ["tests/specs/test_specs.py", "tests/specs/test_models.py",
                                   "tests/specs/test_validation.py", "tests/specs/test_bounds.py"]),
    "trace": (["kvsim/trace/formats.py", "kvsim/trace/jsonl.py", "kvsim/trace/jsonl_record.py",
               "kvsim/trace/text.py"],        # the readers, not kvsim/trace/table.py
              ["tests/trace/test_trace.py", "tests/trace/test_formats.py", "tests/trace/test_readers.py",
               "tests/cli/test_bad_input.py", "tests/cli/commands/test_trace.py"]),
}


#: Environment of the test runs: short state machines, and no live vLLM rerun (18 s a mutant; the
#: stored oracle records are still compared).
_ENV = {"KVSIM_QUICK_EXAMPLES": str(QUICK_EXAMPLES), "ORACLE_VENV": "/nonexistent"}


def _config(files: list[str], tests: list[str]) -> str:
    """The [tool.mutmut] section for one group (TOML)."""
    quoted = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"   # noqa: E731
    return ("\n[tool.mutmut]\n"
            'source_paths = ["kvsim/"]\n'
            f"only_mutate = {quoted(files)}\n"
            'also_copy = ["traces/"]\n'
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
            f"pytest_add_cli_args_test_selection = {quoted(tests)}\n")


def _prepare(group: str) -> Path:
    """A fresh copy of the tracked files (and this working tree's edits) with the group's config."""
    dest = WORK / group
    shutil.rmtree(dest, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file() and not name.startswith("mutants"):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    pyproject = (dest / "pyproject.toml").read_text()
    pyproject = re.sub(r"\n\[tool\.mutmut\]\n(?:(?!\[).*\n?)*", "\n", pyproject)   # the group's instead
    (dest / "pyproject.toml").write_text(pyproject + _config(*GROUPS[group]))
    return dest


def run_group(group: str, jobs: int) -> dict:
    """Run mutmut on one group; returns its counts, score and the mutants not killed."""
    cwd = _prepare(group)
    mutmut = [sys.executable, "-m", "mutmut"]
    start = time.perf_counter()
    subprocess.run(mutmut + ["run", "--max-children", str(jobs)], cwd=cwd, stdout=subprocess.DEVNULL,
                   env={**os.environ, **_ENV})
    subprocess.run(mutmut + ["export-cicd-stats"], cwd=cwd, stdout=subprocess.DEVNULL)
    stats = json.loads((cwd / "mutants" / "mutmut-cicd-stats.json").read_text())
    listing = subprocess.run(mutmut + ["results"], cwd=cwd, capture_output=True, text=True).stdout
    survivors = [line.strip() for line in listing.splitlines() if line.strip()]
    tested = stats["total"] - stats.get("skipped", 0)
    killed = stats["killed"] + stats.get("timeout", 0)
    return {"group": group, **stats, "score": killed / tested if tested else None,
            "wall_s": time.perf_counter() - start, "not_killed": survivors}


def recheck_group(group: str, jobs: int) -> dict:
    """Run the group's current tests against the mutants its last full run left alive (see --recheck)."""
    cwd, last_path = WORK / group, WORK / f"{group}.json"
    if not last_path.is_file():
        raise SystemExit(f"{group}: no earlier run in {WORK}; run the group in full first")
    last = json.loads(last_path.read_text())
    files, tests = GROUPS[group]
    for src in sorted({p for pattern in files for p in ROOT.glob(pattern)}):
        rel = src.relative_to(ROOT)
        if not (cwd / rel).is_file() or src.read_bytes() != (cwd / rel).read_bytes():
            raise SystemExit(f"{group}: {rel} changed since the last full run; run the group in full")
    shutil.copytree(ROOT / "tests", cwd / "mutants" / "tests", dirs_exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(cwd / "mutants"), **_ENV}
    tests = sorted(tests, key=lambda t: -(ROOT / t).stat().st_mtime)   # newest first: likeliest to kill
    start = time.perf_counter()

    def run(name: str) -> int:
        try:
            return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                                  cwd=cwd / "mutants", env={**env, "MUTANT_UNDER_TEST": name},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300).returncode
        except subprocess.TimeoutExpired:
            return -1                      # a timeout counts as killed, as in mutmut
    if run("") != 0:
        raise SystemExit(f"{group}: the tests fail on the unmutated code in {cwd / 'mutants'}")
    timeouts = [line for line in last["not_killed"] if line.endswith(": timeout")]   # counted as killed
    names = [line.rsplit(":", 1)[0] for line in last["not_killed"] if line not in timeouts]
    with ThreadPoolExecutor(jobs) as pool:
        codes = dict(zip(names, pool.map(run, names)))
    newly = [n for n, code in codes.items() if code in (1, -1)]
    errors = [n for n, code in codes.items() if code not in (0, 1, -1)]
    if errors:
        raise SystemExit(f"{group}: pytest could not run for {errors[0]} (exit {codes[errors[0]]})")
    killed = last["killed"] + last.get("timeout", 0) + len(newly)
    tested = last["total"] - last.get("skipped", 0)
    return {**last, "killed": killed, "timeout": 0, "survived": tested - killed, "no_tests": 0,
            "score": killed / tested if tested else None, "wall_s": time.perf_counter() - start,
            "rechecked": len(names), "newly_killed": len(newly),
            "not_killed": [f"{n}: survived" for n in names if n not in newly] + timeouts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", metavar="GROUP",
                        help=f"groups to run (default all): {', '.join(GROUPS)}")
    parser.add_argument("--jobs", type=int, default=2, help="mutmut worker processes per group")
    parser.add_argument("--recheck", action="store_true",
                        help="only re-test the last full run's survivors with the current tests")
    args = parser.parse_args()
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group {unknown[0]!r}; known: {', '.join(GROUPS)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"mutation testing at commit {commit} (plus uncommitted edits), mutmut workers {args.jobs}"
          + (" (recheck of the last run's survivors)" if args.recheck else ""))
    for group in args.groups or list(GROUPS):
        r = ({**recheck_group(group, args.jobs), "tests_commit": commit} if args.recheck
             else {**run_group(group, args.jobs), "commit": commit})
        score = "n/a" if r["score"] is None else f"{100 * r['score']:.1f}%"
        print(f"\n{group}: {r['total']} mutants, killed {r['killed']} + timeout {r.get('timeout', 0)}, "
              f"survived {r['survived']}, no tests {r.get('no_tests', 0)}, skipped {r.get('skipped', 0)}, "
              f"suspicious {r.get('suspicious', 0)}: score {score} ({r['wall_s']:.0f} s)", flush=True)
        for line in r["not_killed"]:
            print(f"    {line}")
        (WORK / f"{group}.json").write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
