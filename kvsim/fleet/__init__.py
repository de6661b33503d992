"""Fleets of engines in one SimPy environment: replicas behind a router (`config`, `router`,
`replica`, `sim`, `summary`), prefill/decode disaggregation and the KV link between instances
(`disagg*`, `kv_link`). Imports `trace`, `specs`, `cost` and `engine` (each replica is the engine of
`kvsim.engine`, built by `kvsim.engine.build.build_run`); never `kvsim.alloc`: a replica's allocator
and prefix cache are reached only through its scheduler. Only `planning`, `cli` and `kvsim` import it.
"""
