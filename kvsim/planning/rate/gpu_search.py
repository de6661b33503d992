"""The steps GPU searches share (`kvsim.planning.rate.gpus.gpus_for_rate`, one replica's rate divided into
the target; `kvsim.planning.rate.fleet_gpus`, fleets simulated): the base configuration, and each TP
degree's configuration or the reason it is skipped."""

from __future__ import annotations

from typing import Any, Mapping

from kvsim.engine.config import SimConfig
from kvsim.planning.runs import capacity_tokens, make_config


def gpu_search_config(rate_rps: float, config: SimConfig | None, flags: Mapping[str, Any]) -> SimConfig:
    """The base config of a GPU search for `rate_rps` req/s (> 0), whose KV cache each TP degree sizes
    from its GPUs' memory (`--gpu-mem-util`): a fixed `kv_gib`/`num_blocks` is refused."""
    if not rate_rps > 0:
        raise ValueError(f"--gpus-for: the rate must be > 0 requests/s, got {rate_rps}")
    cfg = make_config(config, **flags)
    if cfg.cache.kv_gib is not None or cfg.cache.num_blocks is not None:
        raise ValueError("--gpus-for sizes each TP degree's KV cache from its GPU memory (--gpu-mem-util); "
                         "drop --kv-gib/--num-blocks")
    return cfg


def tp_config(cfg: SimConfig, tp: int, best: int | None, row: dict[str, Any]) -> SimConfig | None:
    """One TP degree of a GPU search: `cfg` at TP `tp`, with `row["fits"]` set, or None with the reason
    in `row["note"]`: not tried once `best` GPUs already suffice with fewer (tp > best: one replica of
    TP `best` is still compared, issue 41: TP 4 x 1 against TP 2 x 2), or the weights do not fit."""
    if best is not None and tp > best:
        row.update(fits=None, note=f"not tried: {best} GPUs already suffice, fewer than one replica of TP {tp}")
        return None
    try:
        c = make_config(cfg, tp=tp)
        capacity_tokens(c)
    except ValueError as exc:
        row["note"] = str(exc)
        return None
    row["fits"] = True
    return c
