"""A seeded sample of mutants, each run against the default test suite's tests for its module, on this
tree and (with --old REV) on an older commit, so a change to the suite (tests moved behind --long, fewer
generated examples) shows whether the default suite still kills what it killed.

    python bench/mutation_sample.py --n 40 --old 77beaf1          # both sides, one line per mutant
    python bench/mutation_sample.py --n 40 --long                 # this tree with pytest --long

A mutant is one textual change to one line of a kvsim module: a comparison flipped (< <=, > >=, == !=),
+ and - swapped, an integer literal n made n + 1, `and` and `or` swapped, True and False swapped. The
sample is drawn from HEAD's modules with `random.Random(seed)`; on the old commit the same line is found
by its text (git's rename detection maps the file, and through it the test files), so both sides judge
the same mutants with the same tests. A mutant's tests are every test file that imports its module (or
its package by the module's name) plus the test folder that mirrors its package; it is killed when they
fail or time out, and survives when they pass. Run it on a tree whose default suite passes: a test that
fails without any mutant counts every mutant it selects as killed.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPERATORS = [(r" < ", " <= "), (r" <= ", " < "), (r" > ", " >= "), (r" >= ", " > "), (r" == ", " != "),
             (r" != ", " == "), (r" \+ ", " - "), (r" - ", " + "), (r" and ", " or "), (r" or ", " and "),
             (r"\bTrue\b", "False"), (r"\bFalse\b", "True")]
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutant:
    path: str      # repository-relative, on HEAD
    line_text: str
    nth: int       # which of the lines with this text in the file
    start: int     # column of the replaced text
    old: str
    new: str

    def label(self) -> str:
        return f"{self.path}: {self.line_text.strip()[:70]!r} {self.old.strip()!r}->{self.new.strip()!r}"


def candidate_lines(text: str) -> list[int]:
    """Line indices that are code (not comments, docstrings or imports)."""
    out, in_doc = [], False
    for i, line in enumerate(text.splitlines()):
        s = line.strip()
        quotes = s.count('"""') + s.count("'''")
        if in_doc:
            in_doc = quotes % 2 == 0
            continue
        if quotes:
            in_doc = quotes % 2 == 1
            continue
        if not s or s.startswith(("#", "import ", "from ", "@")) or s.startswith(("raise ", "log")):
            continue
        out.append(i)
    return out


def sample(n: int, seed: int, globs: list[str]) -> list[Mutant]:
    files = sorted({p for g in globs for p in ROOT.glob(g) if p.name != "__init__.py"})
    rng = random.Random(seed)
    out: list[Mutant] = []
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        path = rng.choice(files)
        text = path.read_text()
        lines = text.splitlines()
        cand = candidate_lines(text)
        if not cand:
            continue
        i = rng.choice(cand)
        ops = [(m.start(), m.group(0), new) for pat, new in OPERATORS for m in re.finditer(pat, lines[i])
               if not _in_string(lines[i], m.start())]
        ops = [o for o in ops if "#" not in lines[i][:o[0]]]
        for m in re.finditer(r"(?<![\w.])(\d+)(?![\w.])", lines[i]):
            if not _in_string(lines[i], m.start()) and "#" not in lines[i][:m.start()]:
                ops.append((m.start(), m.group(0), str(int(m.group(0)) + 1)))
        if not ops:
            continue
        start, old, new = rng.choice(sorted(ops))
        nth = [k for k, l in enumerate(lines) if l == lines[i]].index(i)
        mutant = Mutant(str(path.relative_to(ROOT)), lines[i], nth, start, old, new)
        if mutant not in out:
            out.append(mutant)
    return out


def _in_string(line: str, col: int) -> bool:
    return line[:col].count('"') % 2 == 1 or line[:col].count("'") % 2 == 1


def renames(old_rev: str) -> dict[str, str]:
    """HEAD path -> path at `old_rev`, by git's rename detection (unchanged paths map to themselves)."""
    out = subprocess.run(["git", "diff", "--name-status", "-M", old_rev, "HEAD"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    back = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0].startswith("R"):
            back[parts[2]] = parts[1]
    return back


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def tests_for(tree: Path, module_path: str) -> list[str]:
    """Test files of `tree` that import the module, or its package by the module's leaf name, plus the
    test folder mirroring the module's package (when the tree has one)."""
    mod = dotted(module_path)
    parent, _, leaf = mod.rpartition(".")
    pat = re.compile(rf"(from {re.escape(mod)} import|import {re.escape(mod)}\b|"
                     rf"from {re.escape(parent)} import [^\n]*\b{re.escape(leaf)}\b)")
    found = {str(p.relative_to(tree)) for p in (tree / "tests").rglob("test_*.py") if pat.search(p.read_text())}
    mirror = tree / "tests" / Path(*Path(module_path).parts[1:-1])
    if Path(module_path).parts[0] == "kvsim" and len(Path(module_path).parts) > 2 and mirror.is_dir():
        found |= {str(p.relative_to(tree)) for p in mirror.glob("test_*.py")}
    return sorted(found)


def run_tests(tree: Path, tests: list[str], long: bool) -> bool:
    """True when the tests pass."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *(["--long"] if long else []),
           *tests]
    try:
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**_env(), "PYTHONPATH": str(tree)})
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _env() -> dict:
    import os
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def judge(tree: Path, mutants: list[Mutant], path_map: dict[str, str], test_map: dict[str, str],
          long: bool) -> list[bool | None]:
    """Killed (True), survived (False) or not found on this tree (None), per mutant."""
    verdicts: list[bool | None] = []
    for m in mutants:
        path = tree / path_map.get(m.path, m.path)
        lines = path.read_text().splitlines(keepends=True)
        hits = [k for k, l in enumerate(lines) if l.rstrip("\n") == m.line_text]
        if len(hits) <= m.nth:
            verdicts.append(None)
            continue
        k = hits[m.nth]
        head_tests = tests_for(ROOT, m.path)
        tests = [t for t in (test_map.get(t, t) for t in head_tests) if (tree / t).is_file()]
        if not tests:
            verdicts.append(None)
            continue
        original = path.read_text()
        line = lines[k]
        lines[k] = line[:m.start] + line[m.start:].replace(m.old, m.new, 1)
        path.write_text("".join(lines))
        try:
            verdicts.append(not run_tests(tree, tests, long))
        finally:
            path.write_text(original)
        print(f"  {'killed ' if verdicts[-1] else 'SURVIVED'} {m.label()}  [{len(tests)} test files]", flush=True)
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--old", help="also judge the same mutants on this commit")
    ap.add_argument("--long", action="store_true", help="run the tests with --long")
    ap.add_argument("--side", choices=("both", "head", "old"), default="both",
                    help="with --old: judge on both trees, or on one (two processes can share the work)")
    ap.add_argument("--glob", action="append", default=None,
                    help="modules to mutate (default: every kvsim module below a subpackage)")
    args = ap.parse_args()
    mutants = sample(args.n, args.seed, args.glob or ["kvsim/*/**/*.py"])
    sides = [] if args.old and args.side == "old" else [("HEAD", ROOT, {}, {})]
    tmp = None
    if args.old and args.side != "head":
        tmp = Path(tempfile.mkdtemp(prefix="kvsim-mutants-"))
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tmp / "old"), args.old], cwd=ROOT, check=True)
        back = renames(args.old)
        sides.append((args.old, tmp / "old", back, back))
    try:
        results = {}
        for name, tree, pmap, tmap in sides:
            print(f"{name}: {tree}", flush=True)
            results[name] = judge(tree, mutants, pmap, tmap, args.long)
        both = [i for i in range(len(mutants)) if all(results[s][i] is not None for s, *_ in sides)]
        for name, *_ in sides:
            killed = sum(bool(results[name][i]) for i in both)
            print(f"{name}: {killed} of {len(both)} mutants killed ({killed / max(len(both), 1):.0%})")
    finally:
        if tmp:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "old")], cwd=ROOT)
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
