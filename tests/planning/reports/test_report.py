"""Reports: the folder writer (whole or nothing, refuses an existing folder), figures, and the report,
tune-block-size and paper commands end to end, bad input included."""

import base64
import re

import pandas as pd
import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

import kvsim
from kvsim.cli.app import app
from kvsim.planning.reports import figures
from kvsim.planning.paper.experiments import QUICK, capacity, run_paper
from kvsim.planning.paper.report import paper_report
from kvsim.planning.reports.document import Report, ReportExistsError, write_report
from kvsim.planning.reports.build import sweep_report

runner = CliRunner()


def _small_report() -> Report:
    rep = Report("T")
    rep.heading("H")
    rep.paragraph("text with `code` and **bold**\n- item one\n- item two")
    rep.table("tab", pd.DataFrame({"a": [1, 2], "b": [0.123456, float("nan")]}), "caption")
    rep.figure("fig", figures.bars({"x": 1.0, "y": 2.0}, "n", "bars"))
    return rep


def test_report_folder_markdown_html_and_data(tmp_path):
    out = write_report(_small_report(), tmp_path / "r")
    md = (out / "report.md").read_text()
    assert "| a | b |\n|---|---|\n| 1 | 0.1235 |\n| 2 | - |" in md
    assert "![caption](figures/fig.png)" not in md and "![fig](figures/fig.png)" in md
    html = (out / "report.html").read_text()
    png = (out / "figures" / "fig.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    # self-contained: the figure is inlined, nothing is loaded from elsewhere
    assert base64.b64encode(png).decode() in html
    assert not re.search(r'src="(?!data:)', html)
    assert "<code>code</code>" in html and "<b>bold</b>" in html and "<li>item two</li>" in html
    assert pd.read_csv(out / "data" / "tab.csv").a.tolist() == [1, 2]


def test_existing_folder_is_refused_unless_forced(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ReportExistsError, match="exists"):
        write_report(_small_report(), out)
    assert (out / "keep.txt").exists()
    write_report(_small_report(), out, force=True)
    assert not (out / "keep.txt").exists() and (out / "report.html").exists()


def test_failed_write_leaves_nothing(tmp_path):
    rep = _small_report()
    rep.figure("bad", object())            # not a figure: rendering fails half way
    with pytest.raises(Exception):
        write_report(rep, tmp_path / "r")
    assert list(tmp_path.iterdir()) == []


def test_memory_breakdown_stacks_the_five_states_to_capacity():
    fr = {"paged": {"token_states": 0.5, "reserved": 0.1, "internal_fragmentation": 0.0,
                    "external_fragmentation": 0.0, "free": 0.4}}
    fig = figures.memory_breakdown(fr)
    assert isinstance(fig, Figure)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == pytest.approx([50, 10, 0, 0, 40])
    assert figures.allocated_share(fr["paged"])["token_states"] == pytest.approx(0.5 / 0.6)


def test_capacity_interpolates_the_knee():
    curve = pd.DataFrame({"rate": [1.0, 2.0, 4.0], "normalized_latency_s_per_token": [0.02, 0.03, 0.07]})
    assert capacity(curve, 0.05) == pytest.approx(3.0)      # 0.03 -> 0.07 crosses 0.05 half way
    assert capacity(curve, 0.10) == 4.0
    assert capacity(curve, 0.01) == 0.0


def test_sweep_report_from_a_sweep_table(tmp_path):
    df = kvsim.run_sweep({"block_size": [4, 64], "rate": [2, 8]}, base={"kv_gib": 2, "preset": "alpaca",
                                                                       "num_requests": 40}, workers=1)
    rep = sweep_report(df)
    names = [b[1] for b in rep.blocks if b[0] == "f"]
    assert names == ["latency_vs_rate", "block_size", "memory_breakdown"] + (
        ["preemptions"] if df.preemptions.any() else [])
    out = write_report(rep, tmp_path / "s")
    assert "varying: `rate`, `block_size`" in (out / "report.md").read_text()


def test_paper_quick_writes_every_section(tmp_path):
    from dataclasses import replace
    res = run_paper(replace(QUICK, variants=("low",)), workers=1)
    assert list(res.variants) == ["vllm-2023:low"] and len(res.variants["vllm-2023:low"]) == 3
    assert set(res.curves.system) >= {"vLLM (paged)", "Orca (Oracle)", "Orca (Pow2)", "Orca (Max)",
                                      "FasterTransformer (static)"}
    caps = res.capacities.set_index(["preset", "system"]).capacity_rps
    # memory-bound ShareGPT-like at 3 req/s: paged keeps the highest capacity, max the lowest
    assert caps["sharegpt", "vLLM (paged)"] >= caps["sharegpt", "Orca (Oracle)"] >= caps["sharegpt", "Orca (Max)"]
    out = write_report(paper_report(res), tmp_path / "p")
    md = (out / "report.md").read_text()
    for heading in ("Capacity", "Memory breakdown", "Block size", "Recompute against swap", "Published",
                    "Where we differ", "CPU-time variants", "ShareGPT capacity paged / oracle", "1.7x-2.7x"):
        assert heading in md


def test_cli_tune_block_size_and_bad_input(tmp_path):
    res = runner.invoke(app, ["tune-block-size", "--preset", "alpaca", "--rate", "10", "--num-requests", "60",
                              "--kv-gib", "1", "--block-sizes", "4,16,64", "--workers", "1",
                              "--json", str(tmp_path / "t.json"), "--report", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert "recommended block size" in res.output
    assert (tmp_path / "rep" / "report.html").exists() and (tmp_path / "t.json").exists()
    bad = runner.invoke(app, ["tune-block-size", "--preset", "alpaca", "--block-sizes", "4,x"])
    assert bad.exit_code == 2 and "--block-sizes" in bad.output
    again = runner.invoke(app, ["tune-block-size", "--preset", "alpaca", "--report", str(tmp_path / "rep")])
    assert again.exit_code == 2 and "exists" in again.output


def test_cli_report_refuses_existing_folder_and_reports_a_sweep(tmp_path):
    (tmp_path / "r").mkdir()
    res = runner.invoke(app, ["report", "--preset", "alpaca", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--force" in res.output
    res = runner.invoke(app, ["report", "--sweep", str(tmp_path / "missing"), "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "no sweep table" in res.output
    res = runner.invoke(app, ["report", "--preset", "alpaca", "--num-requests", "40", "--kv-gib", "1",
                              "--rates", "5,20", "--block-sizes", "", "--workers", "1", "-o",
                              str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "t" / "report.md").read_text()
    assert "Latency against request rate" in md and "Block size" not in md
    res = runner.invoke(app, ["paper", "--quick", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2 and "exists" in res.output


def test_hybrid_study_quick_report(tmp_path):
    """`kvsim hybrid-study --quick`: gpt-oss-120b's start-up figures are vLLM's (one group of 36 layers
    against two of 18 over the same memory) and uniform pages hold more KV per running request."""
    out = tmp_path / "hyb"
    res = CliRunner().invoke(app, ["hybrid-study", "--quick", "-o", str(out)])
    assert res.exit_code == 0, res.output
    runs = pd.read_csv(out / "data" / "runs.csv").set_index("system")
    startup = pd.read_csv(out / "data" / "startup.csv").set_index("system")
    assert startup.loc["vLLM hybrid manager", "kv_tokens"] > startup.loc["uniform pages", "kv_tokens"]
    assert runs.loc["vLLM hybrid manager", "waste_vs_hybrid"] == 0
    assert 0.2 < runs.loc["uniform pages", "waste_vs_hybrid"] < 0.6
    assert "Jenga" in (out / "report.md").read_text()
    res = CliRunner().invoke(app, ["hybrid-study", "--quick", "-o", str(out)])
    assert res.exit_code == 2 and "exists" in res.output
    res = CliRunner().invoke(app, ["hybrid-study", "--duration", "0", "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--duration" in res.output


def test_a_report_without_preemptions_says_so_instead_of_an_empty_chart():
    """Two runs with 1 GiB of KV for 5 Alpaca-like requests (~80 tokens each at 800 KiB/token for
    OPT-13B: 1,310 slots): the cache never fills, so no preemption, and the report has no chart of zeros."""
    df = kvsim.run_sweep({"block_size": [8, 16]}, base={"kv_gib": 1, "preset": "alpaca", "num_requests": 5},
                         workers=1)
    assert (df.preemptions == 0).all()
    rep = sweep_report(df)
    assert "preemptions" not in [b[1] for b in rep.blocks if b[0] == "f"]
    assert any(b[0] == "p" and b[1].startswith("No preemptions in any of the 2 runs") for b in rep.blocks)
    fig = kvsim.plot_preemptions({"a": 0, "b": 0})
    assert len(fig.axes[0].patches) == 0 and fig.axes[0].texts[0].get_text() == "no preemptions in any run"


def test_report_tables_print_fractions_as_percentages_and_never_an_exponent(tmp_path):
    """The values the issue found in shipped tables: 4.399e-06 as a fraction column, 15273.75 entries."""
    rep = Report("T")
    rep.table("t", pd.DataFrame({"block_size": [1], "waste_fraction": [4.399e-06],
                                 "gather_fraction": [0.2874], "block_table_entries": [15273.75],
                                 "latency_s_per_token": [0.0000312]}))
    md = write_report(rep, tmp_path / "t").joinpath("report.md").read_text()
    assert "| 1 | <0.01% | 28.7% | 15,274 | 0.000031 |" in md
    assert "e-0" not in md and "e+0" not in md


def test_sweep_legends_and_labels_name_what_varies():
    df = pd.DataFrame({"block_size": [16, 16, 128, 128], "rate": [2, 4, 2, 4],
                       "normalized_latency_s_per_token": [0.01, 0.02, 0.01, 0.03]})
    ax = figures.metric_lines(df, "rate", "normalized_latency_s_per_token", hue=["block_size"]).axes[0]
    assert [t.get_text() for t in ax.get_legend().texts] == ["block size 16", "block size 128"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("request rate (req/s)", "normalized latency (s/token)")
    assert ax.get_ylim()[0] == 0


def test_the_ttft_curve_is_labelled_ttft_not_normalized_latency():
    """notebooks/capacity.ipynb draws TTFT p99 against rate through plot_latency_vs_rate."""
    df = pd.DataFrame({"system": ["s", "s"], "rate": [1.0, 2.0], "ttft_s_p99": [0.5, 1.5]})
    ax = kvsim.plot_latency_vs_rate(df, rate="rate", latency="ttft_s_p99").axes[0]
    assert ax.get_ylabel() == "TTFT p99 (s)" and ax.get_title() == "TTFT p99 against request rate"


def test_block_size_axes_start_at_zero():
    """A 0.1% difference must not fill the axis: throughput 17,190 to 17,220 tokens/s drawn from 0."""
    df = pd.DataFrame({"block_size": [8, 16], "waste_fraction": [0.01, 0.02], "mean_batch_size": [30, 29],
                       "throughput_tokens_per_s": [17190, 17220]})
    fig = kvsim.plot_block_size(df)
    # from zero, with a margin below it so a line at 0 clears the border (tests/planning/reports/test_figures_visible.py)
    assert all(-0.1 * ax.get_ylim()[1] <= ax.get_ylim()[0] < 0 for ax in fig.axes)


def test_paper_capacity_of_zero_says_nothing_was_sustained():
    """Static batching whose latency is over the knee at every rate tried (0.5 and 1 req/s) has no
    capacity: the table says `none (< 0.5)`, not 0 req/s."""
    from kvsim.planning.paper.report import _ratio_table
    systems = ["vLLM (paged)", "Orca (Oracle)", "Orca (Pow2)", "Orca (Max)", "FasterTransformer (static)"]
    caps = pd.DataFrame({"setup": "OPT-13B", "preset": "sharegpt", "system": systems,
                         "capacity_rps": [1.0, 0.8, 0.6, 0.5, 0.0]})
    curves = pd.DataFrame({"setup": "OPT-13B", "preset": "sharegpt", "rate": [0.5, 1.0]})
    row = _ratio_table(caps, curves).iloc[0]
    assert row["static (req/s)"] == "none (< 0.5)" and row["paged (req/s)"] == 1.0
