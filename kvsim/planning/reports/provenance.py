"""Where a report came from: the kvsim version (the git commit and whether the tree had uncommitted
changes, when kvsim runs from a checkout), the exact command, and a fingerprint of the engine-profile
set, so that a report made before the profiles changed can be found stale (tests/e2e/test_report_freshness.py).

The fingerprint is a hash of every named engine profile's fields (`kvsim.cost.profiles.PROFILES`, the
`source` text excepted) and the default profile's name: it changes exactly when a profile's policy or CPU
constants change, which changes the numbers a report shows.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

#: The file every report folder carries (`kvsim.write_report`).
PROVENANCE_FILE = "provenance.json"
#: The repository root when kvsim runs from a checkout (kvsim/planning/reports/provenance.py -> ../../../).
_ROOT = Path(__file__).resolve().parents[3]


def profile_fingerprint() -> str:
    """12 hex digits identifying the engine-profile set (fields of every named profile, default name).

    >>> len(profile_fingerprint()), profile_fingerprint() == profile_fingerprint()
    (12, True)
    """
    from kvsim.cost.profiles import DEFAULT_PROFILE, PROFILES
    fields = {name: {k: v for k, v in p.to_dict().items() if k != "source"} for name, p in PROFILES.items()}
    text = json.dumps({"default": DEFAULT_PROFILE, "profiles": fields}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def kvsim_version() -> dict:
    """{"version": package version, "commit": git commit or None, "dirty": uncommitted changes outside
    reports/ (None outside a checkout)}. Changes under reports/ do not count: `make reports` rewrites
    them one after another."""
    try:
        version = metadata.version("kvsim")
    except metadata.PackageNotFoundError:
        version = "unknown"
    commit = _git("rev-parse", "HEAD") if (_ROOT / ".git").exists() else None
    dirty = None
    if commit is not None:
        status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports")
        dirty = bool(status) if status is not None else None
    return {"version": version, "commit": commit, "dirty": dirty}


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a user would type it: `kvsim ARGS` for the CLI (also when run as
    `python -m kvsim.cli.app`), else the Python program and its arguments.

    >>> command_line(["/venv/bin/kvsim", "report", "t.jsonl", "--title", "a b"])
    "kvsim report t.jsonl --title 'a b'"
    """
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else ""
    if prog in ("kvsim", "app.py") or argv[0].endswith("kvsim/cli/app.py"):
        return shlex.join(["kvsim", *argv[1:]])
    return "python " + shlex.join(argv) if argv and argv[0] else "python (interactive)"


def provenance(command: str | None = None) -> dict:
    """The record a report carries: version, commit, dirty, command, engine-profile fingerprint."""
    return {**kvsim_version(), "command": command or command_line(),
            "engine_profiles": profile_fingerprint()}


def describe(record: dict) -> str:
    """One Markdown sentence saying how a report was made."""
    commit = record.get("commit")
    where = (f"commit `{commit[:12]}`" + (" with uncommitted changes" if record.get("dirty") else "")
             if commit else "not a git checkout")
    return (f"Made by `{record['command']}` with kvsim {record['version']} ({where}); engine-profile set "
            f"`{record['engine_profiles']}`. Regenerate every shipped report with `make reports`.")
