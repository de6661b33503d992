"""What the CLI shows and writes: rich tables, a lazy progress bar, error exits, result files."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from kvsim.files import atomic_write, result_folder, write_text_atomic

#: Wide enough for `kvsim compare`'s five columns even when output is not a terminal.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True)

#: Wall-clock seconds a run must last before a progress bar appears.
PROGRESS_AFTER_S = 2.0


def error(message: str, code: int = 2) -> None:
    """Print `message` on stderr and exit with `code` (non-zero)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class Progress:
    """A progress bar over simulated time that shows itself only on a terminal, and only once the run
    has lasted PROGRESS_AFTER_S; call it with the current simulated time (s)."""

    def __init__(self, total_s: float, enabled: bool = True, label: str = "simulating"):
        self.total_s, self.label = max(total_s, 1e-9), label
        self.enabled = enabled and sys.stdout.isatty()
        self.bar: RichProgress | None = None
        self.start = time.perf_counter()

    def __enter__(self) -> "Progress | None":
        return self if self.enabled else None

    def __call__(self, now_s: float) -> None:
        if self.bar is None:
            if time.perf_counter() - self.start < PROGRESS_AFTER_S:
                return
            self.bar = RichProgress(TextColumn(self.label), BarColumn(), TextColumn("{task.description}"),
                                    TimeElapsedColumn(), console=console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("", total=self.total_s)
        self.bar.update(self.task, completed=min(now_s, self.total_s),
                        description=f"t = {now_s:,.0f} / {self.total_s:,.0f} s")

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _rows(s: dict) -> list[tuple[str, str]]:
    """(metric, value) pairs, compact enough for five runs side by side in a 100-column terminal."""
    kv, frac = s["kv"], s["kv"]["mean_fraction"]

    def q(d: dict, *keys: str) -> str:
        return "-" if d["p50"] is None else " / ".join(f"{d[k]:.3g}" for k in keys)

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
        ("swaps out / in (GB)", f"{s['swap']['swap_outs']:,} / {s['swap']['swap_ins']:,} "
                                f"({s['swap']['bytes'] / 1e9:.3g})" if "swap" in s else "-"),
        ("recomputed tokens", f"{s['recomputed_tokens']:,}" if "recomputed_tokens" in s else "-"),
        ("steps / wall (s)", f"{s['engine_steps']:,} / {s['sim_wall_s']:.2f}"),
    ]


def print_summary(summary: dict, title: str) -> None:
    """The summary of one run as a two-column table."""
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


def print_comparison(summaries: dict[str, dict], title: str) -> None:
    """Several runs' summaries side by side, one column each."""
    table = Table(title=title)
    table.add_column("metric", style="bold", no_wrap=True)
    rows = {name: _rows(s) for name, s in summaries.items()}
    for name in summaries:
        table.add_column(name.replace("-", "\n", 1), justify="right", no_wrap=True)
    for k, (metric, _) in enumerate(next(iter(rows.values()), [])):
        table.add_row(metric, *(rows[name][k][1] for name in summaries))
    console.print(table)


class StepsCsv:
    """A `simulate(step_sink=...)` that streams the step rows to `path` as they come (memory does not
    grow with the steps): written to a unique temporary name next to it (`.steps.csv.PID.RANDOM.tmp`,
    see kvsim.files.atomic_write), renamed by `commit()`. Write errors name `flag` and `path`."""

    def __init__(self, path: Path, flag: str = "--out"):
        self.path, self.flag, self.tmp = path, flag, None
        self._file = None

    def _open(self, header) -> None:
        import os
        import tempfile
        from kvsim.files import clean_stale_temps
        self.path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(self.path)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.{os.getpid()}.",
                                   suffix=".tmp")
        self.tmp = Path(tmp)
        self._file = os.fdopen(fd, "w")
        self._file.write(",".join(header) + "\n")

    def __call__(self, columns: dict) -> None:
        """Append one chunk of rows (numpy columns in `kvsim.engine.metrics.STEP_COLUMNS` order)."""
        try:
            if self._file is None:
                self._open(columns)
            # repr for floats and str for ints: what pandas' to_csv writes
            text = [list(map(repr if col.dtype.kind == "f" else str, col.tolist())) for col in columns.values()]
            self._file.write("".join(",".join(row) + "\n" for row in zip(*text)))
        except OSError as exc:
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> Exception:
        from kvsim.files import write_error
        return write_error(exc, self.path, self.flag)

    def commit(self) -> None:
        """Close the file and move it into place (a header only when there were no steps)."""
        try:
            if self._file is None:
                from kvsim.engine.metrics import STEP_COLUMNS
                self._open(STEP_COLUMNS)
            self._file.close()
            self.tmp.replace(self.path)
        except OSError as exc:
            raise self._error(exc) from None

    def discard(self) -> None:
        """Close and remove the temporary file (the run failed)."""
        if self._file is not None:
            from contextlib import suppress
            with suppress(OSError):
                self._file.close()
            self.tmp.unlink(missing_ok=True)


def write_outputs(out: Path, result, cfg, steps_csv: StepsCsv | None = None) -> None:
    """`steps.csv`, `requests.csv`, `config.json` and last `summary.json` into folder `out`, each file
    whole; the folder says INCOMPLETE until all are written (kvsim.files.result_folder). `steps_csv`:
    the steps were streamed there during the run (its temporary file goes if writing fails)."""
    try:
        with result_folder(out) as folder:
            if steps_csv is not None:
                steps_csv.commit()
            else:
                with atomic_write(folder / "steps.csv", newline="", flag="--out") as f:
                    result.steps.to_csv(f, index=False)
            with atomic_write(folder / "requests.csv", newline="", flag="--out") as f:
                result.requests.to_csv(f, index=False)
            write_text_atomic(folder / "config.json", json.dumps(cfg.to_dict(), indent=2, default=str), "--out")
            write_text_atomic(folder / "summary.json", json.dumps(result.summary, indent=2), "--out")
    except BaseException:
        if steps_csv is not None:
            steps_csv.discard()
        raise


def print_startup(cfg) -> None:
    """The start-up lines a vLLM user knows: the engine, the KV cache size in tokens and the maximum
    concurrency at the maximum model length (vLLM: blocks / ceil(max_model_len / block_size))."""
    from kvsim.engine.config import kv_capacity
    resolved = cfg.resolved()
    profile, sched = resolved.engine_profile, resolved.scheduler
    capacity, max_len = kv_capacity(cfg), cfg.deployment.model.max_seq_len
    paged, block = cfg.cache.allocator == "paged", cfg.cache.block_size
    policy = "prompt-only steps" if sched.separate_prefill else "mixed prefill/decode steps"
    chunked = ", chunked prefill" if sched.chunked_prefill else ""
    cpu = (f"CPU {profile.cpu_step_s * 1e3:.3g} ms + {profile.cpu_seq_s * 1e6:.3g} us per sequence per step"
           if profile.cpu_step_s or profile.cpu_seq_s else "no CPU time beyond the kernels' step overhead")
    blocks = f" ({capacity // block:,} blocks of {block})" if paged else " (contiguous)"
    per_request = -(-max_len // block) * block if paged else max_len
    prefix = ", prefix caching" if resolved.cache.prefix_caching else ""
    console.print(f"INFO engine profile {profile.name}: {policy}{chunked}{prefix}, {cpu}", highlight=False)
    from kvsim.planning.ledger import ledger_lines, memory_ledger
    for line in ledger_lines(memory_ledger(cfg))[:3]:        # weights, memory split, KV memory
        console.print(f"INFO {line}", highlight=False)
    if print_hybrid_startup(cfg, capacity):
        return
    console.print(f"INFO KV cache size: {capacity:,} tokens{blocks}, "
                  f"{cfg.deployment.kv_bytes_per_token() / 1024:,.0f} KiB per token", highlight=False)
    console.print(f"INFO Maximum concurrency for {max_len:,} tokens per request: {capacity / per_request:.2f}x",
                  highlight=False)


def print_hybrid_startup(cfg, simulated_tokens: int | None = None) -> bool:
    """For a model with layers other than full attention: vLLM 0.33's start-up lines (its KV cache
    groups, num_blocks, "GPU KV cache size" and "Maximum concurrency", `kvsim.specs.kv_groups`) and,
    with `simulated_tokens`, how the simulation holds the cache. False for other models."""
    from kvsim.engine.build import hybrid_groups
    from kvsim.engine.config import kv_cache_plan
    from kvsim.specs.layers import describe
    plan = kv_cache_plan(cfg)
    if plan is None:
        return False
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
    if simulated_tokens is not None and hybrid_groups(plan) is not None:
        console.print(f"INFO simulated as vLLM's hybrid KV cache manager: {len(plan.groups)} groups, one block "
                      f"table each, sharing {plan.num_blocks:,} blocks of {plan.block_size} tokens "
                      f"({plan.num_blocks * plan.block_size:,} token slots)", highlight=False)
    return True


def warn_swap_fallbacks(summary: dict, swap_gib: float) -> None:
    """One warning on stderr when swaps fell back to recompute for want of CPU swap space."""
    fallbacks = summary.get("swap", {}).get("fallbacks_to_recompute", 0)
    if fallbacks:
        err_console.print(f"[bold yellow]warning:[/] {fallbacks:,} preemption(s) meant to swap recomputed "
                          f"instead: the CPU swap space (--swap-space {swap_gib:g} GiB per GPU) was full",
                          highlight=False, soft_wrap=True)
