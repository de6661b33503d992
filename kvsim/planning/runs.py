"""Flat run flags -> `SimConfig`, one run -> one flat row: the vocabulary sweeps and capacity searches share.

A run flag is a `kvsim run` option with `_` for `-` (`block_size`, `max_num_seqs`, `kv_gib`, ...). The
names are read from the config dataclasses, so a field added to `CacheConfig`, `SchedulerConfig` or
`SimConfig` is a flag here with no further change.

>>> cfg = make_config(model="opt-13b", kv_gib=12, block_size="32")
>>> cfg.cache.block_size, cfg.deployment.kv_capacity_tokens(cfg.cache.kv_gib)
(32, 15728)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.planning.flag_table import check_value
from kvsim.planning.vllm_flags import ALIASES as VLLM_ALIASES, translate
from kvsim.specs.hf.config import load_hf_config
from kvsim.specs.serving_dtype import with_dtype, with_quantization
from kvsim.trace.table import Trace

#: Flags that pick the deployment and the calibration rather than a config field.
DEPLOYMENT_FLAGS = {"model": "opt-13b", "model_config": None, "gpu": "a100-40gb", "tp": 1, "dp": 1,
                    "enable_expert_parallel": False,
                    "kv_cache_dtype": "auto", "max_model_len": None, "dtype": None, "quantization": None,
                    "calibration": None, "force_calibration": False}


def _section_fields() -> dict[str, tuple[str, str]]:
    """flag -> (section, annotation): section is 'cache', 'scheduler' or '' (a SimConfig scalar)."""
    out: dict[str, tuple[str, str]] = {}
    for section, cls in (("cache", CacheConfig), ("scheduler", SchedulerConfig)):
        for f in dataclasses.fields(cls):
            out[f.name] = (section, str(f.type))
    for f in dataclasses.fields(SimConfig):
        if f.name not in ("deployment", "cache", "scheduler", "calibration"):
            out.setdefault(f.name, ("", str(f.type)))
    return out


def run_flags() -> tuple[str, ...]:
    """Every flat run-flag name `make_config` accepts."""
    return tuple(DEPLOYMENT_FLAGS) + tuple(_section_fields())


#: The types of the deployment flags (the others' come from their dataclass fields).
DEPLOYMENT_FLAG_TYPES = {"model": "str", "model_config": "str | None", "gpu": "str", "tp": "int",
                         "kv_cache_dtype": "str", "max_model_len": "int | None", "dtype": "str | None",
                         "quantization": "str | None",
                         "calibration": "str | None", "force_calibration": "bool"}


def flag_types() -> dict[str, str]:
    """Every run flag -> its type as written in the code ('int', 'float | None', 'str', ...)."""
    return {**DEPLOYMENT_FLAG_TYPES, **{k: a for k, (_, a) in _section_fields().items()}}


def _parse(flag: str, value: Any, annotation: str) -> Any:
    """`value` as the field's type; strings (from the command line) are converted."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "None" in annotation and text.lower() in ("", "none", "null"):
        return None
    try:
        if "bool" in annotation:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if "int" in annotation:
            return int(text)
        if "float" in annotation:
            return float(text)
    except ValueError:
        kind = "bool" if "bool" in annotation else "int" if "int" in annotation else "float"
        raise ValueError(f"run flag {flag}: {value!r} is not a {kind}") from None
    return text


#: vLLM's names for the same flags (`kvsim.planning.vllm_flags`, as every command accepts them).
ALIASES = VLLM_ALIASES


def normalize_flag(name: str) -> str:
    """`max-num-seqs` -> `max_num_seqs`; vLLM aliases to kvsim's names (`tensor-parallel-size` -> `tp`)."""
    key = name.strip().lstrip("-").replace("-", "_")
    return ALIASES.get(key, key)


def make_config(config: SimConfig | None = None, **flags: Any) -> SimConfig:
    """A `SimConfig` from flat run flags (defaults: `kvsim run`'s); with `config`, flags override it.

    >>> make_config(allocator="contiguous", reserve="pow2").cache.reserve
    'pow2'
    """
    fields = _section_fields()
    flags, _ = translate(flags)                        # vLLM's names; its ignored flags dropped
    flags = {normalize_flag(k): v for k, v in flags.items()}
    unknown = sorted(set(flags) - set(fields) - set(DEPLOYMENT_FLAGS))
    if unknown:
        raise ValueError(f"unknown run flag {unknown[0]!r}; known: {', '.join(run_flags())}")
    dep_flags = {k: flags.pop(k) for k in list(flags) if k in DEPLOYMENT_FLAGS}
    if config is None or dep_flags:
        d = {k: (dep_flags[k] if k in dep_flags else _current(config, k)) for k in DEPLOYMENT_FLAGS}
        if config is not None and not {"model", "model_config"} & set(dep_flags):
            spec = config.deployment.model            # keeps its dtype, max length, config file
        else:
            spec = load_hf_config(d["model_config"]) if d["model_config"] else get_model(d["model"])
        max_len = _parse("max_model_len", d["max_model_len"], "int | None")
        spec = with_quantization(with_dtype(spec, d["dtype"]), d["quantization"])
        spec = spec.with_kv_cache_dtype(str(d["kv_cache_dtype"])).with_max_model_len(max_len)
        gpu = (config.deployment.gpu if config is not None and "gpu" not in dep_flags else get_gpu(d["gpu"]))
        deployment = Deployment(spec, gpu, _parse("tp", d["tp"], "int"), _parse("dp", d["dp"], "int"),
                                _parse("enable_expert_parallel", d["enable_expert_parallel"], "bool"))
        calibration = _calibration(d, config)
        config = (SimConfig(deployment) if config is None
                  else dataclasses.replace(config, deployment=deployment))
        config = dataclasses.replace(config, calibration=calibration)
    parts: dict[str, dict[str, Any]] = {"cache": {}, "scheduler": {}, "": {}}
    for name, value in flags.items():
        section, annotation = fields[name]
        parts[section][name] = _parse(name, value, annotation)
        check_value(name, parts[section][name])          # the names and ranges `kvsim run` takes
    return dataclasses.replace(config, cache=dataclasses.replace(config.cache, **parts["cache"]),
                               scheduler=dataclasses.replace(config.scheduler, **parts["scheduler"]),
                               **parts[""])


def _current(config: SimConfig | None, flag: str) -> Any:
    """A deployment flag's value in `config` (its default without one)."""
    if config is None:
        return DEPLOYMENT_FLAGS[flag]
    dep = config.deployment
    return {"model": dep.model.name, "model_config": None, "gpu": dep.gpu.name, "tp": dep.tp, "dp": dep.dp,
            "enable_expert_parallel": dep.ep,
            "kv_cache_dtype": "auto", "max_model_len": None, "dtype": None, "quantization": None,
            "calibration": None, "force_calibration": False}[flag]


def _calibration(d: dict, config: SimConfig | None):
    if d["calibration"]:
        from kvsim.cost.calibration import load_calibration
        force = _parse("force_calibration", d["force_calibration"], "bool")
        return load_calibration(d["calibration"], force=force)
    return None if config is None else config.calibration


def capacity_tokens(config: SimConfig) -> int:
    """KV slots of the whole deployment under `config` (as `build_run` sizes the cache)."""
    cache = config.cache
    return config.deployment.kv_capacity_tokens(cache.kv_gib, cache.num_blocks, cache.block_size,
                                                cache.gpu_mem_util, config.batch_limits()[1])


def config_row(config: SimConfig) -> dict[str, Any]:
    """The resolved configuration as flat columns: model, gpu, tp, every cache/scheduler field, seed."""
    dep = config.deployment
    row: dict[str, Any] = {"model": dep.model.name, "gpu": dep.gpu.name, "tp": dep.tp,
                           "max_model_len": dep.model.max_seq_len,
                           "kv_bytes_per_token": dep.kv_bytes_per_token()}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "deployment":
            continue
        if f.name == "calibration":
            row["calibration"] = None if value is None else str(value.source)
        elif dataclasses.is_dataclass(value):
            prefix = "" if f.name in ("cache", "scheduler") else f"{f.name}_"
            for g in dataclasses.fields(value):
                v = getattr(value, g.name)
                row[prefix + g.name] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
            if f.name == "scheduler":           # the batch limits the run takes (the profile's defaults)
                row["max_num_seqs"], row["max_batched_tokens"] = config.batch_limits()
        else:
            row[f.name] = value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
    return row


def summary_row(summary: dict, prefix: str = "") -> dict[str, Any]:
    """A run summary flattened with `_` joins: `ttft_s_p99`, `kv_mean_fraction_free`, `limited_by_kv_memory`.

    >>> summary_row({"ttft_s": {"p99": 1.5}, "preemptions": 0})
    {'ttft_s_p99': 1.5, 'preemptions': 0}
    """
    row: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            row.update(summary_row(value, f"{prefix}{key}_"))
        else:
            row[prefix + key] = value
    return row


def simulate(trace: Trace | str | Path, config: SimConfig | None = None, *,
             progress: Callable[[float], None] | None = None, **flags: Any):
    """Run `trace` (a Trace or a trace file) under `config` and/or flat run `flags`; a `SimResult` with
    `.summary` (dict, DESIGN.md keys), `.requests` and `.steps` (DataFrames). Deterministic.

    >>> import kvsim
    >>> tr = kvsim.generate_trace("alpaca", rate_rps=2, num_requests=20, seed=0)
    >>> r = kvsim.simulate(tr, model="opt-13b", kv_gib=12, allocator="paged")
    >>> r.summary["requests_finished"]
    20
    """
    from kvsim.engine.sim import simulate as run
    from kvsim.trace.formats import load_trace

    if not isinstance(trace, Trace):
        trace = load_trace(trace)
    if flags:                       # the flags given, against where they apply (as `kvsim run` checks them)
        from kvsim.planning.flag_table import check_flags, setup_of
        given = {normalize_flag(k): v for k, v in translate(flags)[0].items()}
        allocator = given.get("allocator") or (config.cache.allocator if config is not None else "paged")
        check_flags(given, setup_of({**given, "allocator": allocator}))
    if config is None or flags:
        config = make_config(config, **flags)
    return run(trace, config, progress)


#: The systems compared, as run flags: PagedAttention, the Orca-style contiguous reservations and
#: FasterTransformer-style static batching (vLLM paper, section 6).
SYSTEMS: dict[str, dict] = {
    "paged": {"allocator": "paged"},
    "contiguous-oracle": {"allocator": "contiguous", "reserve": "oracle"},
    "contiguous-pow2": {"allocator": "contiguous", "reserve": "pow2"},
    "contiguous-max": {"allocator": "contiguous", "reserve": "max"},
    "static": {"allocator": "contiguous", "reserve": "max", "batching": "static"},
}
