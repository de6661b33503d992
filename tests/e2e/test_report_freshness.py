"""The shipped reports stay true: every folder under reports/ is made by one line of `make reports`,
records that command and the engine-profile set it ran with (`provenance.json`), is not older than the
current profile set, and the small ones regenerate to the committed numbers.

A failure here means the code moved on and the reports did not: run `make reports` and commit them.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvsim.planning.reports.provenance import PROVENANCE_FILE, command_line, profile_fingerprint

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
#: Reports known to be stale on this branch, with why. The freshness check skips them with that reason
#: and fails once one is fresh again, so the entry cannot outlive its cause.
KNOWN_STALE: dict[str, str] = {}
#: A file the commit recorded in a report's provenance must hold for the report to be fresh (the change
#: that made it stale): how a report made before that change is told apart. Async scheduling held finished
#: requests one step from settle.py on, which moved every vllm-v1 report.
STALE_BEFORE: dict[str, str] = dict.fromkeys(("block-size-alpaca", "block-size-sharegpt", "sweep-llama3-8b",
                                              "sharegpt-opt13b", "fleet-mooncake", "hybrid-models",
                                              "sim-to-real"), "kvsim/engine/batching/settle.py")
#: Reports a test regenerates whole (seconds each); the others are checked by provenance only.
SMALL = ("block-size-alpaca", "sweep-llama3-8b", "sharegpt-opt13b", "fleet-mooncake")
#: Of those, the ones the default suite regenerates (about 2 s each); the rest are release checks
#: (`pytest --long`), as whole-report regenerations of 4-7 s each.
QUICK = ("block-size-alpaca", "sweep-llama3-8b")


def make_reports() -> dict[str, list[str]]:
    """{report folder name: the commands of its Makefile line (the last one writes the folder), `$(KVSIM)`
    as `kvsim`, variables expanded}."""
    text = (ROOT / "Makefile").read_text()
    var = dict(re.findall(r"^(\w+) \?= (.*)$", text, re.M))
    recipe = re.search(r"^reports:.*\n((?:\t.*\n)+)", text, re.M).group(1).replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in recipe.splitlines():
        cmds, target = [], None
        for cmd in (c.strip() for c in line.strip().split("&&")):
            cmd = re.sub(r"\$\((\w+)\)", lambda m: "kvsim" if m.group(1) == "KVSIM" else var[m.group(1)], cmd)
            if not cmd.startswith("kvsim "):
                continue
            args = shlex.split(cmd)
            cmds.append(command_line(["kvsim", *args[1:]]))
            out_dir = next((args[i + 1] for i, a in enumerate(args) if a in ("-o", "--out", "--report")),
                           "reports/vllm-paper" if args[1] == "paper" else None)
            if out_dir and out_dir.startswith("reports/"):
                target = out_dir.removeprefix("reports/")
        if target:
            out[target] = cmds
    return out


def test_every_shipped_report_has_one_make_reports_line_and_a_readme_row():
    made = make_reports()
    shipped = sorted(p.name for p in REPORTS.iterdir() if p.is_dir())
    assert sorted(made) == shipped, "every folder under reports/ needs its line in `make reports`, and back"
    readme = (REPORTS / "README.md").read_text()
    for name, cmds in made.items():
        cmd = cmds[-1]
        assert f"`{name}/`" in readme, f"reports/README.md does not list {name}/"
        assert cmd in readme, f"reports/README.md's command for {name}/ differs from the Makefile's: {cmd}"


@pytest.mark.parametrize("name", sorted(make_reports()))
def test_shipped_report_was_made_by_its_command_with_the_current_engine_profiles(name):
    record_file = REPORTS / name / PROVENANCE_FILE
    cmd = make_reports()[name][-1]
    problems = []
    if not record_file.exists():
        problems.append(f"reports/{name} records no provenance ({PROVENANCE_FILE})")
    else:
        record = json.loads(record_file.read_text())
        if record["engine_profiles"] != profile_fingerprint():
            problems.append(f"reports/{name} was made with engine-profile set {record['engine_profiles']}, "
                            f"the code has {profile_fingerprint()}")
        if record["command"] != cmd:
            problems.append(f"reports/{name} was made by `{record['command']}`, the Makefile says `{cmd}`")
        if record.get("dirty"):
            problems.append(f"reports/{name} was made from a tree with uncommitted changes")
        needed = STALE_BEFORE.get(name)
        if needed and record.get("commit") and subprocess.run(
                ["git", "cat-file", "-e", f"{record['commit']}:{needed}"], cwd=ROOT, capture_output=True).returncode:
            problems.append(f"reports/{name} was made at {record['commit'][:12]}, before {needed} existed")
        md = (REPORTS / name / "report.md").read_text()
        if record["engine_profiles"] not in md:
            problems.append(f"reports/{name}/report.md does not state its provenance")
    if name in KNOWN_STALE:
        assert problems, f"reports/{name} is fresh now: remove it from KNOWN_STALE"
        pytest.skip(f"known stale: {KNOWN_STALE[name]} ({problems[0]})")
    assert not problems, "; ".join(problems) + ": run `make reports` and commit reports/"


def _numbers(folder: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_csv(p) for p in sorted((folder / "data").glob("*.csv"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.long) for n in SMALL])
def test_small_report_regenerates_to_the_committed_numbers(name, tmp_path):
    """Run the report's Makefile line into a temporary folder: every table matches the committed one
    (wall-clock columns aside)."""
    if name in KNOWN_STALE:
        pytest.skip(f"known stale: {KNOWN_STALE[name]}")
    sweep = tmp_path / "sweep"
    for cmd in make_reports()[name]:
        args = shlex.split(cmd)[1:]
        args = [str(tmp_path / "r") if a == f"reports/{name}" else str(sweep) if a.startswith("/tmp/") else a
                for a in args]
        done = subprocess.run([sys.executable, "-m", "kvsim.cli.app", *args], cwd=ROOT, capture_output=True,
                              text=True)
        assert done.returncode == 0, f"{cmd}: {done.stderr[-2000:]}"
    new, old = _numbers(tmp_path / "r"), _numbers(REPORTS / name)
    assert sorted(new) == sorted(old)
    for table in old:
        keep = [c for c in old[table].columns if "wall" not in c]
        pd.testing.assert_frame_equal(new[table][keep], old[table][keep], check_exact=False, rtol=1e-9,
                                      obj=f"reports/{name}/data/{table} (run `make reports`)")
