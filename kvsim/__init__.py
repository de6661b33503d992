"""kvsim: simulate paged and contiguous KV-cache allocation for LLM serving.

The public Python API (what the notebooks use). Names load lazily, so `import kvsim` is cheap:

>>> import kvsim
>>> trace = kvsim.generate_trace("sharegpt", rate_rps=1.0, num_requests=30, seed=0)
>>> result = kvsim.simulate(trace, model="opt-13b", gpu="a100-40gb", kv_gib=12, block_size=16)
>>> result.summary["requests_finished"], result.summary["kv"]["capacity_tokens"]
(30, 15728)
>>> int(kvsim.static_capacity(model="opt-13b", kv_gib=12, lengths=None).num_blocks[0])
983

Traces: `load_trace`, `generate_trace`, `rescale_trace`, `Trace`. Runs: `simulate`, `make_config`,
`RUN_FLAGS`, `summary_row`, `SimConfig`, `CacheConfig`, `SchedulerConfig`, `Deployment`, `ModelSpec`,
`GpuSpec`, `get_model`, `get_gpu`, `SimResult`. Planning: `run_sweep`, `static_capacity`, `parse_slo`,
`max_rate`, `RateResult`, `gpus_for_rate`, `tune_block_size`, `TuneResult`, `Bookkeeping`,
`measure_bookkeeping`. Reports: `Report`, `write_report`, `trace_report`, `sweep_report`, `SYSTEMS`
(the compared systems as run flags) and the figures `plot_memory_breakdown`, `plot_timeline`,
`plot_latency_vs_rate`, `plot_block_size`, `plot_preemptions`, `plot_bars` (matplotlib Figures).
Hybrid models: `kv_cache_plan` (vLLM 0.33's KV cache groups and start-up figures for a SimConfig),
`HybridStudyPlan`, `run_hybrid_study` (layouts compared per model and workload), `hybrid_report`.
Fleets: `simulate_fleet` (replicas behind a router), `FleetConfig`, `gpus_for_fleet` (replicas x TP for a
rate, fleets simulated).
Disaggregation: `simulate_disagg`, `disagg_summary`, `disagg_goodput` (colocated too), `KV_LINKS`.
Each has a docstring with an example.
"""

from __future__ import annotations

import importlib

#: public name -> (module, attribute)
_EXPORTS = {
    "Trace": ("kvsim.trace.table", "Trace"),
    "load_trace": ("kvsim.trace.formats", "load_trace"),
    "rescale_trace": ("kvsim.trace.table", "rescale_trace"),
    "generate_trace": ("kvsim.trace.synthetic", "generate"),
    "SimConfig": ("kvsim.engine.config", "SimConfig"),
    "CacheConfig": ("kvsim.engine.config", "CacheConfig"),
    "SchedulerConfig": ("kvsim.engine.config", "SchedulerConfig"),
    "Deployment": ("kvsim.specs", "Deployment"),
    "ModelSpec": ("kvsim.specs", "ModelSpec"),
    "GpuSpec": ("kvsim.specs", "GpuSpec"),
    "get_model": ("kvsim.specs", "get_model"),
    "get_gpu": ("kvsim.specs", "get_gpu"),
    "SimResult": ("kvsim.engine.sim", "SimResult"),
    "simulate": ("kvsim.planning.runs", "simulate"),
    "make_config": ("kvsim.planning.runs", "make_config"),
    "summary_row": ("kvsim.planning.runs", "summary_row"),
    "run_sweep": ("kvsim.planning.sweep.runner", "run_sweep"),
    "static_capacity": ("kvsim.planning.capacity", "static_capacity"),
    "parse_slo": ("kvsim.planning.rate.search", "parse_slo"),
    "max_rate": ("kvsim.planning.rate.search", "max_rate"),
    "RateResult": ("kvsim.planning.rate.search", "RateResult"),
    "gpus_for_rate": ("kvsim.planning.rate.gpus", "gpus_for_rate"),
    "gpus_for_fleet": ("kvsim.planning.rate.fleet_gpus", "gpus_for_fleet"),
    "simulate_fleet": ("kvsim.fleet.sim", "simulate_fleet"),
    "FleetConfig": ("kvsim.fleet.config", "FleetConfig"),
    "tune_block_size": ("kvsim.planning.tune", "tune_block_size"),
    "TuneResult": ("kvsim.planning.tune", "TuneResult"),
    "Bookkeeping": ("kvsim.planning.bookkeeping", "Bookkeeping"),
    "measure_bookkeeping": ("kvsim.planning.bookkeeping", "measure"),
    "Report": ("kvsim.planning.reports.document", "Report"),
    "write_report": ("kvsim.planning.reports.document", "write_report"),
    "trace_report": ("kvsim.planning.reports.build", "trace_report"),
    "sweep_report": ("kvsim.planning.reports.build", "sweep_report"),
    "SYSTEMS": ("kvsim.planning.reports.build", "SYSTEMS"),
    "plot_memory_breakdown": ("kvsim.planning.reports.figures", "memory_breakdown"),
    "plot_timeline": ("kvsim.planning.reports.figures", "timeline"),
    "plot_latency_vs_rate": ("kvsim.planning.reports.figures", "latency_vs_rate"),
    "plot_block_size": ("kvsim.planning.reports.figures", "block_size_curve"),
    "plot_preemptions": ("kvsim.planning.reports.figures", "preemptions"),
    "plot_bars": ("kvsim.planning.reports.figures", "bars"),
    "HybridStudyPlan": ("kvsim.planning.studies.hybrid", "StudyPlan"),
    "run_hybrid_study": ("kvsim.planning.studies.hybrid", "run_study"),
    "hybrid_report": ("kvsim.planning.studies.hybrid_report", "hybrid_report"),
    "kv_cache_plan": ("kvsim.engine.config", "kv_cache_plan"),
    "simulate_disagg": ("kvsim.fleet.disagg.plan", "simulate_disagg"),
    "disagg_goodput": ("kvsim.fleet.disagg.plan", "disagg_goodput"),
    "disagg_summary": ("kvsim.fleet.disagg.slo", "disagg_summary"),
    "KV_LINKS": ("kvsim.fleet.disagg.kv_link", "LINKS"),
}

__all__ = sorted([*_EXPORTS, "RUN_FLAGS"])


def __getattr__(name: str):
    if name == "RUN_FLAGS":
        from kvsim.planning.runs import run_flags
        return run_flags()
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvsim' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
