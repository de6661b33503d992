"""Prefill/decode disaggregation (DistServe, Splitwise): the SimPy deployment, its two
schedulers, the KV link, SLO attainment and goodput, and planning rows.

May import the engine and `kvsim.fleet`'s replicas and summary; never the allocators, planning or the CLI.
"""
