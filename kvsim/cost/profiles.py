"""Engine profiles: what the simulated serving engine is beyond its kernels — its step policy and the
CPU time of a step. The kernel cost model (`kvsim.cost.roofline`) stays separate; the profile adds CPU time to
each step and picks the policy the scheduler runs. Sources and sensitivities: docs/engine-profiles.md.

- `vllm-2023`: the vLLM paper's engine (v0.1-v0.5): a step runs prompts or decodes, never both;
  recompute preemption for single-sequence requests, swap for multi-sequence ones (samples, beams);
  CPU time per step = VLLM_V0_CPU_STEP_S + VLLM_V0_CPU_SEQ_S x sequences; the paper's paged-kernel
  penalty.
- `vllm-v1`: vLLM's V1 engine (the default since v0.8): prefill and decode mixed under the token
  budget, chunked prefill on; output processing off the critical path, so a step's CPU time is its
  scheduling and input preparation only; today's paged kernels (no penalty).
- `ideal`: kernels only, the simulator's behaviour before profiles (mixed steps, the cost model's
  fixed 2 ms step overhead, the paper's paged penalty), kept for kernel-only studies and golden tests.

Units: seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

#: vLLM v0 CPU time per step, fixed part and per running sequence: least-squares fit (`kvsim
#: calibrate-engine`) to Vidur's measured vLLM CPU overheads on an A100 (microsoft/vidur
#: data/profiling/a100/cpu_overheads.csv, Llama-2-7B, TP 1, batch 8-64: schedule + sampler +
#: prepare inputs + process model outputs, 2.98 ms at batch 8 to 12.56 ms at batch 64; the rows are
#: shipped in calibration/vidur-a100-vllm-v0-cpu.csv). Cross-check: vLLM's v0.6 post (Sept 2024)
#: finds the GPU busy only 38 % of the time for Llama-3-8B on an H100 under v0.5.3.
VLLM_V0_CPU_STEP_S = 2.02e-3
VLLM_V0_CPU_SEQ_S = 1.71e-4
#: vLLM V1 CPU time per step: the same measurements' scheduling + input preparation only (0.52 ms at
#: batch 8 to 2.18 ms at batch 64), since V1 samples on the GPU and detokenizes and builds outputs in
#: another process, overlapped with the next step (vLLM V1 blog, Jan 2025).
VLLM_V1_CPU_STEP_S = 3.45e-4
VLLM_V1_CPU_SEQ_S = 2.9e-5


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One serving engine's policy and CPU time.

    separate_prefill: a step runs either prompts or decodes, never both (vLLM v0's scheduler);
    chunked_prefill: the default of `--chunked-prefill` (an explicit flag wins, except that separate
    prefill steps never chunk); swap_multi_sequence: preempt requests with several sequences by swap;
    cpu_step_s, cpu_seq_s: CPU seconds per step and per sequence in it (added to the kernel time);
    kernel_step_overhead: keep the cost model's fixed step overhead (`ideal` only);
    paged_penalty: the paged decode-attention factor of the vLLM paper (`kvsim.cost.roofline`), else none;
    prefix_caching: the default of `--enable-prefix-caching` for the paged allocators (an explicit flag wins)."""

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

    def __post_init__(self) -> None:
        for field in ("cpu_step_s", "cpu_seq_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"engine profile {self.name!r}: {field} must be a finite number >= 0, got {value}")
        if self.separate_prefill and self.chunked_prefill:
            raise ValueError(f"engine profile {self.name!r}: separate prefill steps do not chunk prompts")

    def cpu_seconds(self, num_seqs: int) -> float:
        """CPU time of a step that runs `num_seqs` sequences (prefilling and decoding), seconds."""
        return self.cpu_step_s + self.cpu_seq_s * num_seqs

    def to_dict(self) -> dict:
        return asdict(self)


#: vLLM V1 turns prefix caching on unless told otherwise: vllm/engine/arg_utils.py (0.33)
#: `_set_default_chunked_prefill_and_prefix_caching_args` sets `enable_prefix_caching` to
#: `ModelConfig.is_prefix_caching_supported`, true for generative decoder models; `CacheConfig.
#: enable_prefix_caching` defaults to True (vllm/config/cache.py). The vllm-2023 engine had it off.
VLLM_V1_PREFIX_CACHING = True

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (
    EngineProfile("vllm-2023", separate_prefill=True, swap_multi_sequence=True,
                  cpu_step_s=VLLM_V0_CPU_STEP_S, cpu_seq_s=VLLM_V0_CPU_SEQ_S, paged_penalty=True,
                  source="Vidur a100 cpu_overheads.csv (vLLM v0), all four CPU phases"),
    EngineProfile("vllm-v1", chunked_prefill=True, cpu_step_s=VLLM_V1_CPU_STEP_S,
                  cpu_seq_s=VLLM_V1_CPU_SEQ_S, prefix_caching=VLLM_V1_PREFIX_CACHING,
                  source="Vidur a100 cpu_overheads.csv (vLLM v0), schedule + prepare inputs"),
    EngineProfile("ideal", kernel_step_overhead=True, paged_penalty=True,
                  source="kernels only (cost model's fixed step overhead)"),
)}

#: The profile a run uses unless told otherwise: what `vllm serve` runs today.
DEFAULT_PROFILE = "vllm-v1"


def get_profile(name: str) -> EngineProfile:
    """A named profile, or one written by `kvsim calibrate-engine` (a JSON file path)."""
    key = name.lower()
    if key in PROFILES:
        return PROFILES[key]
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        return load_profile(path)
    raise ValueError(f"--engine-profile: unknown profile {name!r}; known: {', '.join(PROFILES)}, "
                     "or a JSON file from `kvsim calibrate-engine`")


def load_profile(path: str | Path) -> EngineProfile:
    """A profile written by `kvsim calibrate-engine`: its base profile with fitted CPU constants."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        base = PROFILES[str(data["base"])]
        return replace(base, name=str(data.get("name", path.stem)), cpu_step_s=float(data["cpu_step_s"]),
                       cpu_seq_s=float(data["cpu_seq_s"]), source=str(data.get("source", path)))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read engine profile: {exc}") from None
    except KeyError as exc:
        raise ValueError(f"{path}: engine profile needs field {exc.args[0]!r} (base one of "
                         f"{', '.join(PROFILES)})") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: bad engine profile: {exc}") from None
