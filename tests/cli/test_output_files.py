"""Output files are written whole or not at all, summary.json last: an error or Ctrl-C at any point
leaves no result folder that looks complete (kvsim.files)."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import kvsim.cli.app
import kvsim.engine.sim
import kvsim.files
from kvsim.cli.app import app
from kvsim.files import INCOMPLETE_MARKER, atomic_write, is_complete_result, write_text_atomic

TINY = Path(__file__).resolve().parents[2] / "traces" / "tiny.jsonl"
runner = CliRunner()


def test_atomic_write_keeps_the_old_file_on_error(tmp_path):
    target = tmp_path / "t.txt"
    write_text_atomic(target, "old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as f:
            f.write("half of the new")
            raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]      # no temporary left behind


def _run(out: Path, extra=()):
    return runner.invoke(app, ["run", str(TINY), "--kv-gib", "1", "--quiet", "--out", str(out), *extra])


def _complete_and_consistent(out: Path) -> bool:
    if not is_complete_result(out):
        return False
    summary = json.loads((out / "summary.json").read_text())
    assert len(pd.read_csv(out / "requests.csv")) == summary["requests_total"]
    assert len(pd.read_csv(out / "steps.csv")) == summary["engine_steps"]
    assert json.loads((out / "config.json").read_text())["cache"]["kv_gib"] == 1
    return True


def test_a_finished_run_is_complete_with_summary_written_last(tmp_path, monkeypatch):
    renamed = []
    real = os.replace
    monkeypatch.setattr(kvsim.files.os, "replace", lambda a, b: (renamed.append(Path(b).name), real(a, b)))
    assert _run(tmp_path / "r").exit_code == 0
    assert renamed == [INCOMPLETE_MARKER, "steps.csv", "requests.csv", "config.json", "summary.json"]
    assert _complete_and_consistent(tmp_path / "r")


@pytest.mark.parametrize("earlier_result", [False, True])
def test_ctrl_c_at_any_write_leaves_no_folder_that_looks_complete(tmp_path, monkeypatch, earlier_result):
    """Interrupt at each rename, inside each file's write, and at the marker's removal."""
    real_replace, real_unlink, real_to_csv = os.replace, Path.unlink, pd.DataFrame.to_csv
    points = [("replace", k) for k in range(5)] + [("to_csv", 0), ("unlink", 0)]   # steps.csv streams
    for where, k in points:
        out = tmp_path / f"{where}{k}"
        if earlier_result:
            assert _run(out).exit_code == 0
            before = {p.name: p.read_bytes() for p in out.iterdir()}
        calls = {"replace": 0, "to_csv": 0, "unlink": 0}

        def hit(kind):
            calls[kind] += 1
            if kind == where and calls[kind] == k + 1:
                raise KeyboardInterrupt

        def replace(a, b):
            hit("replace")
            real_replace(a, b)

        def to_csv(frame, f, **kw):
            f.write("id,arrival_s\n1,")             # part of a table, then Ctrl-C
            hit("to_csv")
            real_to_csv(frame, f, **kw)

        def unlink(path, missing_ok=False):
            if path.name == INCOMPLETE_MARKER:
                hit("unlink")
            real_unlink(path, missing_ok=missing_ok)

        with monkeypatch.context() as m:
            m.setattr(kvsim.files.os, "replace", replace)
            m.setattr(pd.DataFrame, "to_csv", to_csv)
            m.setattr(Path, "unlink", unlink)
            res = _run(out)
        assert res.exit_code == 130, (where, k, res.output)      # Ctrl-C: 128 + SIGINT
        assert not any(p.name.endswith(".tmp") for p in out.iterdir())
        if _complete_and_consistent(out):          # only when nothing was replaced yet: the earlier run
            assert earlier_result and where == "replace" and k == 0
            assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        else:
            assert (out / INCOMPLETE_MARKER).exists() or not (out / "summary.json").exists()


def test_ctrl_c_while_simulating_creates_no_folder(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(kvsim.engine.sim, "simulate", interrupted)
    res = _run(tmp_path / "never", ["--json", str(tmp_path / "s.json")])
    assert res.exit_code == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_ctrl_c_after_steps_were_streamed_leaves_no_temporary_file(tmp_path, monkeypatch):
    """steps.csv streams to a temporary file during the run; Ctrl-C mid-run removes it."""
    import numpy as np

    def interrupted(*a, step_sink=None, **k):
        step_sink({"time_s": np.array([0.5]), "batch_size": np.array([3])})   # one chunk streamed
        assert any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))
        raise KeyboardInterrupt
    monkeypatch.setattr(kvsim.engine.sim, "simulate", interrupted)
    res = _run(tmp_path / "out")
    assert res.exit_code == 130
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []


def test_json_outputs_are_whole(tmp_path, monkeypatch):
    s = tmp_path / "s.json"
    write_text_atomic(s, "previous")
    real = os.replace

    def interrupted(a, b):
        raise KeyboardInterrupt
    monkeypatch.setattr(kvsim.files.os, "replace", interrupted)
    res = runner.invoke(app, ["run", str(TINY), "--kv-gib", "1", "--quiet", "--json", str(s)])
    assert res.exit_code == 130 and s.read_text() == "previous"
    monkeypatch.setattr(kvsim.files.os, "replace", real)
    res = runner.invoke(app, ["compare", str(TINY), "--kv-gib", "1", "--quiet", "--json", str(s)])
    assert res.exit_code == 0 and len(json.loads(s.read_text())) == 5
