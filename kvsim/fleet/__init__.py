"""Past one engine: several engines in one SimPy environment. Replicas behind a router (`config`,
`router`, `replica`, `sim`, `summary`); prefill/decode disaggregation (`disagg`, its schedulers
`disagg_sched`, SLO metrics and goodput `disagg_slo`, planning helpers `disagg_plan`) and the KV link
between instances (`kv_link`). Imports `trace`, `specs`, `cost` and `engine` (each replica is the engine
of `kvsim.engine`, built by `kvsim.engine.build.build_run`); never `alloc` directly: the engine's
schedulers call the allocators. `planning`, `cli` and `kvsim` import it, nothing below them does.
"""
