"""The README runs: every command in README.md's code blocks and reports/README.md's table, extracted from
the text, is either run here — in a copy of the repository's kvsim/ and traces/ with no ../shared beside
it, as a fresh clone has — and must exit 0, or skipped with its reason in `pytest -rs`.

Also: every skip in the test suite says why (a skip without a reason hides lost coverage).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Optional flags shown in brackets that a run here keeps (the rest are left out).
KEEP_OPTIONAL = {"--quick", "--force"}
#: Commands not run here, by their start, and why (shown by `pytest -rs`).
NOT_RUN = {
    "make ": "creates .venv and installs packages from the network",
    "kvsim harness": "needs the gpu extra (torch, triton); tests/gpu_harness runs the harness",
    "kvsim hybrid-study": "minutes of simulation; `make reports` regenerates it",
    "kvsim capacity --model-config path/to/": "a placeholder path (tests/specs/test_models.py reads real configs)",
}
#: Commands that take more than ~10 s on a loaded 2-core machine: run only as release checks
#: (`pytest --long`, `make test-long`), where each must exit 0 like the others.
LONG = (
    "kvsim sweep --preset sharegpt --grid block_size=8,16,32", "kvsim report --sweep out/sweep1",
    "kvsim report traces/sharegpt_2rps_10min.jsonl", "kvsim tune-block-size", "kvsim paper",
    "kvsim compare traces/sharegpt_2rps_10min.jsonl", "kvsim capacity --model llama-2-70b",
    "kvsim capacity --model opt-13b --kv-gib 12 --preset sharegpt --slo",
    "kvsim capacity traces/azure_conv_excerpt.jsonl", "kvsim run traces/sharegpt_2rps_10min.jsonl --model gemma",
    # whole reports and capacity searches of 3-6 s each (issue 36: the default suite in three minutes)
    "kvsim capacity --model llama-3-8b --gpu h100-80gb --preset sharegpt",
    "kvsim report traces/mooncake_conversation_excerpt.jsonl", "kvsim sweep traces/azure_conv_excerpt.jsonl --grid prefill_replicas",
)
#: Commands whose failure is a known open bug, with the issue that fixes it: they must fail (strict
#: xfail), so the entry goes as soon as the fix is merged.
KNOWN_BROKEN: dict[str, str] = {}


def commands(markdown: str) -> list[str]:
    """The commands of a Markdown text: lines of its non-Python code blocks that start with `kvsim` or
    `make` (continuation lines joined, comments dropped), then the backquoted `kvsim ...` table cells.

    >>> commands("```\\n# a\\nkvsim run t.jsonl \\\\\\n   --kv-gib 1   # note\\n```\\n| x | `kvsim trace stats t` |")
    ['kvsim run t.jsonl --kv-gib 1', 'kvsim trace stats t']
    """
    out = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", markdown, re.S | re.M):
        if lang == "python":
            continue
        for line in re.sub(r"\\\n\s*", "", body).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith(("kvsim ", "make ")):
                out.append(re.sub(r"\s+", " ", line))
    out += re.findall(r"^\|.*?`(kvsim [^`]+)`\s*\|\s*$", markdown, re.M)
    return out


def _optional(cmd: str) -> str:
    """`[--resume]` left out, `[--quick]` kept as `--quick`."""
    return re.sub(r"\s*\[([^\]]+)\]", lambda m: f" {m.group(1)}" if m.group(1) in KEEP_OPTIONAL else "", cmd)


CASES = [(doc, cmd) for doc in ("README.md", "reports/README.md") for cmd in commands((ROOT / doc).read_text())]
#: Prerequisites of commands that read what an earlier command of the README wrote.
NEEDS = {"kvsim run fewshot.jsonl": ("fewshot.jsonl", "kvsim trace gen --preset alpaca --rate 10 --duration 600 "
                                     "--shared-prefix 80 -o fewshot.jsonl"),
         "kvsim report --sweep out/sweep1": ("out/sweep1", "kvsim sweep --preset sharegpt --grid block_size=8,16,32 "
                                             "--grid allocator=paged,contiguous --set kv_gib=12 --set rate=2 "
                                             "--set duration_s=3600 -o out/sweep1")}


def _why_not(doc: str, cmd: str) -> str | None:
    if doc == "reports/README.md":
        return ("a shipped report's command: tests/e2e/test_report_freshness.py checks it is the `make reports` "
                "line and regenerates the small reports")
    return next((why for start, why in NOT_RUN.items() if cmd.startswith(start)), None)


@lru_cache(maxsize=1)
def _checkout() -> Path:
    """kvsim/ and traces/ copied to a fresh folder with nothing beside it (no ../shared)."""
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="kvsim-readme-")) / "kvsim-clone"
    for part in ("kvsim", "traces"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(cmd: str) -> subprocess.CompletedProcess:
    root = _checkout()
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "kvsim.cli.app", *shlex.split(_optional(cmd))[1:]], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)


def test_the_readmes_have_commands():
    assert len([c for d, c in CASES if d == "README.md"]) >= 25
    assert len([c for d, c in CASES if d == "reports/README.md"]) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("doc, cmd", [pytest.param(d, c, marks=[pytest.mark.long] if d == "README.md" and
                                                   c.startswith(LONG) else []) for d, c in CASES],
                         ids=[f"{d}:{c[:70]}" for d, c in CASES])
def test_readme_command_runs_in_a_fresh_clone(doc, cmd, request):
    why = _why_not(doc, cmd)
    if why:
        pytest.skip(why)
    if cmd in KNOWN_BROKEN:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_BROKEN[cmd]))
    for start, (path, first) in NEEDS.items():
        if cmd.startswith(start) and not (_checkout() / path).exists():
            assert _run(first).returncode == 0, first
    done = _run(cmd)
    assert done.returncode == 0, f"{doc}: `{cmd}` exited {done.returncode}:\n{done.stderr[-2000:]}"


def test_no_command_reads_the_shared_folder():
    """A fresh clone has no ../shared: no README command may name it."""
    assert [c for _, c in CASES if "../shared" in c] == []


_SKIP_CALL = re.compile(r"pytest\.(?:mark\.skipif|mark\.skip|skip|importorskip)\(")


def test_every_skip_in_the_suite_says_why():
    """Each `pytest.mark.skipif(...)` / `mark.skip(...)` names a `reason=`, each `pytest.skip(...)` and
    `importorskip(...)` a message, so `pytest -rs` tells a reader what was not tested and why."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        for m in _SKIP_CALL.finditer(text):
            depth, end = 0, m.end() - 1
            for end in range(m.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            args = text[m.end():end].strip()
            kind = m.group(0)
            ok = ("reason" in args) if ("mark." in kind or "importorskip" in kind) else bool(args)
            if not ok:
                bad.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {kind}{args})")
    assert bad == [], "skips without a reason:\n" + "\n".join(bad)


def test_the_readmes_cite_only_files_in_the_repository():
    """traces/README.md once pointed to a DESIGN.md that a clone does not have."""
    missing = []
    for doc in ("README.md", "reports/README.md", "traces/README.md"):
        for name in set(re.findall(r"[\w./-]+\.md\b", (ROOT / doc).read_text())):
            here = (ROOT / doc).parent
            if not any((base / name).exists() for base in (ROOT, here)) and not list(ROOT.rglob(name)):
                missing.append(f"{doc}: {name}")
    assert missing == []
