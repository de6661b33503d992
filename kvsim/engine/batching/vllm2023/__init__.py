"""vLLM 0.1.4's scheduling policy, the `vllm-2023` engine profile's on paged memory (`scheduler.SchedulerV0`).
It imports the engine's scheduler and `kvsim.alloc.paged.block_manager_v0` (it is a scheduler: it calls the
allocator), nothing from planning or the CLI."""
