"""`kvsim harness bookkeeping`: timed block-table and allocation costs that the tuner reads."""

from typer.testing import CliRunner

from gpu_harness.cli import harness_app
from kvsim.planning import bookkeeping

runner = CliRunner()


def test_bookkeeping_command_writes_a_file_the_tuner_reads(tmp_path):
    out = tmp_path / "bk.json"
    result = runner.invoke(harness_app, ["bookkeeping", "--out", str(out)])
    assert result.exit_code == 0, result.output
    bk = bookkeeping.load(out)
    assert bk.entry_s > 0 and bk.alloc_free_s > 0 and bk.copy_bytes_per_s > 0
    assert "gpu_harness.bookkeeping on cpu" in bk.source
    # more entries cost more: the per-step cost grows as blocks get smaller
    assert bk.step_s(1000, 10) > bk.step_s(100, 1)
