"""Hybrid models under each KV cache layout (issue 23 item 8): Jenga's question asked of kvsim.

For gpt-oss-120b, Gemma-3-27B and Llama-4-Scout on a ShareGPT-like and a long-prompt (arXiv
summarization-like) trace, the same GPU memory is held as
- `uniform pages`: vLLM with `--disable-hybrid-kv-cache-manager` (every layer sized and kept as full
  attention: the PagedAttention of 2023 applied to a 2025 model);
- `vLLM hybrid manager`: vLLM 0.33's KV cache groups (sliding and chunked groups free what left their
  window; for Llama 4 vLLM's own default turns it off, `--hybrid-kv-cache` turns it on here);
- `Jenga`: Jenga's two-level allocator (SOSP 2025): one group per layer kind at its natural page size,
  large pages of their LCM, a request's small pages placed together (`kvsim.alloc.jenga`);
- `contiguous`: one reservation of the maximum length per request, each layer group its share (a
  sliding group its window, a chunked group its chunk: `kvsim.alloc.contiguous.groups`);
and kvsim reports the start-up figures (KV tokens, maximum concurrency at the maximum length), then
simulates each trace to give the batch the memory sustains, throughput, preemptions and the KV memory
a running request holds on average (`kv_per_request_mib`: allocated KV bytes per GPU over the mean
batch) and the time-averaged share of the pool that is free but unusable (`stranded`: Jenga's small
pages stranded in another group's large pages; contiguous: external fragmentation). `waste_vs_hybrid` is the share of that memory the hybrid manager would not need,
1 - hybrid / system. Seconds, tokens, MiB per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from kvsim.engine.build import build_run, jenga_allocator
from kvsim.engine.config import concurrent_batches, kv_cache_plan, kv_capacity
from kvsim.specs.kv_groups import blocks_per_request
from kvsim.planning.runs import make_config, simulate
from kvsim.trace.synthetic import generate

#: Deployments: each model on GPUs that hold its weights with room for KV (bf16 weights unless the
#: checkpoint is quantized: gpt-oss ships MXFP4 experts), at a maximum length users serve.
MODELS: dict[str, dict] = {
    "gpt-oss-120b": {"model": "gpt-oss-120b", "gpu": "h100-80gb", "tp": 1, "max_model_len": 32768},
    "Gemma-3-27B": {"model": "gemma-3-27b", "gpu": "h100-80gb", "tp": 1, "max_model_len": 32768},
    "Llama-4-Scout": {"model": "llama-4-scout", "gpu": "h100-80gb", "tp": 4, "max_model_len": 32768},
}
#: The layouts compared, as run flags.
SYSTEMS: dict[str, dict] = {
    "uniform pages": {"allocator": "paged", "hybrid_kv_cache": False},
    "vLLM hybrid manager": {"allocator": "paged", "hybrid_kv_cache": True},
    "Jenga": {"allocator": "jenga"},
    "contiguous": {"allocator": "contiguous", "reserve": "max"},
}
#: Workloads: (trace preset, request rate req/s, maximum prompt + output tokens of the generator).
WORKLOADS: dict[str, tuple[str, float, int]] = {
    "ShareGPT-like": ("sharegpt", 24.0, 8192),
    "long prompts (arXiv-like)": ("arxiv", 6.0, 8192),
}
MIB = 1024**2

#: Jenga's published figures (Zhang et al., SOSP 2025, arXiv 2503.18292): what the paper measured,
#: quoted for comparison only; kvsim never fits anything to them.
PUBLISHED: tuple[tuple[str, str], ...] = (
    ("GPU memory utilization, Jenga vs vLLM (best case)", "up to 79.6% better"),
    ("fragmentation study: KV memory wasted, vLLM vs Jenga", "38.2% vs 0.04%"),
    ("uniform paging waste, Gemma-2 (1:1 sliding/full)", "up to 25%"),
    ("uniform paging waste, Ministral (sliding-heavy)", "56.25%"),
    ("serving throughput, Jenga vs vLLM", "up to 4.92x (1.80x on average)"),
)


@dataclass(frozen=True)
class StudyPlan:
    """Which models, layouts and workloads, and how long each trace is (seconds)."""

    models: dict = field(default_factory=lambda: dict(MODELS))
    systems: dict = field(default_factory=lambda: dict(SYSTEMS))
    workloads: dict = field(default_factory=lambda: dict(WORKLOADS))
    duration_s: float = 600.0
    seed: int = 0


QUICK = StudyPlan(models={"gpt-oss-120b": MODELS["gpt-oss-120b"]},
                  workloads={"ShareGPT-like": WORKLOADS["ShareGPT-like"]}, duration_s=30.0)


def startup_row(flags: dict) -> dict:
    """`startup_figures` of the configuration of run `flags`."""
    return startup_figures(make_config(**flags))


def max_len_tokens(configs: dict) -> dict:
    """{name: (KV tokens at the maximum length (`startup_figures`), that length)} for `kvsim compare`'s
    columns of a model whose layers are not all full attention, else {} (its columns' slots are tokens)."""
    if not any(c.deployment.model.is_hybrid for c in configs.values()):
        return {}
    return {name: (startup_figures(cfg)["kv_tokens"], cfg.deployment.model.max_seq_len)
            for name, cfg in configs.items()}


def startup_figures(cfg) -> dict:
    """KV tokens and maximum concurrency at the maximum length: vLLM 0.33's start-up figures (paged
    layouts); for Jenga, the same formula over its pages (pool / the bytes a max-length request needs per
    layer kind, counted in blocks per kind by vLLM's rule at Jenga's block size); for contiguous layouts, whole
    max-length reservations (each group its share) and their tokens. The one figure comparable across
    layouts (`kvsim compare` prints it for hybrid models): each allocator's own slots differ in unit."""
    cfg = cfg.resolved()
    max_len = cfg.deployment.model.max_seq_len
    if cfg.cache.allocator == "jenga":
        alloc = jenga_allocator(cfg)
        pool = alloc.layout.num_large * alloc.layout.large_page_bytes
        in_flight = concurrent_batches(cfg) * cfg.scheduler.max_batched_tokens
        need = sum(g.page_bytes * blocks_per_request(g.kind, g.window, g.chunk, cfg.cache.block_size, max_len,
                                                     in_flight, cfg.cache.prefix_caching) for g in alloc.groups)
        conc = pool / need
        return {"kv_tokens": int(conc * max_len), "max_concurrency": conc, "kv_bytes_per_gpu": pool}
    plan = kv_cache_plan(cfg) if cfg.cache.allocator == "paged" else None
    if plan is not None:
        return {"kv_tokens": plan.capacity_tokens, "max_concurrency": plan.max_concurrency,
                "kv_bytes_per_gpu": plan.num_blocks * plan.bytes_per_block}
    alloc = build_run(generate("sharegpt", num_requests=1, max_len=max_len), cfg).allocator
    per_byte = getattr(alloc, "unit_bytes", cfg.deployment.kv_bytes_per_token() // cfg.deployment.tp)
    whole = alloc.capacity_tokens // alloc.peak_slots(max_len, max_len)
    return {"kv_tokens": whole * max_len, "max_concurrency": float(whole),
            "kv_bytes_per_gpu": alloc.capacity_tokens * per_byte}


def run_study(plan: StudyPlan = StudyPlan()) -> pd.DataFrame:
    """One row per (model, workload, system): start-up figures and the simulated run's summary."""
    from kvsim.planning.progress_lines import Lines

    rows = []
    lines = Lines("hybrid-study", len(plan.workloads) * len(plan.models) * len(plan.systems), every_s=0.0)
    for wname, (preset, rate, max_len) in plan.workloads.items():
        trace = generate(preset, rate_rps=rate, duration_s=plan.duration_s, max_len=max_len, seed=plan.seed)
        for mname, mflags in plan.models.items():
            for sname, sflags in plan.systems.items():
                lines.advance(n=0, what=f"running {mname}, {wname}, {sname}")
                flags = {**mflags, **sflags}
                row = {"model": mname, "workload": wname, "system": sname, "rate_rps": rate, **startup_row(flags)}
                s = simulate(trace, **flags).summary
                allocated = 1.0 - s["kv"]["mean_fraction"]["free"]
                row.update(requests=s["requests_total"], finished=s["requests_finished"],
                           mean_batch=s["mean_batch_size"], throughput_tok_s=s["throughput_tokens_per_s"],
                           norm_latency_s=s["normalized_latency_s_per_token"], preemptions=s["preemptions"],
                           peak_allocated=s["kv"]["peak_allocated_fraction"],
                           stranded=s["kv"]["mean_fraction"]["external_fragmentation"],
                           kv_per_request_mib=(allocated * row["kv_bytes_per_gpu"] / s["mean_batch_size"] / MIB
                                               if s["mean_batch_size"] else 0.0))
                rows.append(row)
                lines.advance()
    df = pd.DataFrame(rows)
    hybrid = df[df.system == "vLLM hybrid manager"].set_index(["model", "workload"]).kv_per_request_mib
    ref = [hybrid.get((m, w)) for m, w in zip(df.model, df.workload)]
    df["waste_vs_hybrid"] = [1 - r / v if r is not None and v else float("nan")
                             for r, v in zip(ref, df.kv_per_request_mib)]
    return df
