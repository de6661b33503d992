"""The block-size tuner: where fragmentation savings stop outweighing indirection overhead.

For each block size (tokens) the tuner simulates the trace twice with the paged allocator:
- *saturated*: every request released at t = 0, so the batch is as large as memory (or `max_num_seqs`)
  allows — its throughput is the deployment's capacity at that block size;
- *at the trace's own arrival times*: the latency a user would see at that load.
It then puts the two sides of the trade-off on one table:
- waste: reserved + internal fragmentation as a share of allocated KV (saturated run), and the
  analytic internal fragmentation at each request's peak, E[ceil(L / b) b - L] / E[ceil(L / b) b] with
  L = prompt + output - 1;
- indirection: the paged kernel's gather cost (the profile's kernel family, `kvsim.cost.kernels`, or a
  calibration: the decode-attention factor at b against a contiguous kernel) and the bookkeeping
  (block-table entries built and copied each step, blocks allocated and freed), both as a share of the
  step time (kernels + the profile's CPU time) at the saturated operating point.
Both runs use the profile's own kernel cost, so every run prices a block size the same way. Block
tables are counted as the profile's engine builds them: vLLM v0 (`padded-longest`) rebuilds every
sequence's table each step padded to the longest sequence of the batch; V1 (`persistent`) appends new
blocks only and copies `batch x ceil(max_model_len / b)` entries. The simulated throughput already
includes the kernel factor; the bookkeeping is not simulated, so the capacity is corrected by
step / (step + bookkeeping). The recommendation is the block size with the highest corrected capacity;
sizes within TOLERANCE of it form the good range. Candidates default to the block sizes the profile's
kernel runs; sizes it cannot run are simulated when asked for, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kvsim.engine.config import SimConfig, kv_cache_plan
from kvsim.cost.kernels import get_kernel
from kvsim.cost.profiles import CPU_VARIANTS, VARIANTS
from kvsim.cost.select import cost_model
from kvsim.planning.bookkeeping import Bookkeeping
from kvsim.planning.runs import capacity_tokens, make_config
from kvsim.planning.sweep.runner import run_sweep
from kvsim.engine.sim import SimResult, simulate
from kvsim.trace.table import Trace

#: Block sizes of the vLLM paper's study (tokens); the tuner's default is the profile kernel's own sizes.
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Block sizes whose corrected capacity is within this fraction of the best form the good range.
TOLERANCE = 0.02


@dataclass(frozen=True)
class TuneResult:
    """The curve (one row per block size), the recommended block size, its good range and the reason."""

    curve: pd.DataFrame
    recommended: int
    good_range: tuple[int, int]
    reason: str
    workload: dict
    warnings: tuple[str, ...] = ()


def peak_waste(trace: Trace, block_size: int) -> float:
    """Analytic internal fragmentation at each request's peak: unused slots of its last block over
    the slots its blocks hold, summed over requests (samples counted once)."""
    peak = trace.prompt_tokens + trace.output_tokens - 1
    held = -(-peak // block_size) * block_size
    return float((held - peak).sum() / held.sum())


def saturated(trace: Trace, min_requests: int = 0) -> Trace:
    """The same requests, all arriving at t = 0 (in trace order), repeated in order up to `min_requests`
    when the trace has fewer (and neither block hashes nor per-sample lengths, which would repeat too)."""
    num = len(trace)
    if min_requests <= num or trace.hash_values is not None or trace.sample_values is not None:
        return replace(trace, arrival_s=np.zeros(num))
    idx, pick = np.resize(np.arange(num), min_requests), (lambda a: None if a is None else a[idx])
    return replace(trace, arrival_s=np.zeros(min_requests), prompt_tokens=pick(trace.prompt_tokens),
                   output_tokens=pick(trace.output_tokens), n=pick(trace.n), beam_width=pick(trace.beam_width),
                   prefix_tokens=pick(trace.prefix_tokens), prefix_group=pick(trace.prefix_group), ids=None)


def queue_requests(trace: Trace, cfg: SimConfig) -> int:
    """Requests the saturated run needs for a queue to keep the batch full: twice what the deployment holds
    at once (max_num_seqs, or the KV slots over the mean prompt + output x samples). Without a queue the
    window would measure the prefill (e.g. 1,024 sequences on an H100 and a 427-request trace)."""
    peak = float((trace.prompt_tokens + trace.output_tokens * trace.n).mean())
    return 2 * int(np.ceil(min(cfg.batch_limits()[0], capacity_tokens(cfg) / peak)))


def _indirection(cfg: SimConfig, block_size: int, batch: float, context: float, entries: float,
                 allocs_frees: float, bk: Bookkeeping, copy_entries: float | None = None) -> tuple[float, float, float]:
    """(kernel gather s, bookkeeping s, step s) of one decode step of `batch` sequences reading
    `context` KV tokens in all, at `block_size`: the profile's kernel family (or the calibration) against
    a contiguous kernel; the step includes the profile's CPU time."""
    b, ctx, profile = max(1, round(batch)), int(context), cfg.profile()
    penalty = profile.paged_penalty or cfg.calibration is not None      # (kernels only: no CPU in them)
    kernels = replace(profile, overlap_cpu_step_s=0.0, overlap_cpu_seq_s=0.0, kernel_step_overhead=False)
    paged, contiguous = (cost_model(cfg.deployment, block_size, p, cfg.calibration, kernels, *cfg.batch_limits(),
                                    cfg.enforce_eager).step_time(0, 0, b, ctx) for p in (penalty, False))
    step = paged + profile.cpu_seconds(b)
    return paged - contiguous, bk.step_s(entries, allocs_frees, copy_entries), step


def _table_entries(cfg: SimConfig, trace: Trace, bs: int, batch: float, held: float,
                   new_blocks: float) -> tuple[float, float]:
    """(entries built, entries copied) per step as the profile's engine keeps block tables: v0 pads each
    sequence's table to the longest of the batch (its expected length: the batch/(batch+1) quantile of
    the requests' peak blocks, the expected maximum of `batch` draws); V1 appends `new_blocks` and copies
    a table row of ceil(max_model_len / b) entries per request. `held`: blocks held (no padding)."""
    if cfg.profile().block_table == "persistent":
        max_len = cfg.deployment.model.max_seq_len
        return new_blocks, batch * -(-max_len // bs)
    peak = trace.prompt_tokens + trace.output_tokens - 1
    q = batch / (batch + 1) if batch > 0 else 0.5
    longest = float(np.quantile(-(-peak // bs), q))
    padded = max(held, batch * longest)
    return padded, padded


def saturated_window(steps: pd.DataFrame, requests: pd.DataFrame) -> dict:
    """Means over the steps during which requests were waiting (the queue kept the cache full), time
    weighted: batch size, KV slots per state, blocks held, decode context; and the output tokens per
    second produced in that window. The drain at the end, when a few long requests run alone, is left
    out: it measures the trace's tail, not the deployment's capacity."""
    busy = steps[steps.waiting > 0]
    if busy.empty:
        busy = steps
    w = busy.duration_s.to_numpy()
    span = float(w.sum())
    end = float(busy.time_s.iloc[-1] + busy.duration_s.iloc[-1])
    first = int((requests.first_token_s <= end).sum())

    def avg(col: str) -> float:
        return float((busy[col].to_numpy() * w).sum() / span) if span else 0.0

    return {"span_s": span, "batch": avg("running"), "used_blocks": avg("used_blocks"),
            "token_states": avg("token_states"), "reserved": avg("reserved"),
            "internal": avg("internal_fragmentation"), "steps": len(busy),
            "tokens_per_s": (float(busy.decode_tokens.sum()) + first) / end if end else 0.0}


def _row(trace: Trace, cfg: SimConfig, bs: int, sat: SimResult, live: dict, bk: Bookkeeping) -> dict:
    """One point of the curve: saturated-window capacity and waste, indirection shares, and the latency
    of the run at the trace's own arrivals (`live`: a sweep row)."""
    win = saturated_window(sat.steps, sat.requests)
    allocated = win["token_states"] + win["reserved"] + win["internal"]
    entries = win["used_blocks"]                                       # blocks held, mean per step
    peak = trace.prompt_tokens + trace.output_tokens - 1
    per_request = float((-(-peak // bs) * np.maximum(trace.n, trace.beam_width)).mean())
    # Every request allocates and frees its blocks once: requests finished per step x 2 x blocks each.
    mean_step_s = win["span_s"] / max(1, win["steps"])
    finished_per_step = win["tokens_per_s"] / float(trace.output_tokens.mean()) * mean_step_s
    allocs_frees = 2 * per_request * finished_per_step
    built, copied = _table_entries(cfg, trace, bs, win["batch"], entries, allocs_frees / 2)
    gather_s, book_s, step_s = _indirection(cfg, bs, win["batch"], win["token_states"], built,
                                            allocs_frees, bk, copied)
    thr = win["tokens_per_s"]
    return {
        "block_size": bs,
        "waste_fraction": (win["reserved"] + win["internal"]) / allocated if allocated else 0.0,
        "peak_internal_fraction": peak_waste(trace, bs),
        "mean_batch_size": win["batch"],
        "throughput_tokens_per_s": thr,
        "preemptions": sat.summary["preemptions"],
        "block_table_entries": built,
        "block_table_entries_copied": copied,
        "blocks_alloc_free_per_step": allocs_frees,
        "gather_fraction": gather_s / step_s,
        "bookkeeping_fraction": book_s / (step_s + book_s),
        "indirection_fraction": (gather_s + book_s) / (step_s + book_s),
        "capacity_tokens_per_s": thr * step_s / (step_s + book_s),
        "latency_s_per_token": live["normalized_latency_s_per_token"],
        "ttft_p99_s": live["ttft_s_p99"],
    }


def tune_block_size(trace: Trace | str, *, block_sizes=None, bookkeeping: Bookkeeping | None = None,
                    workers: int | None = 1, cpu_variants: bool = True, **flags) -> TuneResult:
    """Sweep `block_sizes` (tokens; default: the sizes the profile's kernel runs) for `trace` (a Trace or
    a trace file) with the paged allocator on the deployment given by run `flags` (as
    `kvsim.make_config`: model, gpu, tp, kv_gib, engine_profile, ...) and recommend one (the measure is
    in the module docstring). With `cpu_variants`, the saturated runs are repeated under the profile's
    low and high CPU-time variants and a recommendation that moves is reported as a range. Deterministic.

    >>> import kvsim
    >>> tr = kvsim.generate_trace("alpaca", rate_rps=20, num_requests=200, seed=0)
    >>> r = kvsim.tune_block_size(tr, model="opt-13b", kv_gib=2, engine_profile="vllm-2023")
    >>> list(r.curve.block_size), r.workload["kernel"]     # the sizes the 2023 kernel runs
    ([8, 16, 32], 'vllm-v0-paged')
    """
    if not isinstance(trace, Trace):
        from kvsim.trace.formats import load_trace
        trace = load_trace(trace)
    if len(trace) == 0:
        raise ValueError("the trace has no requests")
    flags = {**flags, "allocator": "paged"}
    kernel = get_kernel(make_config(**flags).profile().kernel)
    sizes = sorted({int(b) for b in (kernel.candidates() if block_sizes is None else block_sizes)})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"block sizes must be >= 1 token, got {list(block_sizes or [])}")
    warnings = tuple(f"block size {b}: the {kernel.name} kernel does not run it (it runs "
                     f"{kernel.accepted_text()}); simulated anyway" for b in sizes if not kernel.accepts(b))
    bk = bookkeeping or Bookkeeping()
    cfgs = [make_config(**flags, block_size=b) for b in sizes]
    need = queue_requests(trace, cfgs[0])
    sat = [simulate(saturated(trace, need), c) for c in cfgs]
    rows = run_sweep({"block_size": sizes}, base=flags, trace=trace, workers=workers)
    failed = rows[rows.status != "ok"]
    if len(failed):
        raise ValueError(f"block size {failed.block_size.iloc[0]}: {failed.error.iloc[0]}")
    live = rows.to_dict("records")
    curve = pd.DataFrame([_row(trace, c, b, s, l, bk) for c, b, s, l in zip(cfgs, sizes, sat, live)])
    best = curve.capacity_tokens_per_s.max()
    good = curve[curve.capacity_tokens_per_s >= best * (1 - TOLERANCE)].block_size
    rec = int(curve.block_size[curve.capacity_tokens_per_s.idxmax()])
    workload = {"requests": len(trace), "mean_prompt": float(trace.prompt_tokens.mean()),
                "mean_output": float(trace.output_tokens.mean()),
                "mean_peak": float((trace.prompt_tokens + trace.output_tokens - 1).mean()),
                "capacity_tokens": sat[0].summary["kv"]["capacity_tokens"], "bookkeeping": bk.source,
                "kernel": kernel.name, "kernel_basis": kernel.basis, "kernel_source": kernel.source,
                "engine_profile": cfgs[0].profile().name}
    profile = cfgs[0].profile()
    base = profile.name.split(":")[0]
    by_variant = {profile.variant or "as given": rec}
    if cpu_variants and base in CPU_VARIANTS and profile.variant in VARIANTS:
        for v in (x for x in VARIANTS if x != profile.variant):
            vc = [make_config(**{**flags, "engine_profile": f"{base}:{v}"}, block_size=b) for b in sizes]
            vcurve = pd.DataFrame([_row(trace, c, b, simulate(saturated(trace, need), c), l, bk)
                                   for c, b, l in zip(vc, sizes, live)])
            by_variant[v] = int(vcurve.block_size[vcurve.capacity_tokens_per_s.idxmax()])
    workload["recommended_by_cpu_variant"] = by_variant
    result = TuneResult(curve, rec, (int(good.min()), int(good.max())), "", workload, warnings)
    return replace(result, reason=explain(result) + _edge_note(rec, sizes, kernel) + _raised_note(cfgs, sizes)
                   + _basis_note(profile, kernel, bk, cfgs[0].calibration is not None, by_variant))


def _basis_note(profile, kernel, bk: Bookkeeping, calibrated: bool, by_variant: dict) -> str:
    """Which costs are measured, published or assumed, and how the answer moves across CPU variants."""
    cpu = ("measured rows, " + profile.source if profile.cpu_step_s or profile.cpu_seq_s else "none")
    gather = "measured (--calibration)" if calibrated else f"{kernel.basis} ({kernel.source})"
    book = "measured on this CPU" if bk.source.startswith("measured") else "assumed (stored defaults)"
    text = f" Costs: paged kernel {gather}; CPU time {cpu}; bookkeeping {book}."
    picks = sorted(set(by_variant.values()))
    if len(by_variant) > 1:
        text += " Across CPU-time variants: " + ", ".join(f"{v} {b}" for v, b in by_variant.items()) + (
            f", so the recommendation is a range, {picks[0]} to {picks[-1]} tokens." if len(picks) > 1
            else ": the same block size under each.")
    return text


def _edge_note(rec: int, sizes: list[int], kernel) -> str:
    """A sentence when the best size is at an edge of the grid: whether the kernel runs the next size."""
    if len(sizes) < 2 or rec not in (sizes[0], sizes[-1]):
        return ""
    nxt = rec * 2 if rec == sizes[-1] else rec // 2
    side = "largest" if rec == sizes[-1] else "smallest"
    if nxt >= 1 and kernel.accepts(nxt):
        return (f" Grid edge: {rec} is the {side} size tried and the {kernel.name} kernel also runs {nxt}: "
                f"widen --block-sizes to see whether it is better.")
    return f" Grid edge: {rec} is the {side} size tried; the {kernel.name} kernel runs no {'larger' if nxt > rec else 'smaller'} power of two."


def _raised_note(cfgs: list, sizes: list[int]) -> str:
    """A sentence when vLLM's plan runs a candidate at another block size (Mamba / linear-attention
    layers: the attention block grows until a page covers a state), else ''."""
    plans = [kv_cache_plan(c.resolved()) for c in cfgs]
    raised = [(b, p.block_size) for b, p in zip(sizes, plans) if p is not None and p.block_size != b]
    if not raised:
        return ""
    pairs = ", ".join(f"{b} -> {actual}" for b, actual in raised)
    return (f" Note: vLLM runs this model's attention with larger blocks than asked, so that a page covers "
            f"its Mamba state (asked -> run: {pairs} tokens): the runs compare those block sizes, not the "
            f"ones asked.")


def explain(r: TuneResult) -> str:
    """Why the recommended block size wins, in numbers from the curve."""
    c = r.curve.set_index("block_size")
    row = c.loc[r.recommended]
    sizes = list(c.index)
    k = sizes.index(r.recommended)
    parts = [f"Block size {r.recommended} gives the highest capacity, "
             f"{row.capacity_tokens_per_s:,.0f} output tokens/s with {row.mean_batch_size:.1f} requests "
             f"batched on average (requests peak at {r.workload['mean_peak']:.0f} tokens on average)."]
    if k > 0:
        lo = c.loc[sizes[0]]
        parts.append(f"Smaller blocks waste less ({100 * lo.waste_fraction:.1f}% of allocated KV at "
                     f"block {sizes[0]} against {100 * row.waste_fraction:.1f}%) but pay for indirection: "
                     f"the paged gather and block bookkeeping take {100 * lo.indirection_fraction:.1f}% "
                     f"of a decode step at block {sizes[0]} against {100 * row.indirection_fraction:.1f}% "
                     f"(capacity {lo.capacity_tokens_per_s:,.0f} tokens/s).")
    if k < len(sizes) - 1:
        hi = c.loc[sizes[-1]]
        parts.append(f"Larger blocks cut indirection to {100 * hi.indirection_fraction:.1f}% at block "
                     f"{sizes[-1]} but waste {100 * hi.waste_fraction:.1f}% of allocated KV "
                     f"({100 * hi.peak_internal_fraction:.1f}% of each request's blocks at its peak), "
                     f"so only {hi.mean_batch_size:.1f} requests fit on average "
                     f"(capacity {hi.capacity_tokens_per_s:,.0f} tokens/s).")
    from kvsim.planning.tune_notes import within_note
    parts.append(within_note(c, r.recommended, r.good_range, TOLERANCE))
    return " ".join(parts)
