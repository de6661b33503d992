"""`kvsim --help` stays light: no numpy, pandas, rich, SimPy or torch until a command needs them;
the help texts' spelled-out names match the modules they stand for."""

import subprocess
import sys
from pathlib import Path

from kvsim import cli_trace
from kvsim.trace_formats import FORMATS
from kvsim.tracegen import PRESETS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pandas", "rich", "simpy", "torch", "triton")


def test_help_loads_no_heavy_module():
    code = ("import sys\nfrom typer.testing import CliRunner\nimport kvsim.cli\n"
            "for args in (['--help'], ['run', '--help'], ['trace', 'gen', '--help'], ['harness', '--help']):\n"
            "    assert CliRunner().invoke(kvsim.cli.app, args).exit_code == 0, args\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT), "PATH": ""}).stdout
    assert out.strip() == "[]"


def test_help_names_match_the_modules():
    assert cli_trace.FORMAT_NAMES == FORMATS
    assert cli_trace.PRESET_NAMES == tuple(PRESETS)
