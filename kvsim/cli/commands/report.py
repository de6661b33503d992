"""`kvsim tune-block-size`, `kvsim report` and `kvsim paper` (registered by kvsim.cli.app).

Heavy modules load inside the commands. Bad input — an existing output folder without --force, a bad
block-size list, an unreadable sweep table — is one message on stderr and exit status 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from kvsim.cli import bounds
from kvsim.cli.commands import report_fleet as rf
from kvsim.cli.commands.plan import PresetOpt, SetOpt, TraceArg, _literal, _pairs, _user_errors, _write_json

ModelOpt = typer.Option("opt-13b", "--model", help="Model preset (e.g. opt-13b, llama-3-8b).")
GpuOpt = typer.Option("a100-40gb", "--gpu", help="GPU preset (e.g. a100-40gb, h100-80gb).")
TpOpt = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree (GPUs).")
KvGibOpt = typer.Option(None, "--kv-gib", help="KV memory of the whole deployment, GiB.")
NumBlocksOpt = typer.Option(None, "--num-blocks", help="KV blocks of the whole deployment.")
RateOpt = typer.Option(None, "--rate", help="Request rate, req/s: Poisson rate of --preset (default 2), or "
                       "TRACE's arrivals rescaled to it.")
DurationOpt = typer.Option(None, "--duration", help="Seconds of Poisson arrivals (--preset; default 600). "
                           "A TRACE replays its own arrivals: --duration does not apply to it.")
NumRequestsOpt = typer.Option(None, "--num-requests", min=1, help="Exactly this many requests (--preset), "
                              "or the first N of TRACE.")
SeedOpt = typer.Option(0, "--seed", help="Random seed of the synthetic trace and the run.")
BlockSizesOpt = typer.Option("1,2,4,8,16,32,64,128,256", "--block-sizes", help="Block sizes to sweep, tokens "
                             "(comma-separated; '' for none in `report`).")
BookkeepingOpt = typer.Option(None, "--bookkeeping", help="kvsim-bookkeeping/1 JSON with measured per-step "
                              "block-table and allocation costs (default: named constants).")
MeasureOpt = typer.Option(False, "--measure-bookkeeping", help="Time block allocation and table building "
                          "on this machine's CPU first and use that.")
TuneBlockSizesOpt = typer.Option(None, "--block-sizes", help="Block sizes to sweep, tokens (comma-separated; "
                                 "default: the sizes the engine profile's attention kernel runs).")
WorkersOpt = typer.Option(None, "--workers", min=1, help="Runs at once (processes; default: all cores).")
ForceOpt = typer.Option(False, "--force", help="Replace the output folder if it exists.")


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated whole numbers") from None
    if any(not 1 <= v <= bounds.MAX_TOKENS for v in values):
        raise ValueError(f"{option} {text!r}: every value must be from 1 to {bounds.MAX_TOKENS:,}")
    return values


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(not 0 < v <= bounds.MAX_RATE_RPS for v in values):
        raise ValueError(f"{option} {text!r}: give one or more finite rates > 0 and <= "
                         f"{bounds.MAX_RATE_RPS:,.0f} req/s")
    return values


#: The columns `kvsim.planning.reports.build.sweep_report` reads from every sweep table (what
#: `kvsim sweep` writes: kvsim.planning.runs.summary_row); a table without them is not a sweep table.
SWEEP_COLUMNS = ("status", "throughput_rps", "preemptions", "kv_mean_fraction_token_states",
                 "kv_mean_fraction_reserved", "kv_mean_fraction_internal_fragmentation",
                 "kv_mean_fraction_external_fragmentation", "kv_mean_fraction_free")


def _sweep_table(path: Path):
    """The sweep table at `path`, refused (naming the missing columns) unless it has SWEEP_COLUMNS."""
    from kvsim.planning.reports.build import read_sweep_table
    table = read_sweep_table(path)
    missing = [c for c in SWEEP_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"--sweep {path}: not a sweep table (`kvsim sweep -o DIR`): no column(s) "
                         f"{', '.join(missing)}")
    return table


def _out_folder(out: Path, force: bool, flag: str) -> None:
    """Refuse report folder `out` before any work: it exists (without --force), is a file, or cannot be
    created or written; removes the temporary folders of killed runs beside it."""
    from kvsim.files import check_output_folder
    from kvsim.planning.reports.document import check_out_dir
    try:
        check_out_dir(out, force)
    except ValueError as exc:
        raise ValueError(f"{flag} {exc}") from None
    check_output_folder(out, flag)
    _clean_stale_folders(out)


def _clean_stale_folders(out: Path) -> None:
    """`.NAME.tmpPID` / `.NAME.oldPID` folders (kvsim.planning.reports.document.write_report) of dead processes."""
    import shutil
    from kvsim.files import _pid_alive, glob_escape
    for stale in out.parent.glob(f".{glob_escape(out.name)}.[to][ml][pd]*"):
        pid = stale.name[len(out.name) + 5:]
        if stale.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _write_report(rep, out: Path, force: bool, flag: str) -> None:
    """`write_report`, with an I/O error (disk full, permission) naming `flag` and `out`."""
    from kvsim.files import write_error
    from kvsim.planning.reports.document import write_report
    try:
        write_report(rep, out, force)
    except OSError as exc:
        raise write_error(exc, out, flag) from None


def _workload(trace: Optional[Path], preset: Optional[str], rate, duration, num_requests, seed):
    """The trace to use: TRACE (optionally cut and rescaled) or a Poisson trace of --preset."""
    from kvsim.trace.table import rescale_trace
    from kvsim.trace.formats import load_trace
    from kvsim.trace.synthetic import generate

    if trace is not None and preset is not None:
        raise ValueError("give a TRACE or --preset, not both")
    bounds.rate(rate)
    bounds.count(num_requests, "--num-requests")
    bounds.count(seed, "--seed", low=0, high=2**63 - 1)
    bounds.duration(duration)
    if trace is not None and duration is not None:
        typer.echo(f"note: --duration does not apply to TRACE {trace}: its own arrivals are replayed "
                   "(use --num-requests to cut it)", err=True)
    duration = 600.0 if duration is None else duration
    if trace is None and not num_requests:
        bounds.requests(rate or 2.0, duration, "--rate x --duration")
    if trace is None:
        return generate(preset or "sharegpt", rate_rps=rate or 2.0,
                        duration_s=None if num_requests else duration, num_requests=num_requests, seed=seed)
    tr = load_trace(trace)
    if num_requests is not None:
        tr = tr.head(min(num_requests, len(tr)))
    return rescale_trace(tr, rate_rps=rate) if rate is not None else tr


def _flags(model, gpu, tp, kv_gib, num_blocks, seed, set_flags) -> dict:
    """Run flags from the command's options, its --set pairs and the vLLM flags on its command line."""
    from kvsim.cli.vllm_args import note_ignored, vllm_extras
    flags = {"model": model, "gpu": gpu, "tp": tp, "kv_gib": kv_gib, "num_blocks": num_blocks, "seed": seed}
    flags.update({k.replace("-", "_"): _literal(v) for k, v in _pairs(set_flags, "--set")})
    extra, ignored = vllm_extras()
    note_ignored(ignored)
    return {**flags, **extra}


def tune_block_size_cmd(
    trace: Optional[Path] = TraceArg, preset: Optional[str] = PresetOpt, rate: Optional[float] = RateOpt,
    duration: Optional[float] = DurationOpt, num_requests: Optional[int] = NumRequestsOpt, model: str = ModelOpt,
    gpu: str = GpuOpt, tp: int = TpOpt, kv_gib: Optional[float] = KvGibOpt,
    num_blocks: Optional[int] = NumBlocksOpt, set_flags: List[str] = SetOpt, seed: int = SeedOpt,
    block_sizes: Optional[str] = TuneBlockSizesOpt, bookkeeping: Optional[Path] = BookkeepingOpt,
    measure_bookkeeping: bool = MeasureOpt, workers: Optional[int] = WorkersOpt,
    report: Optional[Path] = typer.Option(None, "--report", help="Also write a report folder here."),
    force: bool = ForceOpt,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the curve and recommendation here."),
) -> None:
    """Recommend a paged block size (tokens) for a workload: waste and capacity (tokens/s) against the
    paged kernel's gather cost and block bookkeeping (% of a step), one row per block size."""
    from kvsim.cli.output import console
    from kvsim.planning import bookkeeping as bkp

    with _user_errors():
        sizes = None if block_sizes is None else _ints(block_sizes, "--block-sizes")
        if sizes is not None and not sizes:
            raise ValueError("--block-sizes: give at least one block size")
        if report is not None:
            _out_folder(report, force, "--report")
        if json_out is not None:
            from kvsim.files import check_output_file
            check_output_file(json_out, "--json")
        bounds.workers(workers)
        if bookkeeping is not None and measure_bookkeeping:
            raise ValueError("give --bookkeeping or --measure-bookkeeping, not both")
        bk = bkp.load(bookkeeping) if bookkeeping else bkp.measure() if measure_bookkeeping else None
        tr = _workload(trace, preset, rate, duration, num_requests, seed)
        flags = _flags(model, gpu, tp, kv_gib, num_blocks, seed, set_flags)
        for key, why in (("block_size", "give --block-sizes"), ("allocator", "the tuner runs the paged allocator")):
            if key in flags:
                raise ValueError(f"--set {key}: does not apply to tune-block-size ({why})")
        from kvsim.planning.tune import tune_block_size
        res = tune_block_size(tr, block_sizes=sizes, bookkeeping=bk, workers=workers or os.cpu_count(),
                              **flags)
        for warning in res.warnings:
            typer.echo(f"warning: {warning}", err=True)
        where = _deployment_words(flags)
        _print_curve(console, res, where)
        if json_out is not None:
            _write_json(json_out, {"recommended": res.recommended, "good_range": res.good_range,
                                   "warnings": list(res.warnings),
                                   "reason": res.reason, "workload": res.workload,
                                   "curve": res.curve.to_dict("records")})
        if report is not None:
            from kvsim.planning.reports import figures
            from kvsim.planning.reports.document import Report
            from kvsim.planning.reports.build import block_size_table
            rep = Report(f"Block size for {tr.source or 'the trace'}: {where}")
            rep.paragraph(f"**Recommended block size: {res.recommended} tokens.** {res.reason}")
            rep.figure("block_size", figures.block_size_curve(res.curve, recommended=res.recommended))
            block_size_table(rep, "curve", res.curve)
            _write_report(rep, report, force, "--report")


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
    from kvsim.planning.tune import TOLERANCE
    from kvsim.planning.tune_notes import headline
    console.print(headline(res.curve, res.recommended, res.good_range, TOLERANCE), highlight=False)
    console.print(res.reason, highlight=False)


tune_block_size_cmd.accepts_vllm_flags = True    # kvsim.cli.lazy: a kvsim.cli.vllm_args.VllmCommand


def report_cmd(
    trace: Optional[Path] = TraceArg,
    out: Path = typer.Option(..., "-o", "--out", help="Report folder to create (report.md, report.html, "
                             "figures/, data/)."),
    sweep: Optional[Path] = typer.Option(None, "--sweep", help="Report this sweep folder or table "
                                         "(`kvsim sweep -o DIR`) instead of running a trace."),
    preset: Optional[str] = PresetOpt, rate: Optional[float] = RateOpt, duration: Optional[float] = DurationOpt,
    num_requests: Optional[int] = NumRequestsOpt, model: str = ModelOpt, gpu: str = GpuOpt, tp: int = TpOpt,
    kv_gib: Optional[float] = KvGibOpt, num_blocks: Optional[int] = NumBlocksOpt,
    set_flags: List[str] = SetOpt, seed: int = SeedOpt,
    rates: Optional[str] = typer.Option(None, "--rates", help="Rates of the latency curve, req/s "
                                        "(default: the trace's rate x 0.25, 0.5, 1, 1.5, 2, 3)."),
    block_sizes: Optional[str] = typer.Option(None, "--block-sizes", help="Block sizes of the tuner section, "
                                              "tokens (default: the sizes the engine profile's attention kernel "
                                              "runs, as tune-block-size; '' to leave it out)."),
    title: str = typer.Option("", "--title", help="Report title."), workers: Optional[int] = WorkersOpt,
    force: bool = ForceOpt, replicas: Optional[str] = rf.FleetReplicasOpt, routers: str = rf.RoutersOpt,
    pd: Optional[str] = rf.PdOpt, kv_link: str = rf.KvLinkOpt, ttft_slo: float = rf.TtftSloOpt,
    tpot_slo: float = rf.TpotSloOpt, fleet_only: bool = rf.FleetOnlyOpt,
) -> None:
    """A capacity-planning report (Markdown + self-contained HTML with figures): the memory breakdown per
    allocator, batch size and KV usage over time, latency against rate, waste and throughput against
    block size, and preemptions; from a trace and deployment, or from a sweep table. With --replicas, a
    fleet section: the routers compared at each fleet size (and with --pd, colocated against P:D splits)."""
    with _user_errors():
        _out_folder(out, force, "-o")
        bounds.workers(workers)
        fleet = rf.fleet_request(replicas, routers, pd, kv_link, ttft_slo, tpot_slo, fleet_only)
        if sweep is not None:
            if trace is not None or preset is not None:
                raise ValueError("give --sweep or a TRACE/--preset, not both")
            if fleet is not None:
                raise ValueError("--replicas: a sweep report has no fleet section (sweep `replicas` and `router`)")
            from kvsim.planning.reports.build import sweep_report
            rep = sweep_report(_sweep_table(sweep), title or f"Sweep report: {sweep}")
        else:
            from kvsim.planning.reports.build import trace_report
            rate_list = _floats(rates, "--rates") if rates is not None else None
            sizes = None if block_sizes is None else _ints(block_sizes, "--block-sizes")
            tr = _workload(trace, preset, rate, duration, num_requests, seed)
            flags = _flags(model, gpu, tp, kv_gib, num_blocks, seed, set_flags)
            from kvsim.planning.sweep.servable import unservable
            for _, error in unservable([flags])[:1]:        # a bad value fails before any run or progress line
                raise ValueError(error)
            if fleet_only:
                from kvsim.planning.studies.fleet_report import fleet_report
                rep = fleet_report(tr, title, flags, **fleet)
            else:
                from kvsim.fleet.config import FLEET_FLAGS
                engine = {k: v for k, v in flags.items() if fleet is None or k not in FLEET_FLAGS}
                rep = trace_report(tr, title, rates=rate_list, block_sizes=sizes, workers=workers or os.cpu_count(),
                                   **engine)
                if fleet is not None:
                    from kvsim.planning.studies.fleet_report import fleet_section
                    fleet_section(rep, tr, flags, **fleet)
        _write_report(rep, out, force, "-o")
    typer.echo(f"wrote {out}/report.md and {out}/report.html")


report_cmd.accepts_vllm_flags = True
