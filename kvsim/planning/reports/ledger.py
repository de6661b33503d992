"""The memory ledger: one GPU's memory as vLLM's start-up logs it, from kvsim's sizing
(`kvsim.specs.deployment.Deployment.memory_ledger`), with the KV cache it leaves in tokens, blocks and
maximum concurrency. `kvsim run`, `compare` and `capacity` print it and write it in `--json`.

The lines and units (GiB = 2^30 bytes, per GPU) are vLLM's: "Model loading took X GiB memory"
(vllm/v1/worker/gpu_model_runner.py), the memory-profiling line of vLLM 0.6-0.9 (vllm/worker/worker.py
`determine_num_available_blocks`: "total_gpu_memory (..GiB) x gpu_memory_utilization (..) = ..GiB;
model weights take ..GiB; non_torch_memory takes ..GiB; PyTorch activation peak memory takes ..GiB; the
rest of the memory reserved for KV Cache is ..GiB"), "Available KV cache memory: X GiB"
(vllm/v1/worker/gpu_worker.py), "GPU KV cache size: N tokens" and "Maximum concurrency for L tokens per
request: Cx" (vllm/v1/core/kv_cache_utils.py).
"""

from __future__ import annotations

from typing import Any

from kvsim.engine.config import SimConfig, kv_cache_plan, kv_capacity
from kvsim.specs import GIB


def memory_ledger(cfg: SimConfig) -> dict[str, Any]:
    """The ledger of `cfg`'s deployment as a JSON-ready dict: memory per GPU in GiB, the KV cache's
    source (`gpu_memory_utilization`, `kv_gib`, `num_gpu_blocks_override`), its size in tokens and
    blocks (whole deployment, as vLLM counts them) and the maximum concurrency at the maximum model
    length; `kv_cache_tokens` None when the cache holds nothing (with the error in `kv_error`)."""
    dep, cache = cfg.deployment, cfg.cache
    led = dep.memory_ledger(cache.gpu_mem_util, cfg.batch_limits()[1])
    source = ("kv_gib" if cache.kv_gib is not None else "num_gpu_blocks_override" if cache.num_blocks is not None
              else "gpu_memory_utilization")
    out: dict[str, Any] = {
        "gpu": dep.gpu.name, "tp": dep.tp, "total_gpu_memory_gib": led.total / GIB,
        "gpu_memory_utilization": led.gpu_mem_util, "budget_gib": led.budget / GIB,
        "model_weights_gib": led.weights / GIB, "activation_peak_gib": led.activation_peak / GIB,
        "non_torch_memory_gib": led.non_torch / GIB, "rest_for_kv_cache_gib": led.kv / GIB,
        "kv_cache_source": source, "kv_cache_gib": None, "kv_cache_tokens": None, "num_blocks": None,
        "block_size": cache.block_size, "max_model_len": dep.model.max_seq_len, "max_concurrency": None,
        **_batch_limits(cfg)}
    try:
        plan = kv_cache_plan(cfg)
        if plan is not None:
            tokens, blocks, block, conc = (plan.capacity_tokens, plan.num_blocks, plan.block_size,
                                           plan.max_concurrency)
            kv_bytes = plan.num_blocks * plan.bytes_per_block
        else:
            tokens, block = kv_capacity(cfg), cache.block_size
            blocks = tokens // block
            conc = tokens / (-(-dep.model.max_seq_len // block) * block)
            kv_bytes = tokens * dep.kv_bytes_per_token() / dep.tp
    except ValueError as exc:
        out["kv_error"] = str(exc)
        return out
    out.update(kv_cache_gib=kv_bytes / GIB, kv_cache_tokens=tokens, num_blocks=blocks, block_size=block,
               max_concurrency=conc)
    return out


def _batch_limits(cfg: SimConfig) -> dict[str, Any]:
    """The scheduler's batch limits and where they come from (the flags, or the profile's defaults)."""
    seqs, tokens = cfg.batch_limits()
    profile, sched = cfg.profile(), cfg.scheduler
    given = [name for name, v in (("--max-num-seqs", sched.max_num_seqs),
                                  ("--max-num-batched-tokens", sched.max_batched_tokens)) if v is not None]
    source = (f"{profile.name}'s defaults on {cfg.deployment.gpu.name}" if not given else
              f"set by {' and '.join(given)}" + ("" if len(given) == 2 else f"; the rest {profile.name}'s defaults"))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "batch_limits_source": source}


_FLAG = {"kv_gib": "--kv-gib", "num_gpu_blocks_override": "--num-blocks (--num-gpu-blocks-override)"}


def ledger_lines(ledger: dict[str, Any]) -> list[str]:
    """The ledger as vLLM's start-up log lines (without the KV size and concurrency lines when the
    cache holds nothing)."""
    g = ledger
    lines = [f"Scheduler: max_num_seqs={g['max_num_seqs']}, max_num_batched_tokens={g['max_num_batched_tokens']} "
             f"({g['batch_limits_source']})",
             f"Model loading took {g['model_weights_gib']:.2f} GiB memory (weights per GPU, TP {g['tp']})",
             f"Memory profiling: total_gpu_memory ({g['total_gpu_memory_gib']:.2f}GiB) x gpu_memory_utilization "
             f"({g['gpu_memory_utilization']:.2f}) = {g['budget_gib']:.2f}GiB; model weights take "
             f"{g['model_weights_gib']:.2f}GiB; non_torch_memory takes {g['non_torch_memory_gib']:.2f}GiB; "
             f"PyTorch activation peak memory takes {g['activation_peak_gib']:.2f}GiB; the rest of the memory "
             f"reserved for KV Cache is {g['rest_for_kv_cache_gib']:.2f}GiB."
             + ("" if g["kv_cache_source"] == "gpu_memory_utilization" else
                f" (Not what this run uses: {_FLAG[g['kv_cache_source']]} sets the KV cache, below.)")]
    if g["kv_cache_tokens"] is None:
        return lines + [f"KV cache: {g.get('kv_error', 'none')}"]
    given = {"kv_gib": " (set by --kv-gib)",
             "num_gpu_blocks_override": " (set by --num-blocks usable, or --num-gpu-blocks-override N: N - 1 usable)"}
    lines.append(f"Available KV cache memory: {g['kv_cache_gib']:.2f} GiB{given.get(g['kv_cache_source'], '')}")
    lines.append(f"GPU KV cache size: {g['kv_cache_tokens']:,} tokens ({g['num_blocks']:,} blocks of "
                 f"{g['block_size']})")
    lines.append(f"Maximum concurrency for {g['max_model_len']:,} tokens per request: {g['max_concurrency']:.2f}x")
    return lines


def json_summary(summary: dict, cfg: SimConfig, ignored: list[str]) -> dict:
    """A run summary as `--json` writes it: with the memory ledger and the vLLM flags ignored."""
    return {**summary, "memory": memory_ledger(cfg), "vllm_flags_ignored": list(ignored)}
