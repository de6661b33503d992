"""`kvsim trace gen|convert|stats`: make, convert and describe request traces (typer sub-app).

Mounted by kvsim.cli.app as `app.add_typer(trace_app, name="trace")`. Bad input prints the error (file,
line, field) to stderr and exits with status 2.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Optional

import typer

from kvsim.cli import bounds
from kvsim.cli.errors import USER_ERRORS, describe
from kvsim.files import check_output_file, write_json_atomic

trace_app = typer.Typer(help="Make, convert and describe request traces (JSONL, one request per line).",
                        no_args_is_help=True)

#: The names in the help texts (`kvsim.trace.formats.FORMATS`, `kvsim.trace.synthetic.PRESETS`; a test keeps
#: them equal), spelled out so that `--help` loads neither numpy nor the trace readers.
FORMAT_NAMES = ("auto", "jsonl", "azure", "mooncake", "vidur")
PRESET_NAMES = ("sharegpt", "alpaca", "arxiv")
FORMAT_HELP = f"Input format: {'|'.join(FORMAT_NAMES)} (auto: detected from the first line)."


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn bad input (TraceError and other ValueErrors, unreadable files) into exit status 2."""
    try:
        yield
    except USER_ERRORS as e:
        typer.echo(f"error: {describe(e)}", err=True)
        raise typer.Exit(2) from None


def check_hash_flag(trace, hash_block_size: int | None, path: Path) -> None:
    """`--hash-block-size` on a trace without block_hashes does not apply: refused, not ignored (a
    Mooncake or CSV file is refused by the reader, kvsim.trace.formats.read_trace)."""
    if hash_block_size is not None and trace.hash_offsets is None:
        raise ValueError(f"--hash-block-size: does not apply to {path}, which has no block_hashes")


def load_trace_checked(path: Path, trace_format, hash_block_size: int | None, block_size: int | None = None):
    """`kvsim run`/`compare`'s trace: read, `--hash-block-size` refused where it does not apply, and,
    given the block size of a prefix-caching run, a note on stderr when the file's block_hashes cover
    blocks of another size (Mooncake hash_ids: each splits into block-size pieces)."""
    from kvsim.trace.formats import load_trace

    tr = load_trace(path, trace_format, hash_block_size=hash_block_size)
    check_hash_flag(tr, hash_block_size, path)
    if block_size is not None and hash_block_size is None and tr.hash_block_size not in (None, block_size):
        typer.echo(f"note: {path}: block_hashes cover {tr.hash_block_size}-token blocks (Mooncake "
                   f"hash_ids); each splits into {block_size}-token blocks", err=True)
    return tr


@trace_app.command()
def gen(
    preset: str = typer.Option(..., help=f"Length distribution: {'|'.join(PRESET_NAMES)} (sharegpt, alpaca: the "
                               "vLLM paper's means; arxiv: arXiv summarization, long prompts)."),
    out: Path = typer.Option(..., "-o", "--out", help="Output JSONL file."),
    rate: float = typer.Option(2.0, help="Poisson arrival rate, requests per second."),
    duration: float = typer.Option(3600.0, help="Trace length in seconds (ignored with --num-requests)."),
    num_requests: Optional[int] = typer.Option(None, help="Exact number of requests instead of --duration."),
    n: int = typer.Option(1, help="Parallel samples per request."),
    beam_width: int = typer.Option(1, help="Beam width per request."),
    max_len: int = typer.Option(2048, help="Maximum prompt + output length in tokens (OPT: 2048)."),
    shared_prefix: int = typer.Option(0, "--shared-prefix", help="Few-shot workload: every prompt starts "
                                      "with the same prefix of this many tokens (paper: 80 or 341)."),
    seed: int = typer.Option(0, help="Random seed; the same seed gives the same trace."),
) -> None:
    """Generate a synthetic trace: Poisson arrivals, long-tailed prompt/output lengths in tokens."""
    from kvsim.trace.jsonl import write_jsonl
    from kvsim.trace.synthetic import generate

    with _user_errors():
        check_output_file(out, "-o")
        bounds.rate(rate)
        bounds.count(num_requests, "--num-requests")
        if num_requests is None:
            bounds.duration(duration)
            bounds.requests(rate, duration, "--rate x --duration")
        bounds.count(n, "--n", high=bounds.MAX_SAMPLES)
        bounds.count(beam_width, "--beam-width", high=bounds.MAX_SAMPLES)
        bounds.count(max_len, "--max-len", low=2, high=bounds.MAX_TOKENS)
        bounds.count(seed, "--seed", low=0, high=2**63 - 1)
        trace = generate(preset, rate_rps=rate, duration_s=duration, num_requests=num_requests, n=n,
                         beam_width=beam_width, max_len=max_len, shared_prefix_tokens=shared_prefix,
                         seed=seed)
        write_jsonl(trace, out, "-o")
    s = trace.summary()
    typer.echo(f"wrote {out}: {s['requests']} requests over {s['duration_s']:.1f} s, mean prompt "
               f"{s['prompt_tokens']['mean']:.2f} tokens, mean output {s['output_tokens']['mean']:.2f} tokens")


@trace_app.command()
def convert(
    src: Path = typer.Argument(..., help="Trace to convert (Azure CSV, Mooncake JSONL, Vidur CSV, JSONL)."),
    out: Path = typer.Option(..., "-o", "--out", help="Output kvsim JSONL file."),
    format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    rate: Optional[float] = typer.Option(None, help="Requests per second. Files without timestamps: Poisson "
                                         "arrivals at this rate (default: every arrival at 0 s); files with "
                                         "timestamps: arrival times rescaled to this mean rate."),
    time_scale: Optional[float] = typer.Option(None, "--time-scale", help="Multiply every arrival time "
                                               "by this factor (0.5 doubles the rate); not with --rate."),
    seed: int = typer.Option(0, help="Random seed for --rate arrivals."),
    max_requests: Optional[int] = typer.Option(None, min=1, help="Keep only the first N requests."),
    max_duration: Optional[float] = typer.Option(None, help="Keep only requests arriving before this many "
                                                 "seconds from the first one."),
) -> None:
    """Convert a trace to kvsim JSONL (arrival_s in seconds from the first request, lengths in tokens).

    Lengths of 0 tokens become 1 and are counted in the report printed at the end. --rate/--time-scale
    apply before --max-duration.
    """
    from kvsim.trace.table import rescale_trace
    from kvsim.trace.formats import read_trace
    from kvsim.trace.jsonl import write_jsonl

    with _user_errors():
        check_output_file(out, "-o")
        if rate is not None and time_scale is not None:
            raise ValueError("give --rate or --time-scale, not both")
        bounds.rate(rate)
        bounds.number(time_scale, "--time-scale", high=1e6)
        bounds.duration(max_duration, "--max-duration")
        bounds.count(seed, "--seed", low=0, high=2**63 - 1)
        trace, report = read_trace(src, format)
        if rate is not None and report.arrivals == "all 0":        # no timestamps: Poisson arrivals
            trace, report = read_trace(src, format, rate=rate, seed=seed)
        elif rate is not None or time_scale is not None:
            trace = rescale_trace(trace, time_scale=time_scale, rate_rps=rate)
            report = replace(report, arrivals=f"from the file, rescaled to {rate:g} req/s" if rate is not None
                             else f"from the file, times x {time_scale:g}")
        if max_duration is not None:
            trace = trace.until(max_duration)
        if max_requests is not None:
            trace = trace.head(min(max_requests, len(trace)))
        write_jsonl(trace, out, "-o")
    typer.echo(f"wrote {out}: {len(trace)} of {report.requests} requests from {report.source} "
               f"({report.format}); arrivals {report.arrivals}; zero lengths clamped to 1: "
               f"{report.zero_prompt_clamped} prompt, {report.zero_output_clamped} output")
    if trace.hash_block_size is not None:
        typer.echo(f"block_hashes use {trace.hash_block_size}-token blocks: "
                   f"run with --hash-block-size {trace.hash_block_size}")


def _stats_table(s: dict):
    """The length table (rich) and the lines of counts printed under it."""
    from rich.table import Table

    table = Table(title=f"{s['source']}: {s['requests']} requests", show_header=True)
    for col in ("tokens", "mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for key in ("prompt_tokens", "output_tokens"):
        d = s[key]
        table.add_row(key.split("_")[0], f"{d['mean']:.2f}", *(f"{d[k]:.0f}" for k in ("p50", "p90", "p99", "max")))
    rate = "n/a (all arrivals at 0 s)" if s["rate_rps"] is None else f"{s['rate_rps']:.3f} req/s"
    lines = [f"duration {s['duration_s']:.1f} s, rate {rate}",
             f"parallel samples n: mean {s['n']['mean']:.2f}, max {s['n']['max']}; "
             f"beam width max {s['beam_width']['max']}"]
    p = s["prefix"]
    if p["groups"]:
        lines.append(f"prefix groups: {p['groups']}, {p['requests_in_groups']} requests, mean shared prefix "
                     f"{p['mean_prefix_tokens']:.1f} tokens")
    if p["hash_blocks"]:
        lines.append(f"block hashes: {p['requests_with_hashes']} requests, {p['hash_blocks']} blocks, "
                     f"{p['unique_hash_blocks']} distinct, {p['hash_block_size'] or 'run block size'} tokens each")
    return table, lines


@trace_app.command()
def stats(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (any supported format)."),
    format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    hash_block_size: Optional[int] = typer.Option(None, min=1, help="Tokens per block of a JSONL trace's "
                                                  "block_hashes (default: unknown, the run's block size)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the summary as JSON here."),
) -> None:
    """Describe a trace: requests, duration (s), rate (req/s), prompt/output tokens, samples, prefixes."""
    from rich.console import Console

    from kvsim.trace.formats import read_trace

    with _user_errors():
        if json_out is not None:
            check_output_file(json_out, "--json")
        trace, _ = read_trace(trace_path, format, hash_block_size=hash_block_size)
        check_hash_flag(trace, hash_block_size, trace_path)
        s = trace.summary()
        if json_out is not None:
            write_json_atomic(json_out, s, "--json", end="\n")
    table, lines = _stats_table(s)
    console = Console()
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)
