"""Sweeps under faults: SIGKILL of the sweep process (no worker may outlive it), two sweeps on one
folder (the second refused, naming the first's pid; a dead holder's lock taken over), `--ray` without
Ray (the install hint intact, nothing written)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from kvsim.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()
CHEAP = ["--preset", "alpaca", "--grid", "block_size=16", "--set", "kv_gib=12", "--set", "num_requests=5",
         "--workers", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_long_sweep(tmp_path: Path, out: Path) -> subprocess.Popen:
    """A sweep of four points of about a minute each on two workers (still running when it is killed),
    in its own session (a kill of its pid alone, not of a process group)."""
    cmd = [sys.executable, "-m", "kvsim.cli.app", "sweep", "--preset", "sharegpt", "--grid",
           "block_size=8,16,32,64", "--set", "kv_gib=12", "--set", "rate=4", "--set", "duration_s=3600",
           "--workers", "2", "-o", str(out)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: len(children(proc.pid)) >= 2, 180), "the sweep started no workers"
    return proc


def kill_all(proc: subprocess.Popen, workers: list[int]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    for w in workers:
        if alive(w):
            os.kill(w, signal.SIGKILL)


def test_sigkill_of_the_sweep_leaves_no_worker(tmp_path):
    proc = start_long_sweep(tmp_path, tmp_path / "sw")
    workers = children(proc.pid)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        left = [w for w in workers if not wait_for(lambda w=w: not alive(w), 10)]
        assert not left, f"workers {left} outlived the SIGKILLed sweep"
    finally:
        kill_all(proc, workers)


def test_second_sweep_on_a_busy_folder_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    out = tmp_path / "sw"
    proc = start_long_sweep(tmp_path, out)
    workers = children(proc.pid)
    try:
        assert wait_for(lambda: (out / ".sweep.lock").exists(), 10)
        r = invoke("sweep", *CHEAP, "--resume", "-o", out)
        assert r.exit_code == 2, r.output
        assert f"pid {proc.pid}" in r.output and "Traceback" not in r.output
    finally:
        kill_all(proc, workers)
    r = invoke("sweep", *CHEAP, "--resume", "-o", out)
    assert r.exit_code == 0, r.output
    assert f"took over the lock of sweep pid {proc.pid}" in r.output
    assert pd.read_parquet(out / "results.parquet").status.tolist() == ["ok"]
    assert not (out / ".sweep.lock").exists()


def test_lock_file_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "sw"
    out.mkdir()
    (out / ".sweep.lock").write_text(f"{dead.pid}\n")
    r = invoke("sweep", *CHEAP, "-o", out)
    assert r.exit_code == 0, r.output
    assert f"took over the lock of sweep pid {dead.pid}" in r.output


def test_ray_missing_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` raises ImportError
    out = tmp_path / "r"
    for _ in range(2):                                   # the rerun gets the same answer
        r = invoke("sweep", *CHEAP, "--ray", "-o", out)
        assert r.exit_code == 2, r.output
        assert "pip install 'kvsim[dist]'" in r.output and "Traceback" not in r.output
        assert not out.exists()


def test_grid_of_traces_runs_each_trace(tmp_path):
    r = invoke("sweep", "--grid", f"trace={ROOT / 'traces/tiny.jsonl'},{ROOT / 'traces/azure_conv_excerpt.jsonl'}",
               "--set", "kv_gib=12", "--set", "max_requests=4", "--workers", "1", "-o", tmp_path / "t")
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(tmp_path / "t" / "results.parquet")
    assert df.status.tolist() == ["ok", "ok"] and df.requests_total.tolist() == [4, 4]
    assert [Path(t).name for t in df.trace] == ["tiny.jsonl", "azure_conv_excerpt.jsonl"]
    assert "best (lowest normalized latency)" in r.output and "2 run, 0 resumed, 0 failed" in r.output


def test_bad_grids_exit_2_before_anything_is_written(tmp_path):
    out = tmp_path / "bad"
    for args, msg in ((["--grid", "block_size=abc,16"], "grid key block_size: 'abc' is not a whole number"),
                      (["--grid", "block_size=8", "--grid", "block-size=16"], "--grid block_size is given twice"),
                      (["--grid", "tp=1", "--grid", "tensor_parallel_size=2"], "--grid tp is given twice"),
                      (["--grid", "block_size=16,16.0"], "lists 16 twice"),
                      (["--grid", "block_size=8", "--set", "block-size=16"], "in both --grid and --set"),
                      (["--grid", "gpu_mem_util=0.9,nan"], "not a finite number"),
                      (["--grid", "rate=0"], "grid key rate: 0 must be > 0"),
                      (["--grid", "preset=alpaca"], "--preset or --grid preset, not both"),
                      (["--grid", "max_requests=3"], "a preset takes num_requests"),
                      (["--grid", "num_requests=5000000"], "ceiling of 1,000,000")):
        r = invoke("sweep", "--preset", "alpaca", "--set", "kv_gib=12", *args, "-o", out)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and "Traceback" not in r.output, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
    for args, msg in ((["--grid", "preset=alpaca,nope"], "unknown preset 'nope'"),
                      (["--grid", f"trace={tmp_path / 'missing.jsonl'}"], "missing.jsonl"),
                      (["--grid", "preset=alpaca", "--grid", f"trace={ROOT / 'traces/tiny.jsonl'}"],
                       "give a trace or a preset, not both")):
        r = invoke("sweep", "--set", "kv_gib=12", *args, "-o", out)
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, (args, r.output)
    assert not out.exists()


def test_a_full_disk_names_the_file_and_the_resume_drops_the_torn_row(tmp_path):
    """rows.jsonl on a file-size limit (RLIMIT_FSIZE, as a full disk: writes fail part-way): one line
    naming the file, exit 2; the resume drops the cut-off row and finishes the grid. Temporary files of
    killed runs are removed."""
    import resource

    out = tmp_path / "s"
    args = ["sweep", "--preset", "alpaca", "--grid", "block_size=16,32,64,128", "--set", "kv_gib=12",
            "--set", "num_requests=5", "--workers", "1", "-o", str(out)]

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (5000, 5000))   # two rows and part of a third

    r = subprocess.run([sys.executable, "-m", "kvsim.cli.app", *args], cwd=tmp_path, preexec_fn=limit,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    said = [line for line in r.stderr.splitlines() if not line.startswith("sweep: ")]   # (progress lines)
    assert len(said) == 1 and f"{out / 'rows.jsonl'}: cannot write: File too large" in r.stderr
    assert not (out / "results.parquet").exists()
    text = (out / "rows.jsonl").read_text()
    assert len(text) == 5000 and not text.endswith("\n")
    (out / ".results.parquet.tmp").write_text("left by an older kvsim")
    (out / ".rows.jsonl.x1y2.tmp").write_text("left by a killed run")

    r = invoke(*args, "--resume")
    assert r.exit_code == 0, r.output
    assert "line 3 is cut off (an interrupted write); dropped" in r.output
    assert "2 run, 2 resumed, 0 failed" in r.output
    assert pd.read_parquet(out / "results.parquet").requests_finished.tolist() == [5, 5, 5, 5]
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.parquet", "rows.jsonl"]
