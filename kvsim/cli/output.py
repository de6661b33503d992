"""What the CLI shows and writes: rich tables, a lazy progress bar, error exits, result files."""

from __future__ import annotations

import sys
import time
from functools import cache

import typer

from kvsim.cli.run_files import StepsCsv, write_outputs  # noqa: F401 (re-exported for kvsim run)


@cache
def _console(name: str):
    """The shared rich `Console` on stdout (`console`, wide enough for `kvsim compare`'s five columns
    even when output is not a terminal) or stderr (`err_console`), made on first use: rich is loaded
    only when something is printed (a `--quiet` run prints nothing and saves its import time)."""
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 120) if name == "console" else Console(stderr=True)


def __getattr__(name: str):
    """`from kvsim.cli.output import console` (or `err_console`): the console, made on first use."""
    if name in ("console", "err_console"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Wall-clock seconds a run must last before a progress bar appears.
PROGRESS_AFTER_S = 2.0


def error(message: str, code: int = 2) -> None:
    """Print `message` on stderr and exit with `code` (non-zero)."""
    from rich.markup import escape
    _console("err_console").print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class Progress:
    """A progress bar over simulated time that shows itself only on a terminal, and only once the run
    has lasted PROGRESS_AFTER_S; call it with the current simulated time (s)."""

    def __init__(self, total_s: float, enabled: bool = True, label: str = "simulating"):
        self.total_s, self.label = max(total_s, 1e-9), label
        self.enabled = enabled and sys.stdout.isatty()
        self.bar = None                        # a rich progress bar, once shown
        self.start = time.perf_counter()

    def __enter__(self) -> "Progress | None":
        return self if self.enabled else None

    def __call__(self, now_s: float) -> None:
        if self.bar is None:
            if time.perf_counter() - self.start < PROGRESS_AFTER_S:
                return
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress
            self.bar = RichProgress(TextColumn(self.label), BarColumn(), TextColumn("{task.description}"),
                                    TimeElapsedColumn(), console=_console("console"), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("", total=self.total_s)
        self.bar.update(self.task, completed=min(now_s, self.total_s),
                        description=progress_text(now_s, self.total_s))

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def progress_text(now_s: float, total_s: float) -> str:
    """The progress bar's words: simulated time against the last arrival, and past it (the run drains
    the requests still queued or running) the time alone, never a count beyond its total.

    >>> progress_text(300, 600), progress_text(3152, 600)
    ('t = 300 / 600 s', 't = 3,152 s: draining after the last arrival at 600 s')
    """
    if now_s <= total_s:
        return f"t = {now_s:,.0f} / {total_s:,.0f} s"
    return f"t = {now_s:,.0f} s: draining after the last arrival at {total_s:,.0f} s"


def rejection_note(requests) -> str:
    """Why requests were rejected on arrival, grouped by kind (the `reason` column of `requests.csv`
    with its numbers taken out), one example each; "" when none were.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"status": ["rejected", "finished", "rejected"], "reason": [
    ...     "prompt + output = 35664 tokens exceeds the model's maximum length 32768", "",
    ...     "prompt + output = 90423 tokens exceeds the model's maximum length 32768"]})
    >>> print(rejection_note(df))
    2 of 3 requests rejected on arrival: 2 like "prompt + output = 35664 tokens exceeds the model's maximum length 32768" (--max-model-len)
    """
    import re
    rejected = requests[requests.status == "rejected"]
    if rejected.empty:
        return ""
    groups = rejected.reason.groupby(rejected.reason.map(lambda r: re.sub(r"\d+", "N", str(r))), sort=False)
    hints = {"maximum length": " (--max-model-len)", "max_batched_tokens": " (--max-num-batched-tokens)",
             "max_num_seqs": " (--max-num-seqs)", "whole cache": " (--kv-gib / --gpu-memory-utilization)"}
    parts = []
    for _, g in sorted(groups, key=lambda kg: -len(kg[1])):
        hint = next((h for k, h in hints.items() if k in g.iloc[0]), "")
        parts.append((f"{len(g):,} like" if len(g) > 1 else "1:") + f" \"{g.iloc[0]}\"{hint}")
    return f"{len(rejected):,} of {len(requests):,} requests rejected on arrival: " + "; ".join(parts)


def _rows(s: dict) -> list[tuple[str, str]]:
    """(metric, value) pairs, compact enough for five runs side by side in a 100-column terminal."""
    kv, frac = s["kv"], s["kv"]["mean_fraction"]

    def q(d: dict, *keys: str) -> str:     # 3 significant digits; whole numbers from 1,000 on (no 1.34e+03)
        return "-" if d["p50"] is None else " / ".join(
            f"{d[k]:,.0f}" if abs(d[k]) >= 1000 else f"{d[k]:.3g}" for k in keys)

    norm = s["normalized_latency_s_per_token"]
    return [
        ("finished / total", f"{s['requests_finished']:,} / {s['requests_total']:,}"),
        ("rejected", f"{s['requests_rejected']:,}"),
        ("duration (s)", f"{s['duration_s']:,.1f}"),
        ("throughput (req/s)", f"{s['throughput_rps']:.3g}"),
        ("throughput (tok/s)", f"{s['throughput_tokens_per_s']:,.0f}"),
        ("batch mean / max", f"{s['mean_batch_size']:.1f} / {s['max_batch_size']}"),
        ("norm. latency (s/tok)", "-" if norm is None else f"{norm:.4g}"),
        ("TTFT p50 / p99 (s)", q(s["ttft_s"], "p50", "p99")),
        ("TPOT p50 / p99 (s)", q(s["tpot_s"], "p50", "p99")),
        ("e2e p50 / p99 (s)", q(s["e2e_s"], "p50", "p99")),
        ("preemptions", f"{s['preemptions']:,}"),
        ("KV capacity (tokens)", f"{kv['capacity_tokens']:,}"),
        ("KV token states", f"{frac['token_states']:.1%}"),
        ("KV reserved", f"{frac['reserved']:.1%}"),
        ("KV internal frag.", f"{frac['internal_fragmentation']:.1%}"),
        ("KV external frag.", f"{frac['external_fragmentation']:.1%}"),
        ("KV free", f"{frac['free']:.1%}"),
        ("KV peak allocated", f"{kv['peak_allocated_fraction']:.1%}"),
        ("sharing saved", f"{kv['sharing_saved_fraction']:.1%}"),
        ("prefix-cache hits (tok)", f"{s['prefix_cache_hit_tokens']:,} "
                                    f"({s['prefix_cache_hit_rate']:.1%} of prompt tokens)"),
        ("engine profile", s.get("engine_profile", "-")),
        ("waited on KV / seqs / budget", " / ".join(f"{s['limited_by'][k]:.0%}" for k in
                                                   ("kv_memory", "max_num_seqs", "token_budget"))
         if "limited_by" in s else "-"),
        ("compute-bound steps", f"{s['compute_bound_fraction']:.0%}" if "compute_bound_fraction" in s else "-"),
        ("GPU busy (steps / span)", f"{s['gpu_busy_fraction']:.0%}" if "gpu_busy_fraction" in s else "-"),
        ("swaps out / in (GB)", f"{s['swap']['swap_outs']:,} / {s['swap']['swap_ins']:,} "
                                f"({s['swap']['bytes'] / 1e9:.3g})" if "swap" in s else "-"),
        ("recomputed tokens", f"{s['recomputed_tokens']:,}" if "recomputed_tokens" in s else "-"),
        ("steps / wall (s)", f"{s['engine_steps']:,} / {s['sim_wall_s']:.2f}"),
    ]


def print_summary(summary: dict, title: str, requests=None) -> None:
    """The summary of one run as a two-column table; given the per-request table, a note on why
    requests were rejected (when any were)."""
    from rich.table import Table
    console = _console("console")
    table = Table(title=title, show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    for name, value in _rows(summary):
        table.add_row(name, value)
    for g in summary["kv"].get("groups", ()):       # a hybrid model's KV cache groups
        span = f" W{g['window']}" if "window" in g else f" C{g['chunk']}" if "chunk" in g else ""
        table.add_row(f"KV group {g['kind']}{span}", f"{g['mean_blocks']:,.0f} blocks, "
                      f"{g['mean_fraction']['token_states']:.1%} token states")
    console.print(table)
    if requests is not None and summary["requests_rejected"]:
        console.print(f"note: {rejection_note(requests)}", highlight=False, soft_wrap=True)


def print_comparison(summaries: dict[str, dict], title: str,
                     kv_tokens: dict[str, tuple[int, int]] | None = None) -> None:
    """Several runs' summaries side by side, one column each. `kv_tokens` (a model whose layers are not
    all full attention: its allocators' own slots differ in unit, a token of one KV cache group, of every
    layer, or of gcd bytes): each column's (KV tokens at the maximum length, that length), vLLM's figure
    computed alike for every column (`kvsim.planning.studies.hybrid.max_len_tokens`), shown in the
    capacity row with the column's own slots beside it."""
    from rich.table import Table
    console = _console("console")
    table = Table(title=title)
    table.add_column("metric", style="bold", no_wrap=True)
    rows = {name: _rows(s) for name, s in summaries.items()}
    for name, (tokens, max_len) in (kv_tokens or {}).items():
        rows[name] = [(f"KV tokens at {max_len:,} (own slots)", f"{tokens:,} "
                       f"({summaries[name]['kv']['capacity_tokens']:,})") if m == "KV capacity (tokens)" else (m, v)
                      for m, v in rows[name]]
    for name in summaries:
        table.add_column(name.replace("-", "\n", 1), justify="right", no_wrap=True)
    for k, (metric, _) in enumerate(next(iter(rows.values()), [])):
        table.add_row(metric, *(rows[name][k][1] for name in summaries))
    # piped or redirected: as wide as the table needs (a file has no width to fit, so never truncate)
    width = console.width
    if not console.is_terminal:
        console.width = max(width, console.measure(table, options=console.options.update_width(100_000)).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def print_startup(cfg) -> None:
    """The start-up lines a vLLM user knows: the engine, the KV cache size in tokens and the maximum
    concurrency at the maximum model length (vLLM: blocks / ceil(max_model_len / block_size)), on
    stderr with the run's notes (stdout keeps the summary)."""
    from kvsim.engine.config import kv_capacity
    console = _console("err_console")
    resolved = cfg.resolved()
    profile, sched = resolved.engine_profile, resolved.scheduler
    capacity, max_len = kv_capacity(cfg), cfg.deployment.model.max_seq_len
    paged, block = cfg.cache.allocator == "paged", cfg.cache.block_size
    policy = "prompt-only steps" if sched.separate_prefill else "mixed prefill/decode steps"
    chunked = ", chunked prefill" if sched.chunked_prefill else ""
    cpu = (f"CPU {profile.cpu_step_s * 1e3:.3g} ms + {profile.cpu_seq_s * 1e6:.3g} us per sequence per step"
           if profile.cpu_step_s or profile.cpu_seq_s else "no CPU time beyond the kernels' step overhead")
    if profile.time_model == "vllm-v1":
        cpu = (f"CUDA graphs, CPU {profile.overlap_cpu_step_s * 1e3:.3g} ms + {profile.overlap_cpu_seq_s * 1e6:.3g} us "
               f"per sequence overlapped with the GPU + a {profile.cpu_step_s * 1e3:.2g} ms gap per step")
    blocks = f" ({capacity // block:,} blocks of {block})" if paged else " (contiguous)"
    per_request = -(-max_len // block) * block if paged else max_len
    prefix = ", prefix caching" if resolved.cache.prefix_caching else ""
    console.print(f"INFO engine profile {profile.name}: {policy}{chunked}{prefix}, {cpu}", highlight=False)
    from kvsim.planning.reports.ledger import ledger_lines, memory_ledger
    for line in ledger_lines(memory_ledger(cfg))[:3]:        # weights, memory split, KV memory
        console.print(f"INFO {line}", highlight=False)
    if print_hybrid_startup(cfg, capacity, "err_console"):
        return
    console.print(f"INFO KV cache size: {capacity:,} tokens{blocks}, "
                  f"{cfg.deployment.kv_bytes_per_token() / 1024:,.0f} KiB per token", highlight=False)
    console.print(f"INFO Maximum concurrency for {max_len:,} tokens per request: {capacity / per_request:.2f}x",
                  highlight=False)


def print_hybrid_startup(cfg, simulated_tokens: int | None = None, stream: str = "console") -> bool:
    """For a model with layers other than full attention: vLLM 0.33's start-up lines (its KV cache
    groups, num_blocks, "GPU KV cache size" and "Maximum concurrency", `kvsim.specs.kv_groups`) and,
    with `simulated_tokens`, how the simulation holds the cache (on `stream`: `console` or
    `err_console`). False for other models."""
    from kvsim.engine.build import hybrid_groups
    from kvsim.engine.config import kv_cache_plan
    from kvsim.specs.layers import describe
    plan = kv_cache_plan(cfg)
    if plan is None:
        return False
    console = _console(stream)
    kinds = ", ".join(f"{g.kind}" + (f" W{g.window}" if g.window else f" C{g.chunk}" if g.chunk else "")
                      + f" x{g.num_layers}" for g in plan.groups)
    console.print(f"INFO {cfg.deployment.model.name}: {describe(cfg.deployment.model.groups)}; "
                  f"{len(plan.groups)} KV cache group(s) ({kinds}), block size {plan.block_size}, "
                  f"{plan.bytes_per_block:,} bytes per block per GPU, num_blocks {plan.num_blocks:,}"
                  f"{'' if plan.hybrid else ' (hybrid KV cache manager off)'}", highlight=False)
    console.print(f"INFO GPU KV cache size: {plan.capacity_tokens:,} tokens", highlight=False)
    console.print(f"INFO Maximum concurrency for {plan.max_model_len:,} tokens per request: "
                  f"{plan.max_concurrency:.2f}x", highlight=False)
    if plan.note:
        console.print(f"note: {plan.note}", highlight=False)
    if simulated_tokens is not None and cfg.cache.allocator == "jenga":
        from kvsim.engine.build import jenga_allocator
        alloc = jenga_allocator(cfg.resolved())
        lay = alloc.layout
        console.print(f"INFO simulated as Jenga's LCM two-level allocator (Zhang et al., SOSP 2025), not vLLM's "
                      f"hybrid manager: each group keeps its own page size, in {lay.num_large:,} large pages of "
                      f"{lay.large_page_bytes:,} bytes (their LCM); KV capacity {alloc.capacity_tokens:,} token "
                      f"slots of {lay.unit_bytes / lay.block_size:,.0f} bytes (the GCD of the page sizes over the "
                      f"block size): its memory figures count these slots", highlight=False)
    elif simulated_tokens is not None and hybrid_groups(plan) is not None:
        console.print(f"INFO simulated as vLLM's hybrid KV cache manager: {len(plan.groups)} groups, one block "
                      f"table each, sharing {plan.num_blocks:,} blocks of {plan.block_size} tokens "
                      f"({plan.num_blocks * plan.block_size:,} token slots)", highlight=False)
    return True


def warn_swap_fallbacks(summary: dict, swap_gib: float) -> None:
    """One warning on stderr when swaps fell back to recompute for want of CPU swap space."""
    fallbacks = summary.get("swap", {}).get("fallbacks_to_recompute", 0)
    if fallbacks:
        _console("err_console").print(
            f"[bold yellow]warning:[/] {fallbacks:,} preemption(s) meant to swap recomputed instead: the CPU "
            f"swap space (--swap-space {swap_gib:g} GiB per GPU) was full", highlight=False, soft_wrap=True)
