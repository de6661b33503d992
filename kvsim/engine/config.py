"""Run configuration: frozen dataclasses `SchedulerConfig`, `CacheConfig`, `SimConfig`, and the KV
capacity in token slots they give (`kv_capacity`). The CLI, the harness and the Python API build configs
from here; `kvsim.engine.build` turns one into the parts of a run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from kvsim.alloc import ALLOCATORS
from kvsim.engine.batching.defaults import FIXED, batch_limits
from kvsim.engine.batching.beams import BEAM_DEATH_RATE
from kvsim.engine.batching.samples import SAMPLE_LENGTHS
from kvsim.cost.calibration import Calibration
from kvsim.cost.profiles import DEFAULT_PROFILE, EngineProfile, get_profile
from kvsim.specs import GIB, Deployment
from kvsim.specs.kv_groups import KVCachePlan, plan_kv_cache


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Batching limits and policies (`batching`: continuous|static; `preemption`: recompute|swap).
    `static` runs `kvsim.engine.batching.static.StaticScheduler` instead (chosen by `build_run`).
    `swap_multi_seq`: requests with more than one sequence (n > 1, beams) are preempted by swap even
    under recompute (vLLM 2023: diverged samples cannot be recomputed as one prompt); recomputing them
    re-prefills the prompt once and each sample's own outputs (docs/sharing.md).
    `chunked_prefill` None: the engine profile's default. `separate_prefill`: a step runs prompts or
    decodes, never both (both also set by the engine profile, see `SimConfig.resolved`).
    `beam_death_rate`: probability that a beam of a beam-search request dies at a decode step and is
    replaced by a fork of a surviving beam (docs/sharing.md); 0 makes beams plain parallel samples.
    `sample_lengths`: equal (every sample runs to the request's output length) or uniform (the other
    samples of a request stop earlier, `kvsim.engine.batching.samples`); a trace's `output_tokens_per_sample` wins.
    `max_num_seqs`, `max_batched_tokens` None: the engine profile's defaults for the GPU (vllm-v1: vLLM
    V1's per-GPU defaults; `kvsim.engine.batching.defaults`), filled by `SimConfig.resolved`."""

    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    preemption: str = "recompute"
    batching: str = "continuous"
    swap_multi_seq: bool = False
    separate_prefill: bool = False
    beam_death_rate: float = BEAM_DEATH_RATE
    sample_lengths: str = "equal"
    async_scheduling: bool | None = None     # vLLM's --async-scheduling: None its default (`concurrent_batches`)

    def __post_init__(self) -> None:
        if any(v is not None and v < 1 for v in (self.max_num_seqs, self.max_batched_tokens)):
            raise ValueError("max_num_seqs and max_batched_tokens must be >= 1")
        if not 0 <= self.beam_death_rate < 1:
            raise ValueError(f"--beam-death-rate must be in [0, 1), got {self.beam_death_rate}")
        if self.sample_lengths not in SAMPLE_LENGTHS:
            raise ValueError(f"unknown --sample-lengths {self.sample_lengths!r}; known: {', '.join(SAMPLE_LENGTHS)}")
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"unknown preemption mode {self.preemption!r}; known: recompute, swap")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"unknown batching mode {self.batching!r}; known: continuous, static")

    def with_fixed_limits(self) -> "SchedulerConfig":
        """This config with the "fixed" defaults (256 sequences, 8192 tokens) for limits left None: what
        a scheduler built without a `SimConfig` (no GPU to pick vLLM V1's defaults by) takes."""
        if self.max_num_seqs is not None and self.max_batched_tokens is not None:
            return self
        tokens, seqs = FIXED
        return replace(self, max_num_seqs=self.max_num_seqs or seqs,
                       max_batched_tokens=self.max_batched_tokens or tokens)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV cache: allocator kind and policy, block size (tokens), capacity source, CPU swap space."""

    allocator: str = "paged"
    block_size: int = 16
    reserve: str = "max"            # contiguous only: max | pow2 | oracle
    placement: str = "buddy"        # contiguous only: buddy | first-fit
    prefix_caching: bool | None = None   # None: the engine profile's default (on for vllm-v1, paged)
    kv_gib: float | None = None     # KV memory of the whole deployment, GiB
    num_blocks: int | None = None   # blocks of the whole deployment
    gpu_mem_util: float = 0.9
    swap_gib: float = 4.0           # CPU swap space per GPU, GiB (vLLM's default)
    hybrid_kv_cache: bool | None = None   # vLLM's hybrid KV cache manager: None its default, False
                                          # --disable-hybrid-kv-cache-manager (every layer full attention)
    cpu_kv_gib: float = 0.0         # CPU tier of the prefix cache, GiB for the whole deployment
                                    # (vLLM's --kv-offloading-size; kvsim/alloc/cpu_tier.py)
    prefix_cache_retention_interval: int | None = 0   # vLLM 0.33's flag and default: 0, a multiple of the
                                    # block size, or None (dense); sliding groups (kvsim/alloc/hybrid/retention.py)
    cpu_kv_policy: str = "evicted"  # what it stores: "evicted" blocks, or "store-all" computed blocks (vLLM's)

    def __post_init__(self) -> None:
        if self.allocator not in (*ALLOCATORS, "jenga"):
            raise ValueError(f"unknown allocator {self.allocator!r}; known: {', '.join(ALLOCATORS)}, jenga")
        if self.allocator == "jenga" and self.num_blocks is not None:
            raise ValueError("--allocator jenga sizes its pool in bytes: give --kv-gib or --gpu-mem-util, "
                             "not --num-blocks")
        if self.block_size < 1:
            raise ValueError(f"block size must be >= 1 token, got {self.block_size}")
        if not 0 <= self.swap_gib < float("inf"):
            raise ValueError(f"--swap-gib must be a finite number >= 0, got {self.swap_gib}")
        if self.cpu_kv_policy not in ("evicted", "store-all"):
            raise ValueError(f"--cpu-kv-policy must be evicted or store-all, got {self.cpu_kv_policy!r}")
        if not 0 <= self.cpu_kv_gib < float("inf"):
            raise ValueError(f"--cpu-kv-gib must be a finite number >= 0, got {self.cpu_kv_gib}")
        interval = self.prefix_cache_retention_interval
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 0):
            raise ValueError(f"--prefix-cache-retention-interval must be 0, a positive multiple of the block "
                             f"size, or none; got {interval!r}")
        if self.cpu_kv_gib and (self.prefix_caching is False or self.allocator != "paged"):
            raise ValueError("--cpu-kv-gib keeps blocks the prefix cache evicts: it needs --prefix-caching "
                             "and the paged allocator")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one run needs besides the trace."""

    deployment: Deployment
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    calibration: Calibration | None = None
    seed: int = 0
    engine_profile: str | EngineProfile = DEFAULT_PROFILE   # a name, a calibrate-engine JSON, or one
    enforce_eager: bool = False     # vLLM's --enforce-eager: no CUDA graphs, EAGER_LAUNCH_S_PER_LAYER per step

    def profile(self) -> EngineProfile:
        """The engine profile (`kvsim.cost.profiles`) this run simulates."""
        p = self.engine_profile
        return p if isinstance(p, EngineProfile) else get_profile(p)

    def resolved(self) -> "SimConfig":
        """This configuration with the engine profile's policy applied: chunked prefill and prefix
        caching (paged allocators) by default (vllm-v1), separate prompt steps and swap for
        multi-sequence requests (vllm-2023); `enforce_eager` adds its kernel launches to the profile's
        CPU time per step. ValueError when an explicit flag contradicts the profile."""
        profile, sched = self.profile(), self.scheduler
        if getattr(profile, "by_gpu", ()):          # a calibrated profile fitted per GPU: this GPU's values
            profile = profile.for_gpu(self.deployment.gpu.name)
        cache = replace(self.cache, prefix_caching=prefix_caching_on(self))
        if (self.enforce_eager and EAGER_NOTE not in profile.source       # (once: resolving is idempotent)
                and profile.time_model != "vllm-v1"):      # (the V1 time model launches eagerly itself)
            profile = replace(profile, cpu_step_s=profile.cpu_step_s + eager_launch_s(self.deployment),
                              source=profile.source + EAGER_NOTE)
        chunked = profile.chunked_prefill if sched.chunked_prefill is None else sched.chunked_prefill
        separate = sched.separate_prefill or profile.separate_prefill
        if separate and chunked:
            raise ValueError(f"--chunked-prefill: the {profile.name} engine profile runs each prompt whole "
                             "in a prompt-only step")
        seqs, tokens = self.batch_limits(profile, chunked)
        sched = replace(sched, chunked_prefill=chunked, separate_prefill=separate, max_num_seqs=seqs,
                        max_batched_tokens=tokens, swap_multi_seq=sched.swap_multi_seq or profile.swap_multi_sequence)
        return replace(self, cache=cache, scheduler=sched, engine_profile=profile)

    def batch_limits(self, profile: EngineProfile | None = None, chunked: bool | None = None) -> tuple[int, int]:
        """(max_num_seqs, max_batched_tokens) of this run: the flags given, else the engine profile's
        defaults for the GPU and the model's maximum length (`kvsim.engine.batching.defaults`)."""
        profile = profile or self.profile()
        sched, dep = self.scheduler, self.deployment
        if chunked is None:
            chunked = profile.chunked_prefill if sched.chunked_prefill is None else sched.chunked_prefill
        return batch_limits(profile.scheduler_defaults, dep.gpu.name, dep.gpu.memory_bytes, dep.model.max_seq_len,
                            chunked and not profile.separate_prefill, sched.max_num_seqs, sched.max_batched_tokens)

    def to_dict(self) -> dict:
        """The resolved configuration, JSON-ready (written as `config.json`)."""
        cfg = self.resolved()
        d = asdict(cfg)
        d["calibration"] = None if self.calibration is None else self.calibration.source
        return d


#: CPU seconds per layer per step that kernel launches cost without CUDA graphs (`--enforce-eager`):
#: vllm-project/vllm#1440 measured Llama-2-7B (32 layers, TP 1, batch 1, 100 output tokens) at 1.2 s
#: eager against 1.05 s with CUDA graphs, 1.5 ms per decode step = 47 us per layer. kvsim adds it to
#: every step in series with the kernels: at large batches the GPU work hides launches (#1440 saw no
#: gain there), so this is an upper bound on eager mode's cost. Memory: kvsim reserves nothing for
#: CUDA graphs, so --enforce-eager leaves the KV cache unchanged.
EAGER_LAUNCH_S_PER_LAYER = 1.5e-3 / 32
EAGER_NOTE = "; + --enforce-eager kernel launches"


def eager_launch_s(deployment: Deployment) -> float:
    """Extra CPU seconds per step under `--enforce-eager`: EAGER_LAUNCH_S_PER_LAYER x layers."""
    return EAGER_LAUNCH_S_PER_LAYER * deployment.model.num_layers


def prefix_caching_on(cfg: SimConfig) -> bool:
    """Whether the run caches prompt prefixes: `--enable-prefix-caching` when given, else the engine
    profile's default for the paged allocators (paged, hybrid, Jenga); never by default for contiguous.
    vLLM 0.33 turns it on for generative hybrid models too (`ModelConfig.is_prefix_caching_supported`),
    Mamba layers then in its "align" cache mode (kvsim/alloc/hybrid/mamba.py); Jenga does not model
    that, so it stays off there for a model with Mamba layers."""
    if cfg.cache.prefix_caching is not None:
        return cfg.cache.prefix_caching
    mamba = any(g.kind == "mamba" for g in cfg.deployment.model.layer_groups)
    return cfg.profile().prefix_caching and (cfg.cache.allocator == "paged"
                                             or (cfg.cache.allocator == "jenga" and not mamba))


def async_scheduling_on(cfg: SimConfig) -> bool:
    """vLLM 0.33's async scheduling for this run (`VllmConfig.__post_init__`, vllm/config/vllm.py):
    `--async-scheduling` / `--no-async-scheduling` when given, else on unless vLLM turns it off: for
    pooling models, executors without it, ROCm DeepEP DBO, or the V1 model runner with pipeline
    parallelism or a non-EAGLE speculative method. kvsim simulates none of those (generation models, one
    pipeline stage, no speculative decoding; every executor vLLM 0.33 ships supports it: uni, mp, and ray,
    whose RayExecutorV2 is a MultiprocExecutor; `--distributed-executor-backend` is accepted, no effect), so
    its default is on."""
    return True if cfg.scheduler.async_scheduling is None else cfg.scheduler.async_scheduling


def concurrent_batches(cfg: SimConfig) -> int:
    """Batches in flight at once, vLLM's `VllmConfig.max_concurrent_batches` at pipeline size 1: 2 with
    async scheduling (one step scheduled while the previous runs), else 1. It sizes the sliding and
    chunked groups' admission cap (`max_in_flight_tokens` = batches x max_num_batched_tokens)."""
    return 2 if async_scheduling_on(cfg) else 1


def kv_capacity(cfg: SimConfig) -> int:
    """KV slots of the run (the whole deployment), rounded down to whole blocks."""
    dep, cache = cfg.deployment, cfg.cache
    block_size = cache.block_size if cache.allocator == "paged" else 1
    capacity = dep.kv_capacity_tokens(cache.kv_gib, cache.num_blocks, cache.block_size, cache.gpu_mem_util,
                                      cfg.batch_limits()[1])
    if capacity < 1:
        raise ValueError("the KV cache holds no token slot (--kv-gib or --num-blocks too small)")
    if capacity < block_size:
        raise ValueError(f"--block-size {block_size} is larger than the whole KV cache ({capacity} token slots)")
    return capacity - capacity % block_size


def kv_cache_plan(cfg: SimConfig) -> KVCachePlan | None:
    """vLLM 0.33's KV cache groups and start-up figures (`kvsim.specs.kv_groups`) for a model with
    layers other than full attention; None for an all-full-attention model (`kv_capacity` gives its
    figures, unchanged). KV memory per GPU: `--kv-gib` / tp, `--num-blocks` blocks, or what the GPU
    leaves at `--gpu-mem-util`."""
    dep, cache = cfg.deployment, cfg.cache
    if not dep.model.is_hybrid:
        return None
    if cache.kv_gib is not None and cache.num_blocks is not None:
        raise ValueError("give --kv-gib or --num-blocks, not both")
    if cache.num_blocks is not None and cache.num_blocks <= 0:
        raise ValueError(f"--num-blocks must be positive, got {cache.num_blocks}")
    if cache.kv_gib is not None and not 0 < cache.kv_gib < float("inf"):
        raise ValueError(f"--kv-gib must be positive and finite, got {cache.kv_gib}")
    kv_bytes, tokens = None, cfg.batch_limits()[1]
    if cache.num_blocks is None:
        kv_bytes = (int(cache.kv_gib * GIB // dep.tp) if cache.kv_gib is not None else
                    int(dep.kv_memory_per_gpu(cache.gpu_mem_util, tokens)))
    return plan_kv_cache(dep.model, dep.tp, cache.block_size, kv_bytes_per_gpu=kv_bytes,
                         # (--num-blocks counts usable blocks; vLLM's count adds its null block)
                         num_blocks=None if cache.num_blocks is None else cache.num_blocks + 1,
                         max_num_batched_tokens=tokens,
                         hybrid=cache.hybrid_kv_cache, prefix_caching=prefix_caching_on(cfg),
                         max_concurrent_batches=concurrent_batches(cfg))
