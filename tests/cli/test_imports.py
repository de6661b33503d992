"""`kvsim --help` stays light: no numpy, pandas, rich, SimPy or torch until a command needs them;
the help texts' spelled-out names match the modules they stand for."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.cli.commands import trace as cli_trace
from kvsim.trace.formats import FORMATS
from kvsim.trace.synthetic import PRESETS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "pandas", "rich", "simpy", "torch", "triton")


def test_help_loads_no_heavy_module():
    code = ("import sys\nfrom typer.testing import CliRunner\nimport kvsim.cli.app\n"
            "for args in (['--help'], ['run', '--help'], ['trace', 'gen', '--help'], ['harness', '--help']):\n"
            "    assert CliRunner().invoke(kvsim.cli.app.app, args).exit_code == 0, args\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT), "PATH": ""}).stdout
    assert out.strip() == "[]"


def test_a_quiet_run_loads_neither_rich_nor_pandas(tmp_path):
    """`kvsim run --quiet` prints nothing, so rich (about 40 ms of a process's start) stays unloaded, as
    does pandas; the summary is still written whole, and an error still prints through rich. Nor does a
    run of a plain model load the hybrid manager, or numpy's masked arrays (`numpy.percentile`'s first
    call: kvsim.engine.quantiles)."""
    code = ("import sys\nfrom kvsim.cli.entry import main\nsys.argv = sys.argv[:1] + sys.argv[2:]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, file=sys.stderr)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})), "
            "[m for m in ('kvsim.alloc.hybrid', 'numpy.ma') if m in sys.modules])")
    out = tmp_path / "s.json"
    trace = ROOT / "traces" / "sharegpt_2rps_10min.jsonl"
    run = subprocess.run([sys.executable, "-c", code, "kvsim", "run", str(trace),
                          "--max-requests", "20", "--quiet", "--json", str(out)], cwd=ROOT, text=True,
                         capture_output=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert run.stdout.strip() == "['numpy', 'simpy'] []", run.stderr
    assert json.loads(out.read_text())["requests_total"] == 20
    bad = subprocess.run([sys.executable, "-c", code, "kvsim", "run", str(tmp_path / "missing.jsonl"), "--quiet"],
                         cwd=ROOT, text=True, capture_output=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert "error:" in bad.stderr and "missing.jsonl" in bad.stderr and "Traceback" not in bad.stderr
    assert "rich" in bad.stdout


def test_the_command_line_starts_numpy_with_one_openblas_thread_unless_told_otherwise():
    """`kvsim.cli` asks OpenBLAS for one thread before numpy loads (the process then has one thread,
    where numpy alone starts one per core); a user's own OPENBLAS_NUM_THREADS wins."""
    code = ("import re\nimport kvsim.cli\nimport numpy\nimport os\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], "
            "re.search(r'Threads:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
    env = {"PYTHONPATH": str(ROOT), "PATH": ""}
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc/self/status to count the process's threads")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True, capture_output=True, env=env)
    assert out.stdout.split() == ["1", "1"]
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True, capture_output=True,
                         env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert out.stdout.split()[0] == "2"


def test_help_names_match_the_modules():
    assert cli_trace.FORMAT_NAMES == FORMATS
    assert cli_trace.PRESET_NAMES == tuple(PRESETS)


def test_lazy_commands_are_listed_as_if_loaded():
    """`kvsim --help` lists the lazy commands from kvsim.cli.lazy.LAZY without importing them; at
    every width the list must read exactly as it does once every command is loaded."""
    code = ("import sys\nfrom typer.testing import CliRunner\nimport typer.main\nimport kvsim.cli.app\n"
            "from kvsim.cli.lazy import LAZY\n"
            "group = typer.main.get_command(kvsim.cli.app.app)\n"
            "def listing(width):\n"
            "    ctx = group.make_context('kvsim', [], max_content_width=width, resilient_parsing=True)\n"
            "    return group.get_help(ctx)\n"
            "lazy = [listing(w) for w in (60, 80, 200)]\n"
            "assert not {'kvsim.cli.commands.plan', 'kvsim.cli.commands.report', 'kvsim.cli.commands.trace', 'gpu_harness.cli'}"
            " & set(sys.modules)\n"
            "for name in LAZY:\n"
            "    group.get_command(None, name)\n"
            "assert 'kvsim.cli.commands.plan' in sys.modules\n"
            "loaded = [listing(w) for w in (60, 80, 200)]\n"
            "assert lazy == loaded, (lazy, loaded)\n"
            "print(lazy[2])\nprint(len(lazy[2].splitlines()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT), "PATH": "",
                                                      "COLUMNS": "200"}).stdout
    lines = out.splitlines()
    assert "meeting it, its latency-against-rate curve" in out   # the widest list shows long summaries
    assert int(lines[-1]) == 22   # usage, text, options and the fourteen commands, with blank lines between


def test_lazy_command_runs_and_reports_bad_input():
    """A lazily loaded command runs under the root's error policy: bad input is one line, exit 2."""
    from typer.testing import CliRunner
    import kvsim.cli.app
    result = CliRunner().invoke(kvsim.cli.app.app, ["trace", "stats", "no-such-file.jsonl"])
    assert result.exit_code == 2
    assert "no-such-file.jsonl" in result.output and "Traceback" not in result.output


def test_a_rate_search_loads_no_pandas_and_writes_what_pandas_would(tmp_path):
    """`kvsim capacity --slo` prints and writes its rows without pandas (with pyarrow, about 0.4 s of a
    2 s search); its JSON's static table and curve are the records pandas makes of the same rows
    (`kvsim.static_capacity`, `RateResult.curve`), run times aside."""
    import pandas as pd

    import kvsim

    code = ("import sys\nfrom kvsim.cli.entry import main\nsys.argv = sys.argv[:1] + sys.argv[2:]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, file=sys.stderr)\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = tmp_path / "c.json"
    args = dict(preset="alpaca", duration_s=30.0, rel_tol=0.2, workers=1, kv_gib=1.0,   # floats, as typer gives
                max_span_s=30.0)
    run = subprocess.run([sys.executable, "-c", code, "kvsim", "capacity", "--kv-gib", "1", "--preset", "alpaca",
                          "--duration", "30", "--max-span", "30", "--rel-tol", "0.2", "--slo", "ttft_p99=1", "--workers", "1",
                          "--json", str(out)], cwd=ROOT, text=True, capture_output=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    loaded = run.stdout.strip().splitlines()[-1]
    assert "'rich'" in loaded and "pandas" not in loaded, run.stderr
    got = json.loads(out.read_text())
    static = kvsim.static_capacity(lengths="alpaca", kv_gib=1.0).to_dict("records")
    from kvsim.files import strict_json       # (the file is strict JSON: NaN/Infinity -> null + a reason)
    assert json.dumps(got["static"]) == json.dumps(json.loads(strict_json(static)))
    res = kvsim.max_rate({"ttft_p99": 1}, **args)
    curve = pd.DataFrame(res.rows).drop(columns=["wall_s", "sim_wall_s"]).to_dict("records")
    assert json.dumps([{k: v for k, v in r.items() if k not in ("wall_s", "sim_wall_s")}
                       for r in got["rate"]["curve"]]) == json.dumps(json.loads(strict_json(curve)))
    assert got["rate"]["rate_rps"] == res.rate_rps and len(curve) >= 3
