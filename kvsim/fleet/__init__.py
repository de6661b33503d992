"""Past one engine: several engines in one SimPy environment. Prefill/decode disaggregation
(`disagg`, its schedulers `disagg_sched`, SLO metrics and goodput `disagg_slo`, planning helpers
`disagg_plan`) and the KV link between instances (`kv_link`). Imports `trace`, `specs`, `cost` and
`engine` (never `alloc` directly: the engine's schedulers call the allocators); `planning` and `cli`
import it, nothing below them does.
"""
