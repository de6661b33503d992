"""Engine profiles: what the simulated serving engine is beyond its kernels — its step policy and the
CPU time of a step. The kernel cost model (`kvsim.cost.roofline`) stays separate; the profile adds CPU time to
each step and picks the policy the scheduler runs. Sources and sensitivities: docs/engine-profiles.md.

- `vllm-2023`: the vLLM paper's engine (v0.1-v0.5): a step runs prompts or decodes, never both;
  recompute preemption for single-sequence requests, swap for multi-sequence ones (samples, beams);
  CPU time per step = VLLM_V0_CPU_STEP_S + VLLM_V0_CPU_SEQ_S x sequences; the 2023 paged kernel
  (`vllm-v0-paged`, `kvsim.cost.kernels`).
- `vllm-v1`: vLLM's V1 engine as of 0.15.1 (the default since v0.8): prefill and decode mixed under the
  token budget, chunked prefill on; output processing off the critical path, so a step's CPU work is its
  scheduling and input preparation only, and async scheduling overlaps it with the GPU (only a gap
  between steps remains); today's paged kernels (`flash-attn`, no penalty) timed by
  `kvsim.cost.v1_time` (CUDA graphs, custom all-reduce).
- `vllm-2023:low|central|high`, `vllm-v1:low|central|high`: the CPU-time variants (`CPU_VARIANTS`); the
  plain name is central.
- `ideal`: kernels only, the simulator's behaviour before profiles (mixed steps, the cost model's
  fixed 2 ms step overhead, the paper's paged penalty), kept for kernel-only studies and golden tests.

Units: seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kvsim.cost.kernels import get_kernel
from kvsim.cost.v1_time import ASYNC_GAP_S, VLLM_VERSION

#: CPU time per step = fixed part + per running sequence (seconds), per profile and variant: least-squares
#: fits (`kvsim calibrate-engine`) to Vidur's measured vLLM-v0 CPU overheads on an A100, Llama-2-7B, TP 1
#: (microsoft/vidur data/profiling/a100/cpu_overheads.csv; the rows are in calibration/):
#: - central: MEDIANS of the January 2024 file (commit 0633efa), batch 8-64, all four phases (schedule,
#:   sampler, prepare inputs, process model outputs): 1.97 ms at batch 8 to 7.59 ms at 64;
#: - low: medians of the May 2024 file (commit 6d98aa8, a later engine), batch 8-128: 1.17 to 6.22 ms;
#: - high: MEANS of the January 2024 file (heavy-tailed: process outputs' mean is 2.2x its median at 64).
#: vllm-v1 keeps schedule + prepare inputs only (V1 samples on the GPU and builds outputs in another
#: process, overlapped with the next step: vLLM V1 blog, Jan 2025). Growth beyond the data: linear in
#: sequences (v0's sampler, input preparation and output processing loop over sequences; the May 2024
#: data stays linear to batch 128, rms 0.035 ms). docs/engine-profiles.md lists every number.
CPU_VARIANTS: dict[str, dict[str, tuple[float, float, str]]] = {
    "vllm-2023": {
        "low": (7.90e-4, 4.26e-5, "Vidur A100 cpu_overheads.csv May 2024, medians, batch 8-128"),
        "central": (1.20e-3, 1.00e-4, "Vidur A100 cpu_overheads.csv Jan 2024, medians, batch 8-64"),
        "high": (2.02e-3, 1.71e-4, "Vidur A100 cpu_overheads.csv Jan 2024, means, batch 8-64"),
    },
    "vllm-v1": {
        "low": (2.72e-4, 2.17e-5, "Vidur May 2024 medians, schedule + prepare inputs, batch 8-128"),
        "central": (2.41e-4, 2.94e-5, "Vidur Jan 2024 medians, schedule + prepare inputs, batch 8-64"),
        "high": (3.45e-4, 2.90e-5, "Vidur Jan 2024 means, schedule + prepare inputs, batch 8-64"),
    },
}
VARIANTS = ("low", "central", "high")
VLLM_V0_CPU_STEP_S, VLLM_V0_CPU_SEQ_S = CPU_VARIANTS["vllm-2023"]["central"][:2]
VLLM_V1_CPU_STEP_S, VLLM_V1_CPU_SEQ_S = CPU_VARIANTS["vllm-v1"]["central"][:2]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One serving engine's policy and CPU time.

    separate_prefill: a step runs either prompts or decodes, never both (vLLM v0's scheduler);
    chunked_prefill: the default of `--chunked-prefill` (an explicit flag wins, except that separate
    prefill steps never chunk); swap_multi_sequence: preempt requests with several sequences by swap;
    cpu_step_s, cpu_seq_s: CPU seconds per step and per sequence in it (added to the kernel time);
    kernel_step_overhead: keep the cost model's fixed step overhead (`ideal` only);
    paged_penalty: the paged decode-attention factor of the vLLM paper (`kvsim.cost.roofline`), else none;
    prefix_caching: the default of `--enable-prefix-caching` for the paged allocators (an explicit flag wins);
    kernel: the paged-attention kernel family it runs (`kvsim.cost.kernels`: its accepted block sizes and
    cost curve); variant: the CPU-time variant ("low", "central", "high"; "" for none); block_table: how
    the engine builds block tables each step, "padded-longest" (vLLM v0: every table rebuilt, padded to
    the batch's longest sequence; worker `_prepare_inputs`) or "persistent" (V1: new blocks appended to a
    persistent table whose first `batch` rows, max_model_len / block wide, are copied; v1/worker/block_table.py);
    scheduler_defaults: the batch limits a run takes without --max-num-seqs / --max-num-batched-tokens,
    "vllm-v1" (per GPU, as `vllm serve`), "vllm-0.1.4" (256 and 2560) or "fixed" (256 and 8192;
    `kvsim.engine.batching.defaults`); policy: the scheduling policy on paged memory, "kvsim" (the engine's
    own, `kvsim.engine.batching.scheduler`) or "vllm-0.1.4" (vLLM 0.1.4's, `kvsim.engine.batching.vllm2023`: checked
    step for step against that version's code);
    time_model: the kernel cost model, "roofline" (`kvsim.cost.roofline`, Vidur's eager-mode operator
    constants) or "vllm-v1" (`kvsim.cost.v1_time`: CUDA graphs, custom all-reduce, async scheduling);
    overlap_cpu_step_s, overlap_cpu_seq_s: under "vllm-v1", the CPU work per step and per sequence that
    async scheduling overlaps with the GPU (a step takes the longer of the two); `cpu_step_s` and
    `cpu_seq_s` are then the CPU time NOT overlapped (the gap between steps)."""

    name: str
    separate_prefill: bool = False
    chunked_prefill: bool = False
    swap_multi_sequence: bool = False
    cpu_step_s: float = 0.0
    cpu_seq_s: float = 0.0
    kernel_step_overhead: bool = False
    paged_penalty: bool = False
    source: str = ""
    prefix_caching: bool = False
    kernel: str = "vllm-v0-paged"
    variant: str = ""
    block_table: str = "padded-longest"
    scheduler_defaults: str = "fixed"
    time_model: str = "roofline"
    overlap_cpu_step_s: float = 0.0
    overlap_cpu_seq_s: float = 0.0
    policy: str = "kvsim"

    def __post_init__(self) -> None:
        for field in ("cpu_step_s", "cpu_seq_s", "overlap_cpu_step_s", "overlap_cpu_seq_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"engine profile {self.name!r}: {field} must be a finite number >= 0, got {value}")
        if self.separate_prefill and self.chunked_prefill:
            raise ValueError(f"engine profile {self.name!r}: separate prefill steps do not chunk prompts")
        get_kernel(self.kernel)
        if self.block_table not in ("padded-longest", "persistent"):
            raise ValueError(f"engine profile {self.name!r}: block_table must be padded-longest or persistent")
        if self.time_model not in ("roofline", "vllm-v1"):
            raise ValueError(f"engine profile {self.name!r}: time_model must be roofline or vllm-v1")
        if self.scheduler_defaults not in ("vllm-v1", "vllm-0.1.4", "fixed"):
            raise ValueError(f"engine profile {self.name!r}: scheduler_defaults must be vllm-v1, vllm-0.1.4 "
                             "or fixed")
        if self.policy not in ("kvsim", "vllm-0.1.4"):
            raise ValueError(f"engine profile {self.name!r}: policy must be kvsim or vllm-0.1.4")

    def cpu_seconds(self, num_seqs: int) -> float:
        """CPU time of a step that runs `num_seqs` sequences (prefilling and decoding), seconds."""
        return self.cpu_step_s + self.cpu_seq_s * num_seqs

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CalibratedProfile(EngineProfile):
    """An `EngineProfile` with the GPU-side parameters `kvsim calibrate` fits (applied around the cost
    model by `kvsim.cost.adjusted`): `gpu_time_scale` multiplies every step's kernel time (1: the
    evidence-based model); `allreduce_delta_s` is added to each of the two all-reduces per layer at TP > 1."""

    gpu_time_scale: float = 1.0
    allreduce_delta_s: float = 0.0
    #: Per-GPU values, ((GPU preset name, gpu_time_scale, allreduce_delta_s, cpu_step_s, cpu_seq_s), ...):
    #: a run on a listed GPU takes its row (`for_gpu`); any other GPU the values above.
    by_gpu: tuple = ()

    def __post_init__(self) -> None:
        super(CalibratedProfile, self).__post_init__()
        if not (math.isfinite(self.gpu_time_scale) and self.gpu_time_scale > 0):
            raise ValueError(f"engine profile {self.name!r}: gpu_time_scale must be > 0, got {self.gpu_time_scale}")
        if not math.isfinite(self.allreduce_delta_s):
            raise ValueError(f"engine profile {self.name!r}: allreduce_delta_s must be finite")
        for row in self.by_gpu:
            replace(self, gpu_time_scale=row[1], allreduce_delta_s=row[2], cpu_step_s=row[3], cpu_seq_s=row[4],
                    by_gpu=())      # (each GPU's values checked as a profile of their own)

    def for_gpu(self, gpu_name: str) -> "CalibratedProfile":
        """This profile with `gpu_name`'s fitted values (the plain values where it has none)."""
        for gpu, scale, delta, step, seq in self.by_gpu:
            if gpu.lower() == gpu_name.lower():
                return replace(self, gpu_time_scale=scale, allreduce_delta_s=delta, cpu_step_s=step,
                               cpu_seq_s=seq, by_gpu=())
        return replace(self, by_gpu=())


#: vLLM V1 turns prefix caching on unless told otherwise: vllm/engine/arg_utils.py (0.33)
#: `_set_default_chunked_prefill_and_prefix_caching_args` sets `enable_prefix_caching` to
#: `ModelConfig.is_prefix_caching_supported`, true for generative decoder models; `CacheConfig.
#: enable_prefix_caching` defaults to True (vllm/config/cache.py). The vllm-2023 engine had it off.
VLLM_V1_PREFIX_CACHING = True

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (
    EngineProfile("vllm-2023", separate_prefill=True, swap_multi_sequence=True,
                  cpu_step_s=VLLM_V0_CPU_STEP_S, cpu_seq_s=VLLM_V0_CPU_SEQ_S, paged_penalty=True,
                  source=CPU_VARIANTS["vllm-2023"]["central"][2], kernel="vllm-v0-paged", variant="central",
                  scheduler_defaults="vllm-0.1.4", policy="vllm-0.1.4"),
    EngineProfile("vllm-v1", chunked_prefill=True, cpu_step_s=ASYNC_GAP_S, cpu_seq_s=0.0,
                  overlap_cpu_step_s=VLLM_V1_CPU_STEP_S, overlap_cpu_seq_s=VLLM_V1_CPU_SEQ_S,
                  prefix_caching=VLLM_V1_PREFIX_CACHING,
                  source=CPU_VARIANTS["vllm-v1"]["central"][2] + f" (overlapped); vLLM {VLLM_VERSION}",
                  kernel="flash-attn", variant="central", block_table="persistent",
                  scheduler_defaults="vllm-v1", time_model="vllm-v1"),
    EngineProfile("ideal", kernel_step_overhead=True, paged_penalty=True,
                  source="kernels only (cost model's fixed step overhead)", kernel="vllm-v0-paged"),
)}

#: The profile a run uses unless told otherwise: what `vllm serve` runs today.
DEFAULT_PROFILE = "vllm-v1"


def get_profile(name: str) -> EngineProfile:
    """A named profile, `NAME:VARIANT` (VARIANT one of low, central, high: the CPU-time variant; the
    plain name is central), or one written by `kvsim calibrate-engine` (a JSON file path). The one place
    a profile name is parsed."""
    key = name.lower()
    if key in PROFILES:
        return PROFILES[key]
    base, sep, variant = key.partition(":")
    if sep and base in PROFILES:
        variants = CPU_VARIANTS.get(base)
        if variants is None or variant not in variants:
            have = f"one of {', '.join(VARIANTS)}" if variants else "none (it has no CPU time)"
            raise ValueError(f"--engine-profile: {name!r}: profile {base!r} has no variant {variant!r}; "
                             f"variants: {have}")
        step, seq, source = variants[variant]
        if PROFILES[base].time_model == "vllm-v1":     # the variants are the CPU work async scheduling hides
            return replace(PROFILES[base], name=f"{base}:{variant}", overlap_cpu_step_s=step,
                           overlap_cpu_seq_s=seq, source=source + " (overlapped)", variant=variant)
        return replace(PROFILES[base], name=f"{base}:{variant}", cpu_step_s=step, cpu_seq_s=seq,
                       source=source, variant=variant)
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        return load_profile(path)
    raise ValueError(f"--engine-profile: unknown profile {name!r}; known: {', '.join(PROFILES)} "
                     f"(vllm-2023 and vllm-v1 also as NAME:low, NAME:central or NAME:high), "
                     "or a JSON file from `kvsim calibrate-engine`")


def load_profile(path: str | Path) -> EngineProfile:
    """A profile written by `kvsim calibrate-engine`: its base profile with fitted CPU constants."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        base = PROFILES[str(data["base"])]
        profile = replace(base, name=str(data.get("name", path.stem)), cpu_step_s=float(data["cpu_step_s"]),
                          cpu_seq_s=float(data["cpu_seq_s"]), source=str(data.get("source", path)),
                          variant="measured")
        if "gpu_time_scale" in data or "allreduce_delta_s" in data:     # from `kvsim calibrate`
            by_gpu = tuple((str(g), float(v["gpu_time_scale"]), float(v["allreduce_delta_s"]),
                            float(v["cpu_step_s"]), float(v["cpu_seq_s"]))
                           for g, v in sorted((data.get("by_gpu") or {}).items()))
            profile = CalibratedProfile(**profile.to_dict(), gpu_time_scale=float(data.get("gpu_time_scale", 1.0)),
                                        allreduce_delta_s=float(data.get("allreduce_delta_s", 0.0)), by_gpu=by_gpu)
        return profile
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read engine profile: {exc}") from None
    except KeyError as exc:
        raise ValueError(f"{path}: engine profile needs field {exc.args[0]!r} (base one of "
                         f"{', '.join(PROFILES)})") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: bad engine profile: {exc}") from None
