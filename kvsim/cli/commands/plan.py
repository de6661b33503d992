"""`kvsim capacity` (and the helpers `kvsim sweep` shares): capacity planning (registered by kvsim.cli.lazy).

Heavy modules (pandas, the simulator, Ray) load inside the commands, so `kvsim --help` stays fast. Bad
input — an SLO no rate meets, an empty grid, an unknown flag in a grid, a Ray address that does not
answer — is one message on stderr and exit status 2.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import typer

from kvsim.cli.options import HybridOpt, MaxLenOpt, TokensOpt
from kvsim.cli.commands.disagg import (AttainmentOpt, DisaggSearchOpt, KvLinkOpt, MaxGpusOpt, TpotSloOpt, TtftSloOpt,
                              capacity_disagg)

TraceArg = typer.Argument(None, metavar="[TRACE]", help="Trace file (kvsim JSONL, Azure CSV, Mooncake "
                          "JSONL, Vidur CSV); default: a synthetic trace of --preset.")
PresetOpt = typer.Option(None, "--preset", help="Length distribution and Poisson arrivals: sharegpt or "
                         "alpaca (default sharegpt when no TRACE).")
SetOpt = typer.Option([], "--set", metavar="FLAG=VALUE", help="Any other `kvsim run` flag, with _ or - "
                      "(e.g. --set preemption=swap --set max_num_seqs=128); repeatable.")
JsonOpt = typer.Option(None, "--json", help="Also write the results as JSON here.")


@contextmanager
def _user_errors() -> Iterator[None]:
    """ValueError/OSError -> one line on stderr, exit status 2."""
    try:
        yield
    except (ValueError, OSError) as exc:
        from kvsim.cli.output import error
        error(str(exc))


def _literal(text: str):
    """'16' -> 16, '0.5' -> 0.5, anything else stays a string (run flags parse it by their type)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def _pairs(items: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} {item!r}: expected flag=value")
        out.append((key.strip(), value))
    return out


def _write_json(path: Path, data, flag: str = "--json") -> None:
    """`data` as JSON at `path`, whole or not at all (errors name `flag` and `path`)."""
    from kvsim.files import write_json_atomic
    write_json_atomic(path, data, flag, default=str, end="\n")      # strict JSON: NaN/inf -> null + reason


def capacity(
    trace: Optional[Path] = TraceArg, preset: Optional[str] = PresetOpt,
    model: str = typer.Option("opt-13b", "--model", help="Model preset (e.g. opt-13b, llama-3-8b)."),
    model_config: Optional[Path] = typer.Option(None, "--model-config", help="Hugging Face config.json."),
    gpu: str = typer.Option("a100-40gb", "--gpu", help="GPU preset (e.g. a100-40gb, h100-80gb)."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Tensor-parallel degree (GPUs per replica; default "
                                     "1, or with --gpus-for the smallest of --tp-options that holds the weights)."),
    kv_gib: Optional[float] = typer.Option(None, "--kv-gib", help="KV memory of the deployment, GiB."),
    num_blocks: Optional[int] = typer.Option(None, "--num-blocks", help="KV blocks of the deployment."),
    gpu_mem_util: float = typer.Option(0.9, "--gpu-mem-util", help="Fraction of GPU memory for weights + "
                                       "KV when no --kv-gib/--num-blocks."),
    block_size: int = typer.Option(16, "--block-size", min=1, help="Paged block size, tokens."),
    placement: str = typer.Option("buddy", "--placement", help="Contiguous placement: buddy|first-fit."),
    max_model_len: Optional[int] = MaxLenOpt, max_batched_tokens: Optional[int] = TokensOpt,
    hybrid_kv_cache: Optional[bool] = HybridOpt,
    set_flags: List[str] = SetOpt,
    slo: List[str] = typer.Option([], "--slo", metavar="METRIC=LIMIT", help="Latency target: ttft|tpot|e2e"
                                  "_p50|p90|p99|mean in s, or normalized_latency in s/token; repeatable. "
                                  "Adds the highest request rate that meets all of them."),
    gpus_for: Optional[float] = typer.Option(None, "--gpus-for", metavar="RATE", help="Requests per second "
                                             "to serve: adds the smallest TP degree and replicas (needs --slo; --disagg sizes P:D "
                                             "splits against --ttft-slo/--tpot-slo instead)."),
    tp_options: str = typer.Option("1,2,4,8", "--tp-options", help="TP degrees tried by --gpus-for."),
    router: Optional[str] = typer.Option(None, "--router", help="With --gpus-for: search replicas x TP by "
                                         "simulating the whole fleet behind this router (round-robin, "
                                         "least-requests, least-kv, prefix-aware) instead of dividing."),
    duration: float = typer.Option(600.0, "--duration", help="Seconds of Poisson arrivals per rate tried "
                                   "(--preset); a run that cannot tell its steady-state verdict yet runs again "
                                   "on twice as many, up to --max-span."),
    max_span: float = typer.Option(3600.0, "--max-span", help="Longest Poisson trace (s) a rate (or a fleet, or a P:D layout) is run on "
                                   "while its queue still grows or its SLO batch means cannot decide."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the synthetic traces."),
    rel_tol: float = typer.Option(0.05, "--rel-tol", help="Stop when the rate bracket is this narrow "
                                  "(relative)."),
    max_runs: int = typer.Option(16, "--max-runs", min=1, help="Most simulations per rate search."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Simulations at once "
                                          "(processes; default: all cores); the answers do not depend on it."),
    json_out: Optional[Path] = JsonOpt,
    disagg: bool = DisaggSearchOpt, kv_link: str = KvLinkOpt, ttft_slo: float = TtftSloOpt,
    tpot_slo: float = TpotSloOpt, slo_attainment: float = AttainmentOpt, max_gpus: int = MaxGpusOpt,
) -> None:
    """How much fits: KV cache size (tokens, blocks) and concurrency per allocator; with --slo the highest
    rate (req/s) meeting it, its latency-against-rate curve and what limits it; with --gpus-for the GPUs."""
    from kvsim.cli.output import console
    from kvsim.planning import capacity as cap
    from kvsim.planning.rate import search as rt
    from kvsim.planning.records import records

    with _user_errors():
        if trace is not None and preset is not None:
            raise ValueError("give a TRACE or --preset, not both")
        if gpus_for is not None and not slo and not disagg:
            raise ValueError("--gpus-for needs at least one --slo")
        if router is not None and gpus_for is None:
            raise ValueError("--router sizes a fleet: give --gpus-for RATE (and --slo)")
        from kvsim.planning.flag_table import check_value
        check_value("router", router)                      # the names `kvsim run` takes, before any run
        from kvsim.cli import bounds
        from kvsim.files import check_output_file
        if json_out is not None:
            check_output_file(json_out, "--json")
        bounds.capacity_flags(gpus_for, duration, rel_tol, max_runs, workers, seed, trace is None)
        bounds.duration(max_span, "--max-span")
        options = _tp_options(tp_options)
        if gpus_for is not None and (kv_gib is not None or num_blocks is not None):
            raise ValueError("--gpus-for sizes each TP degree's KV cache from its GPU memory (--gpu-mem-util); "
                             "drop --kv-gib / --num-blocks")
        flags = dict(model=model, gpu=gpu, tp=tp or 1, kv_gib=kv_gib, num_blocks=num_blocks,
                     gpu_mem_util=gpu_mem_util, block_size=block_size, placement=placement,
                     max_model_len=max_model_len, max_batched_tokens=max_batched_tokens,
                     hybrid_kv_cache=hybrid_kv_cache,
                     model_config=str(model_config) if model_config else None)
        flags.update({k: _literal(v) for k, v in _pairs(set_flags, "--set")})
        from kvsim.cli.vllm_args import note_ignored, vllm_extras
        extra, ignored = vllm_extras()            # a pasted vLLM command line (--gpu-memory-utilization, ...)
        flags.update(extra)
        note_ignored(ignored)
        if disagg:                                          # kvsim.cli.commands.disagg
            return capacity_disagg(trace, preset, gpus_for, tp_options, duration, seed, flags, kv_link,
                                   ttft_slo, tpot_slo, slo_attainment, max_gpus, json_out, max_span, rel_tol)
        if gpus_for is not None and tp is None and "tp" not in {**dict(_pairs(set_flags, "--set")), **extra}:
            flags["tp"] = _smallest_tp(flags, options)
            if flags["tp"] > 1:
                console.print(f"note: --gpus-for: the single-replica figures below are at --tp {flags['tp']}, the "
                              f"smallest of {tp_options} whose GPUs hold the weights", highlight=False)
        slo_limits = rt.parse_slo(slo) if slo else None
        workers = workers or os.cpu_count() or 1
        tr = None
        if trace is not None:
            from kvsim.trace.formats import load_trace
            tr = load_trace(trace)
        lengths = tr if tr is not None else (preset or "sharegpt")
        static = records(cap.static_capacity_rows(lengths=lengths, seed=seed, **flags))
        out = {"static": static}
        _print_static(console, static, lengths if isinstance(lengths, str) else trace.name)
        from kvsim.cli.output import print_hybrid_startup
        from kvsim.planning.reports.ledger import ledger_lines, memory_ledger
        from kvsim.planning.runs import make_config
        out["memory"], out["vllm_flags_ignored"] = memory_ledger(make_config(**flags)), ignored
        console.print("memory per GPU (vLLM's start-up lines):\n  " + "\n  ".join(ledger_lines(out["memory"])),
                      highlight=False, soft_wrap=True)
        if print_hybrid_startup(make_config(**flags)):
            console.print("note: the paged row's KV tokens, blocks and concurrency at the maximum length are "
                          "vLLM's; mean slots/req, max conc. and the contiguous rows size every layer as "
                          "full attention", highlight=False)
        import sys
        say = (lambda msg: print(msg, file=sys.stderr, flush=True))
        res = None
        if slo_limits:
            res = rt.max_rate(slo_limits, trace=tr, preset=preset or "sharegpt", duration_s=duration, seed=seed,
                              rel_tol=rel_tol, max_runs=max_runs, workers=workers, max_span_s=max_span,
                              progress=say, **flags)
            curve = records(res.rows)
            _print_rate(console, res, curve)
            out["rate"] = {"rate_rps": res.rate_rps, "slo": res.slo, "limited_by": res.limited_by,
                           "knee_below_rps": res.hi_rps, "judged_on_s": res.span_s, "note": res.note,
                           "curve": curve}
        if gpus_for is not None and router is not None:      # fleets simulated (kvsim/planning/rate/fleet_gpus.py)
            from kvsim.cli.commands.fleet import print_fleet_gpus
            from kvsim.planning.rate.fleet_gpus import gpus_for_fleet
            gflags = {k: v for k, v in flags.items() if k not in ("tp", "kv_gib", "num_blocks")}
            df = gpus_for_fleet(gpus_for, slo_limits, router=router, tp_options=options, trace=tr,
                                preset=preset or "sharegpt", duration_s=duration, seed=seed, progress=say,
                                max_span_s=max_span, max_excess=rel_tol / 2, **gflags)
            print_fleet_gpus(console, df, gpus_for)
            out["gpus"] = df.to_dict("records")
        elif gpus_for is not None:
            gflags = {k: v for k, v in flags.items() if k not in ("tp", "kv_gib", "num_blocks")}
            from kvsim.planning.rate.gpus import gpus_for_rate
            df = gpus_for_rate(gpus_for, slo_limits, tp_options=options, trace=tr,
                                  preset=preset or "sharegpt", duration_s=duration, seed=seed,
                                  rel_tol=rel_tol, max_runs=max_runs, workers=workers, max_span_s=max_span,
                                  known={flags["tp"]: res}, progress=say, **gflags)
            _print_gpus(console, df, gpus_for)
            out["gpus"] = df.to_dict("records")
        if json_out is not None:
            _write_json(json_out, out)


def _tp_options(text: str) -> list[int]:
    """`--tp-options 1,2,4`: TP degrees 1..1024 (ValueError naming the flag)."""
    try:
        options = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--tp-options {text!r}: expected comma-separated whole numbers") from None
    if not options or not all(1 <= x <= 1024 for x in options):
        raise ValueError(f"--tp-options {text!r}: give one or more TP degrees from 1 to 1024")
    return options


def _smallest_tp(flags: dict, options: list[int]) -> int:
    """The smallest TP degree of `options` at which the deployment of `flags` has room for KV (the first
    one's error when none has)."""
    from kvsim.planning.runs import capacity_tokens, make_config
    first = None
    for tp in sorted(set(options)):
        try:
            capacity_tokens(make_config(**{**flags, "tp": tp}))
            return tp
        except ValueError as exc:
            first = first or exc
    raise first if first else ValueError("--tp-options lists no TP degree")


def _print_static(console, rows: list[dict], source: str) -> None:
    from rich.table import Table

    t = Table(title=f"KV capacity (lengths: {source})")
    for col in ("allocator", "KV tokens", "blocks", f"conc. at {rows[0]['max_model_len']} tok",
                "mean slots/req", "max conc.", "x max"):
        t.add_column(col, justify="right")
    for r in rows:
        extra = (f"{r['mean_slots_per_request']:,.1f}", f"{r['max_concurrency']:,.1f}",
                 f"{r['ratio_to_max']:.2f}") if "max_concurrency" in r else ("-", "-", "-")
        t.add_row(r["allocator"], f"{r['capacity_tokens']:,}", f"{r['num_blocks']:,}",
                  f"{r['max_concurrency_at_max_len']:.2f}", *extra)
    console.print(t)
    console.print("max conc.: requests an empty cache admits at their peak size, in arrival order, before "
                  "the first that does not fit (mean of fills).", highlight=False)


def _print_rate(console, res, curve: list[dict]) -> None:
    """The latency-against-rate table of `res` from `curve` (its rows as `records` writes them)."""
    from rich.table import Table

    from kvsim.planning.rate.search import slo_value

    t = Table(title="latency against rate")
    cols = ["rate (req/s)", "meets", *(f"{m} (s)" for m in res.slo), "norm. lat. (s/tok)",
            "batch", "KV peak", "limited by"]
    for col in cols:
        t.add_column(col, justify="right")
    from kvsim.planning.rate.search import limiting_factor
    for r in curve:
        vals = [slo_value(r, m) for m in res.slo]
        norm = r.get("normalized_latency_s_per_token")
        stop = r.get("stopped_early_s")
        stopped = stop is not None and stop == stop   # (NaN in the curve's rows that ran to the end)
        t.add_row(f"{r['rate']:.3g}", "yes" if r["meets_slo"] else "no",
                  *(f"stopped at {stop:.0f} s" if stopped else "-" if v is None else f"{v:.3g}" for v in vals),
                  "-" if norm is None or norm != norm else f"{norm:.3g}",
                  f"{r.get('mean_batch_size', float('nan')):.1f}",
                  f"{r.get('kv_peak_allocated_fraction', float('nan')):.0%}",
                  limiting_factor(r) if r.get("status") == "ok" else r.get("error", ""))
    console.print(t)
    knee = (f" (the knee lies below {res.hi_rps:.3g} req/s, the lowest rate that failed" +
            (f"; judged on {res.span_s:.0f} s of arrivals" if res.span_s else "") + ")"
            if res.hi_rps else "")
    console.print(f"highest rate meeting {', '.join(f'{k} <= {v:g}' for k, v in res.slo.items())}: "
                  f"[bold]{res.rate_rps:.3g} req/s[/]{knee}; limited at the knee by {res.limited_by}"
                  + (f"\nnote: the answer is {res.note}" if res.note else ""), highlight=False)


def _print_gpus(console, df, rate: float) -> None:
    from rich.table import Table

    t = Table(title=f"GPUs for {rate:g} req/s")
    for col in ("TP", "fits", "max rate/replica", "replicas", "GPUs", "limited by"):
        t.add_column(col, justify="right")
    t.add_column("note", overflow="fold")          # whole, folded over lines on a narrow terminal
    for r in df.to_dict("records"):
        num = (lambda v, f: "-" if v is None or v != v else f.format(v))
        t.add_row(str(r["tp"]), {True: "yes", False: "no"}.get(r["fits"], "-"),
                  num(r["max_rate_rps"], "{:.3g}"), num(r["replicas"], "{:.0f}"), num(r["gpus"], "{:.0f}"),
                  r["limited_by"], r["note"])
    console.print(t)
    best = df[df.best].iloc[0]
    console.print(f"smallest: TP {best.tp} x {best.replicas:.0f} replica(s) = [bold]{best.gpus:.0f} GPUs[/]",
                  highlight=False)


capacity.accepts_vllm_flags = True      # kvsim.cli.lazy registers it as a kvsim.cli.vllm_args.VllmCommand
