"""A measured server (`server.json`: model, hf_config, GPU, TP/DP, flags) as a kvsim `SimConfig`.

Flags read (vLLM's names): max_model_len, max_num_batched_tokens, max_num_seqs, gpu_memory_utilization,
enable_prefix_caching, enable_chunked_prefill, block_size, kv_cache_dtype, and kv_offloading.cpu_gib (the
CPU KV tier, GiB; with vLLM's OffloadingConnector every computed block is stored there, `store-all`). A flag written as text ("0.9 (vLLM default; ...)", "vLLM 0.19 default (on)") is read
for its leading number or its "(on)"/"(off)"; "model default" leaves the model's own maximum length.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import replace
from pathlib import Path

#: Measured GPU names -> kvsim GPU preset names tried in order (the first that exists is used).
GPU_NAMES: dict[str, tuple[str, ...]] = {
    "h100-sxm-80gb": ("h100-80gb", "h100-sxm"),
    "h100-80gb": ("h100-80gb",),
    "a100-sxm-80gb": ("a100-80gb",),
    "a100-80gb": ("a100-80gb",),
    "a100-40gb": ("a100-40gb",),
    "h200": ("h200",),
    "rtx-4090-24gb": ("rtx-4090", "rtx4090"),
    "rtx-pro-6000-blackwell-96gb": ("rtx-pro-6000", "rtx-pro-6000-blackwell", "rtxpro6000"),
}


class NotReplayable(ValueError):
    """The run needs what kvsim cannot simulate (reported with the reason, not replayed)."""


class NoSuchGpu(NotReplayable):
    """The run's GPU has no kvsim preset."""


def gpu_preset(name: str, override: str | None = None):
    """The kvsim GpuSpec for a measured GPU name (`override`: a preset name given by the user)."""
    from kvsim.specs import get_gpu
    if override:
        return get_gpu(override)
    key = str(name).strip().lower()
    for candidate in GPU_NAMES.get(key, (key,)):
        try:
            return get_gpu(candidate)
        except ValueError:
            continue
    raise NoSuchGpu(f"no such GPU: {name} (kvsim has no preset for it; give one with --gpu)")


def _number(value, field: str, where: str, kind=float):
    if isinstance(value, bool):
        raise ValueError(f"{where}: flag {field!r} must be a number, got {value!r}")
    if isinstance(value, (int, float)):
        return kind(value)
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", str(value))
    if not m:
        raise ValueError(f"{where}: flag {field!r} must be a number, got {value!r}")
    return kind(float(m.group(1)))


def _switch(value, field: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    on, off = "(on)" in text or text in ("on", "true"), "(off)" in text or text in ("off", "false")
    if on == off:
        raise ValueError(f"{where}: flag {field!r} must be true or false, got {value!r}")
    return on


def server_flags(server: dict, where: str) -> dict:
    """kvsim run flags from the server's vLLM flags (see the module docstring)."""
    flags = server.get("flags")
    if not isinstance(flags, dict):
        raise ValueError(f"{where}: field 'flags' is missing (the server's vLLM flags)")
    out: dict = {"block_size": _number(flags.get("block_size", 16), "block_size", where, int)}
    for name, kind in (("max_num_seqs", int), ("max_num_batched_tokens", int)):
        if name not in flags:
            raise ValueError(f"{where}: flag {name!r} is missing (vLLM's default depends on the GPU and version; "
                             "give it)")
        out[name] = _number(flags[name], name, where, kind)
    out["gpu_mem_util"] = _number(flags.get("gpu_memory_utilization", 0.9), "gpu_memory_utilization", where)
    length = flags.get("max_model_len")
    if length is not None and "default" not in str(length):
        out["max_model_len"] = _number(length, "max_model_len", where, int)
    out["prefix_caching"] = _switch(flags.get("enable_prefix_caching", True), "enable_prefix_caching", where)
    out["chunked_prefill"] = _switch(flags.get("enable_chunked_prefill", True), "enable_chunked_prefill", where)
    kv_dtype = flags.get("kv_cache_dtype", "auto")
    out["kv_cache_dtype"] = str(kv_dtype) if kv_dtype else "auto"
    offload = flags.get("kv_offloading")
    if isinstance(offload, dict) and offload.get("cpu_gib"):
        out["cpu_kv_gib"] = _number(offload["cpu_gib"], "kv_offloading.cpu_gib", where)
        if offload.get("connector") == "OffloadingConnector":    # stores every computed block (vLLM's)
            out["cpu_kv_policy"] = "store-all"
    return out


def parallelism(server: dict, where: str) -> int:
    """The tensor-parallel degree; ValueError for contradictory counts (num_gpus != TP x DP). Data
    parallelism: `sim_config` reads it (`Deployment.dp`, engines behind the least-requests router)."""
    tp = _number(server.get("tensor_parallel_size", 1), "tensor_parallel_size", where, int)
    dp = _number(server.get("data_parallel_size", 1) or 1, "data_parallel_size", where, int)
    gpus = server.get("num_gpus")
    if gpus is not None and int(gpus) != tp * dp:
        raise ValueError(f"{where}: field 'num_gpus' ({gpus}) contradicts tensor_parallel_size x "
                         f"data_parallel_size ({tp} x {dp})")
    return tp


def sim_config(server: dict, where: str, profile=None, gpu: str | None = None):
    """The `SimConfig` of the measured server (`profile`: an engine profile name, file or object)."""
    import kvsim
    hf = server.get("hf_config")
    if not isinstance(hf, dict):
        raise ValueError(f"{where}: field 'hf_config' is missing (the model's config.json)")
    spec_gpu = gpu_preset(str(server.get("gpu", "")), gpu)
    tp = parallelism(server, where)
    flags = server_flags(server, where)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(hf))
        try:
            dp = int(server.get("data_parallel_size", 1) or 1)
            ep = _switch(server.get("enable_expert_parallel", False) or False, "enable_expert_parallel", where)
            cfg = kvsim.make_config(model_config=tmp, tp=tp, dp=dp, enable_expert_parallel=ep, **flags)
        except ValueError as exc:
            raise ValueError(f"{where}: {str(exc).replace(tmp + '/', '')}") from None
    model = replace(cfg.deployment.model, name=str(server.get("model", cfg.deployment.model.name)))
    cfg = replace(cfg, deployment=replace(cfg.deployment, model=model, gpu=spec_gpu))
    if profile is not None:
        cfg = replace(cfg, engine_profile=profile)
    return cfg
