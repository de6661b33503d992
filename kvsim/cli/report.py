"""`kvsim tune-block-size`, `kvsim report` and `kvsim paper` (registered by kvsim.cli.app).

Heavy modules load inside the commands. Bad input — an existing output folder without --force, a bad
block-size list, an unreadable sweep table — is one message on stderr and exit status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer

from kvsim.cli.plan import PresetOpt, SetOpt, TraceArg, _literal, _pairs, _user_errors

ModelOpt = typer.Option("opt-13b", "--model", help="Model preset (e.g. opt-13b, llama-3-8b).")
GpuOpt = typer.Option("a100-40gb", "--gpu", help="GPU preset (e.g. a100-40gb, h100-80gb).")
TpOpt = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree (GPUs).")
KvGibOpt = typer.Option(None, "--kv-gib", help="KV memory of the whole deployment, GiB.")
NumBlocksOpt = typer.Option(None, "--num-blocks", help="KV blocks of the whole deployment.")
RateOpt = typer.Option(None, "--rate", help="Request rate, req/s: Poisson rate of --preset (default 2), or "
                       "TRACE's arrivals rescaled to it.")
DurationOpt = typer.Option(600.0, "--duration", help="Seconds of Poisson arrivals (--preset).")
NumRequestsOpt = typer.Option(None, "--num-requests", min=1, help="Exactly this many requests (--preset), "
                              "or the first N of TRACE.")
SeedOpt = typer.Option(0, "--seed", help="Random seed of the synthetic trace and the run.")
BlockSizesOpt = typer.Option("1,2,4,8,16,32,64,128,256", "--block-sizes", help="Block sizes to sweep, tokens "
                             "(comma-separated; '' for none in `report`).")
BookkeepingOpt = typer.Option(None, "--bookkeeping", help="kvsim-bookkeeping/1 JSON with measured per-step "
                              "block-table and allocation costs (default: named constants).")
MeasureOpt = typer.Option(False, "--measure-bookkeeping", help="Time block allocation and table building "
                          "on this machine's CPU first and use that.")
WorkersOpt = typer.Option(None, "--workers", min=1, help="Runs at once (processes; default: all cores).")
ForceOpt = typer.Option(False, "--force", help="Replace the output folder if it exists.")


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated whole numbers") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{option} {text!r}: every value must be >= 1")
    return values


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{option} {text!r}: give one or more rates > 0 req/s")
    return values


def _workload(trace: Optional[Path], preset: Optional[str], rate, duration, num_requests, seed):
    """The trace to use: TRACE (optionally cut and rescaled) or a Poisson trace of --preset."""
    from kvsim.trace.table import rescale_trace
    from kvsim.trace.formats import load_trace
    from kvsim.trace.synthetic import generate

    if trace is not None and preset is not None:
        raise ValueError("give a TRACE or --preset, not both")
    if trace is None:
        return generate(preset or "sharegpt", rate_rps=rate or 2.0,
                        duration_s=None if num_requests else duration, num_requests=num_requests, seed=seed)
    tr = load_trace(trace)
    if num_requests is not None:
        tr = tr.head(min(num_requests, len(tr)))
    return rescale_trace(tr, rate_rps=rate) if rate is not None else tr


def _flags(model, gpu, tp, kv_gib, num_blocks, seed, set_flags) -> dict:
    flags = {"model": model, "gpu": gpu, "tp": tp, "kv_gib": kv_gib, "num_blocks": num_blocks, "seed": seed}
    flags.update({k.replace("-", "_"): _literal(v) for k, v in _pairs(set_flags, "--set")})
    return flags


def tune_block_size_cmd(
    trace: Optional[Path] = TraceArg, preset: Optional[str] = PresetOpt, rate: Optional[float] = RateOpt,
    duration: float = DurationOpt, num_requests: Optional[int] = NumRequestsOpt, model: str = ModelOpt,
    gpu: str = GpuOpt, tp: int = TpOpt, kv_gib: Optional[float] = KvGibOpt,
    num_blocks: Optional[int] = NumBlocksOpt, set_flags: List[str] = SetOpt, seed: int = SeedOpt,
    block_sizes: str = BlockSizesOpt, bookkeeping: Optional[Path] = BookkeepingOpt,
    measure_bookkeeping: bool = MeasureOpt, workers: Optional[int] = WorkersOpt,
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report folder here."),
    force: bool = ForceOpt,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the curve and recommendation here."),
) -> None:
    """Recommend a paged block size (tokens) for a workload: waste and capacity (tokens/s) against the
    paged kernel's gather cost and block bookkeeping (% of a step), one row per block size."""
    from kvsim.cli.output import console
    from kvsim.planning import bookkeeping as bkp
    from kvsim.planning.report import check_out_dir

    with _user_errors():
        sizes = _ints(block_sizes, "--block-sizes")
        if not sizes:
            raise ValueError("--block-sizes: give at least one block size")
        if report is not None:
            check_out_dir(report, force)
        if bookkeeping is not None and measure_bookkeeping:
            raise ValueError("give --bookkeeping or --measure-bookkeeping, not both")
        bk = bkp.load(bookkeeping) if bookkeeping else bkp.measure() if measure_bookkeeping else None
        tr = _workload(trace, preset, rate, duration, num_requests, seed)
        flags = _flags(model, gpu, tp, kv_gib, num_blocks, seed, set_flags)
        from kvsim.planning.tune import tune_block_size
        res = tune_block_size(tr, block_sizes=sizes, bookkeeping=bk, workers=workers or os.cpu_count(),
                              **flags)
        where = _deployment_words(flags)
        _print_curve(console, res, where)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            tmp = json_out.with_name(f".{json_out.name}.tmp")
            tmp.write_text(json.dumps({"recommended": res.recommended, "good_range": res.good_range,
                                       "reason": res.reason, "workload": res.workload,
                                       "curve": res.curve.to_dict("records")}, indent=2) + "\n")
            os.replace(tmp, json_out)
        if report is not None:
            from kvsim.planning import figures
            from kvsim.planning.report import Report, write_report
            from kvsim.planning.report_build import block_size_table
            rep = Report(f"Block size for {tr.source or 'the trace'}: {where}")
            rep.paragraph(f"**Recommended block size: {res.recommended} tokens.** {res.reason}")
            rep.figure("block_size", figures.block_size_curve(res.curve, recommended=res.recommended))
            block_size_table(rep, "curve", res.curve)
            write_report(rep, report, force)


def _deployment_words(flags: dict) -> str:
    """'opt-13b on 1 x A100-40GB, 12 GiB KV': what the tuner ran on, for its table and report title."""
    from kvsim.planning.runs import make_config
    dep = make_config(**flags).deployment
    kv = f", {flags['kv_gib']:g} GiB KV" if flags.get("kv_gib") else ""
    return f"{dep.model.name} on {dep.tp} x {dep.gpu.name}{kv}"


def _print_curve(console, res, where: str = "") -> None:
    from rich.table import Table

    t = Table(title=f"block size: waste against indirection, {where + ', ' if where else ''}"
                    f"{res.workload['requests']:,} requests, mean peak {res.workload['mean_peak']:.0f} tokens")
    for col in ("block", "waste %", "batch", "gather %", "bookkeeping %", "capacity tok/s", "latency s/tok"):
        t.add_column(col, justify="right")
    for row in res.curve.itertuples():
        mark = " *" if row.block_size == res.recommended else ""
        t.add_row(f"{row.block_size}{mark}", f"{100 * row.waste_fraction:.1f}", f"{row.mean_batch_size:.1f}",
                  f"{100 * row.gather_fraction:.1f}", f"{100 * row.bookkeeping_fraction:.2f}",
                  f"{row.capacity_tokens_per_s:,.0f}", f"{row.latency_s_per_token:.4f}")
    console.print(t)
    console.print(f"recommended block size: [bold]{res.recommended}[/] tokens (within 2%: "
                  f"{res.good_range[0]}-{res.good_range[1]})")
    console.print(res.reason, highlight=False)


def report_cmd(
    trace: Optional[Path] = TraceArg,
    out: Path = typer.Option(..., "-o", "--out", help="Report folder to create (report.md, report.html, "
                             "figures/, data/)."),
    sweep: Optional[Path] = typer.Option(None, "--sweep", help="Report this sweep folder or table "
                                         "(`kvsim sweep -o DIR`) instead of running a trace."),
    preset: Optional[str] = PresetOpt, rate: Optional[float] = RateOpt, duration: float = DurationOpt,
    num_requests: Optional[int] = NumRequestsOpt, model: str = ModelOpt, gpu: str = GpuOpt, tp: int = TpOpt,
    kv_gib: Optional[float] = KvGibOpt, num_blocks: Optional[int] = NumBlocksOpt,
    set_flags: List[str] = SetOpt, seed: int = SeedOpt,
    rates: Optional[str] = typer.Option(None, "--rates", help="Rates of the latency curve, req/s "
                                        "(default: the trace's rate x 0.25, 0.5, 1, 1.5, 2, 3)."),
    block_sizes: str = typer.Option("1,4,16,64,256", "--block-sizes", help="Block sizes of the tuner "
                                    "section, tokens ('' to leave it out)."),
    title: str = typer.Option("", "--title", help="Report title."), workers: Optional[int] = WorkersOpt,
    force: bool = ForceOpt,
) -> None:
    """A capacity-planning report (Markdown + self-contained HTML with figures): the memory breakdown per
    allocator, batch size and KV usage over time, latency against rate, waste and throughput against
    block size, and preemptions; from a trace and deployment, or from a sweep table."""
    from kvsim.planning.report import check_out_dir, write_report

    with _user_errors():
        check_out_dir(out, force)
        if sweep is not None:
            if trace is not None or preset is not None:
                raise ValueError("give --sweep or a TRACE/--preset, not both")
            from kvsim.planning.report_build import read_sweep_table, sweep_report
            rep = sweep_report(read_sweep_table(sweep), title or f"Sweep report: {sweep}")
        else:
            from kvsim.planning.report_build import trace_report
            tr = _workload(trace, preset, rate, duration, num_requests, seed)
            rep = trace_report(tr, title, rates=_floats(rates, "--rates") if rates else None,
                               block_sizes=_ints(block_sizes, "--block-sizes"),
                               workers=workers or os.cpu_count(),
                               **_flags(model, gpu, tp, kv_gib, num_blocks, seed, set_flags))
        write_report(rep, out, force)
    typer.echo(f"wrote {out}/report.md and {out}/report.html")


def paper_cmd(
    out: Path = typer.Option(Path("reports/vllm-paper"), "-o", "--out", help="Report folder."),
    quick: bool = typer.Option(False, "--quick", help="OPT-13B only, 30 s traces, 2 rates, 3 block sizes "
                               "(seconds; for tests)."),
    workers: Optional[int] = WorkersOpt, force: bool = ForceOpt,
) -> None:
    """The vLLM paper's experiments (OPT-13B/66B/175B, ShareGPT- and Alpaca-like): latency against rate
    per system, memory breakdown, batched requests, block size, recompute against swap; our numbers beside
    the published ones."""
    from kvsim.planning.report import check_out_dir, write_report

    with _user_errors():
        check_out_dir(out, force)
        from kvsim.planning.paper import FULL, QUICK, run_paper
        from kvsim.planning.paper_report import paper_report
        res = run_paper(QUICK if quick else FULL, workers=workers or os.cpu_count())
        write_report(paper_report(res), out, force)
    typer.echo(f"wrote {out}/report.md and {out}/report.html ({res.wall_s:.0f} s of runs)")


def hybrid_study_cmd(
    out: Path = typer.Option(Path("reports/hybrid-models"), "-o", "--out", help="Report folder."),
    quick: bool = typer.Option(False, "--quick", help="gpt-oss-120b on the ShareGPT-like trace only, 30 s "
                               "(seconds; for tests)."),
    duration: float = typer.Option(600.0, help="Trace length, seconds (ignored with --quick)."),
    force: bool = ForceOpt,
) -> None:
    """Hybrid models (gpt-oss, Gemma 3, Llama 4) under uniform pages, vLLM's hybrid KV cache manager and
    contiguous reservations: start-up figures, simulated batch and KV per request; Jenga's published
    figures beside ours."""
    from dataclasses import replace

    from kvsim.planning.report import check_out_dir, write_report

    with _user_errors():
        if not duration > 0:
            raise ValueError(f"--duration must be > 0 seconds, got {duration}")
        check_out_dir(out, force)
        from kvsim.planning.hybrid_report import hybrid_report
        from kvsim.planning.hybrid_study import QUICK, StudyPlan, run_study
        plan = QUICK if quick else replace(StudyPlan(), duration_s=duration)
        write_report(hybrid_report(run_study(plan), plan), out, force)
    typer.echo(f"wrote {out}/report.md and {out}/report.html")
