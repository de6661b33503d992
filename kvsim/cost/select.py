"""The kernel cost model an engine profile times steps with (`cost_model`): the roofline
(`kvsim.cost.roofline`) or, for profiles with `time_model` "vllm-v1", vLLM V1's (`kvsim.cost.v1_time`).
The one place the choice is made (`build_run`, the block-size tuner, `calibrate-engine`)."""

from __future__ import annotations

from kvsim.cost.calibration import Calibration
from kvsim.cost.roofline import STEP_OVERHEAD_S, CostModel
from kvsim.cost.v1_time import V1CostModel
from kvsim.specs import Deployment


def cost_model(deployment: Deployment, block_size: int, paged: bool, calibration: Calibration | None,
               profile, max_num_seqs: int = 256, max_batched_tokens: int = 8192,
               enforce_eager: bool = False, async_scheduling: bool = True) -> CostModel:
    """`profile`'s cost model for `deployment` at `block_size` (`paged`: apply a paged-kernel factor).
    vllm-v1: CUDA-graph capture sizes from the batch limits, and the profile's CPU work overlapped
    (`async_scheduling`; else added);
    roofline: the fixed step overhead only for profiles that keep it (`ideal`)."""
    if profile.time_model == "vllm-v1":
        return V1CostModel(deployment, block_size, paged, calibration, max_num_seqs=max_num_seqs,
                           max_batched_tokens=max_batched_tokens, enforce_eager=enforce_eager,
                           cpu_step_s=profile.overlap_cpu_step_s, cpu_seq_s=profile.overlap_cpu_seq_s,
                           overlap_cpu=async_scheduling)
    return CostModel(deployment, block_size, paged, calibration,
                     step_overhead_s=STEP_OVERHEAD_S if profile.kernel_step_overhead else 0.0)
