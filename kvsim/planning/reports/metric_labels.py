"""What a metric is called on a figure or in a table: a label and a unit for every column a run's row
carries (`kvsim.planning.runs.summary_row` names, the tuner's curve, the sweep's flags), and whether it
is a fraction shown as a percentage. `kvsim.planning.reports.figures` titles its axes from here and
`kvsim.planning.reports.document` formats its tables from here, so a metric reads the same everywhere.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Metric:
    """label: words a reader knows ("TTFT p99"); unit: "s", "req/s", "%" ... ("" for a plain count or a
    name); percent: the values are fractions (0.25) drawn and printed as percentages (25%)."""

    label: str
    unit: str = ""
    percent: bool = False

    def axis(self) -> str:
        """The axis label: 'TTFT p99 (s)', 'preemptions'."""
        return f"{self.label} ({self.unit})" if self.unit else self.label


#: Columns with a fixed label. Units: seconds, requests per second, tokens; fractions are percent.
METRICS: dict[str, Metric] = {
    "rate": Metric("request rate", "req/s"), "rate_rps": Metric("request rate", "req/s"),
    "block_size": Metric("block size", "tokens"),
    "throughput_rps": Metric("throughput", "req/s"),
    "throughput_tokens_per_s": Metric("throughput", "tokens/s"),
    "capacity_tokens_per_s": Metric("capacity", "tokens/s"),
    "mean_batch_size": Metric("mean batch", "requests"), "max_batch_size": Metric("largest batch", "requests"),
    "normalized_latency_s_per_token": Metric("normalized latency", "s/token"),
    "latency_s_per_token": Metric("normalized latency", "s/token"),
    "preemptions": Metric("preemptions"), "requests_finished": Metric("requests finished"),
    "requests_rejected": Metric("requests rejected"),
    "waste_fraction": Metric("waste", "% of allocated KV", True),
    "gather_fraction": Metric("gather", "% of step", True),
    "bookkeeping_fraction": Metric("bookkeeping", "% of step", True),
    "indirection_fraction": Metric("indirection", "% of step", True),
    "prefix_cache_hit_rate": Metric("prefix-cache hits", "% of prompt tokens", True),
    "compute_bound_fraction": Metric("compute-bound steps", "%", True),
    "kv_gib": Metric("KV memory", "GiB"), "max_num_seqs": Metric("max sequences"),
    "tp": Metric("tensor-parallel GPUs"), "allocator": Metric("allocator"), "reserve": Metric("reservation"),
    "preemption": Metric("preemption"), "system": Metric("system"), "model": Metric("model"),
    "gpu": Metric("GPU"), "preset": Metric("workload"), "engine_profile": Metric("engine profile"),
    # fleets (kvsim/fleet/): the summary's `fleet.imbalance`, DistServe's SLO attainment
    "replicas": Metric("replicas"), "router": Metric("router"), "gpus": Metric("GPUs"),
    "requests_max_over_mean": Metric("requests, busiest replica / mean"),
    "kv_used_max_over_mean": Metric("KV used, busiest replica / mean"),
    "slo_attainment": Metric("SLO attainment", "% of requests", True),
}
_QUANTILE = re.compile(r"^(ttft|tpot|e2e)_s_(p\d+|mean)$")
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end-to-end latency"}


def metric(name: str) -> Metric:
    """The label of column `name`; an unknown name reads as itself with '_' as spaces.

    >>> metric("ttft_s_p99").axis(), metric("kv_mean_fraction_free").axis(), metric("rate").axis()
    ('TTFT p99 (s)', 'KV free (% of capacity)', 'request rate (req/s)')
    """
    if name in METRICS:
        return METRICS[name]
    m = _QUANTILE.match(name)
    if m:
        return Metric(f"{_NAMES[m.group(1)]} {m.group(2)}", "s")
    if name.startswith("kv_mean_fraction_"):
        return Metric("KV " + name.removeprefix("kv_mean_fraction_").replace("_", " "), "% of capacity", True)
    if name.endswith("_fraction"):
        return Metric(name.removesuffix("_fraction").replace("_", " "), "%", True)
    return Metric(name.replace("_", " "))


def value_label(name: str, value) -> str:
    """A legend entry naming what varies: 'block size 16', 'KV memory 12 GiB'; text values as they are
    ('paged').

    >>> value_label("block_size", 16), value_label("kv_gib", 12.0), value_label("system", "paged")
    ('block size 16', 'KV memory 12 GiB', 'paged')
    """
    if isinstance(value, (str, bool)) or not isinstance(value, numbers.Real):
        return str(value)
    m = metric(name)
    unit = "" if m.unit in ("", "tokens", "requests") else f" {m.unit}"
    return f"{m.label} {value:g}{unit}"
