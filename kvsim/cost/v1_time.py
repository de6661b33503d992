"""Step time of vLLM V1 (as of 0.15.1, the version of the H100 development runs) on today's GPUs: the
`vllm-v1` profile's cost model (`V1CostModel`). Seconds, bytes, FLOP/s; times are per step of the
whole tensor-parallel deployment (its GPUs work in parallel on 1/tp shards).

What it changes against the roofline it extends (`kvsim.cost.roofline`, whose per-layer constants
come from Vidur's eager-mode A100/H100 operator profiles):
- CUDA graphs: a step of at most the largest captured size (`capture_sizes`, vLLM's defaults) runs
  from a graph, its tokens padded to the next captured size; a larger one runs eagerly, and then the
  host must launch every kernel: the GPU time is at least HOST_LAUNCH_S_PER_LAYER x layers.
- all-reduce: vLLM's custom one-shot all-reduce on NVLink, NCCL above 8 MiB or without NVLink, by
  message size and TP (`kvsim.cost.collectives`), instead of a 39 us eager NCCL call.
- attention: one FlashAttention call per layer for the whole (mixed) batch: a fixed ATTN_FIXED_S plus
  KV bytes at ATTN_KV_HBM_EFFICIENCY of HBM and prefill FLOPs at PREFILL_ATTN_FLOP_EFFICIENCY; no
  per-sequence term (FA3's paged decode: 27.6 us at 16 sequences of 128 tokens, of which 10 us is
  bytes).
- fused MoE: a decode step reads only the experts its tokens route to (uniform routing, top-k); with
  expert parallelism (`Deployment.ep`) a GPU reads its share of them and exchanges hidden states with
  the other engines once per layer.
- fp8 weights: GEMMs at the GPU's fp8 rate (`GpuSpec.flops`) and FP8_GEMM_EFFICIENCY.
- CPU: V1 schedules the next step while the GPU runs this one (async scheduling, on by default since
  about v0.12): a step takes max(GPU time, the profile's overlapped CPU work); the profile's own
  `cpu_seconds` is then only the gap between steps (ASYNC_GAP_S).
Every constant's source: docs/engine-profiles.md ("vllm-v1 time model") and the comments below.
"""

from __future__ import annotations

from bisect import bisect_left

from kvsim.cost.calibration import Calibration
from kvsim.cost.collectives import all_reduce_s
from kvsim.cost.layer_kinds import CappedAttention, CappedGroup
from kvsim.cost import roofline
from kvsim.cost.roofline import LINEAR_FLOP_EFFICIENCY, LINEAR_HBM_EFFICIENCY, CostModel, _param_split
from kvsim.specs import Deployment

#: The vLLM release whose engine this profile models.
VLLM_VERSION = "0.15.1"
#: Largest CUDA-graph capture size vLLM picks by default (vllm/config/vllm.py `_set_cudagraph_sizes`).
MAX_CAPTURE_SIZE = 512
#: One small kernel (rotary embedding, fused add + RMSNorm) inside a CUDA graph: engine-evidence's
#: central 3 us (1-6), derived from the graph-vs-eager saving of vllm PR #1440 (~45 us per layer) and the
#: NCCL graph-vs-eager gap (nccl #1984). Vidur's 15 us per layer for 5 linear kernels is the same rate.
KERNEL_FIXED_S = 3e-6
#: Host time to launch one layer's kernels eagerly (no graph): vllm PR #1440, Llama-2-7B batch 1,
#: 1.5 ms per step over 32 layers = 47 us per layer (the same figure as --enforce-eager's,
#: kvsim.engine.config.EAGER_LAUNCH_S_PER_LAYER).
HOST_LAUNCH_S_PER_LAYER = 1.5e-3 / 32
#: Fixed time of one attention call per layer: FA3 paged decode at 16 x 128 tokens takes 27.6 us of
#: which 10 us is bytes (Dao-AILab/flash-attention #1572); batch 1 at 1k tokens 12.3-14.8 us
#: (vllm-project/flash-attention PR #63). Evidence central 12 us (8-18).
ATTN_FIXED_S = 12e-6
#: Fraction of HBM bandwidth decode attention reads KV at, at the batches served (tens to hundreds of
#: sequences): FlashInfer's decode on B200 at 256 sequences reads at 0.8-0.87 of peak after its fixed
#: time (vllm PR #19825); Vidur's A100 anchors (vLLM's paged kernel) 0.96. Small batches read slower
#: (FA3 at 16 sequences, page 8: 0.55, flash-attention #1572), so small-batch long-context decode is
#: predicted up to ~30 % fast.
ATTN_KV_HBM_EFFICIENCY = 0.80
#: Prefill attention FLOP efficiency of FlashAttention-3 (0.75 of H100 peak at long sequences: arXiv
#: 2407.08608); vLLM's chunks are short (<= max_num_batched_tokens), so the evidence's low end, 0.5.
#: FLOPs are counted as in the roofline (4 x heads x head_dim x query-key pairs / 2).
PREFILL_ATTN_FLOP_EFFICIENCY = 0.5
#: fp8 GEMMs reach 0.709 of fp8 peak where bf16 reaches 0.803 (MAMF, H100: stas00/ml-engineering), so
#: the bf16 efficiency is scaled by 0.709 / 0.803 for fp8 weights.
FP8_GEMM_EFFICIENCY = LINEAR_FLOP_EFFICIENCY * 0.709 / 0.803
#: The GPU's idle gap between steps left by async scheduling: 0.15-0.17 ms with CUDA graphs (vllm PR
#: #11133's measurement of its prototype; evidence central 0.3 ms, range 0.05-1.5).
ASYNC_GAP_S = 0.16e-3


def capture_sizes(max_num_seqs: int, max_batched_tokens: int) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then 8 to 248 by 8, then 256 by 16 up to
    min(2 x max_num_seqs, 512), none above max_num_batched_tokens (vllm/config/vllm.py)."""
    top = min(2 * max_num_seqs, MAX_CAPTURE_SIZE, max_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, MAX_CAPTURE_SIZE + 1, 16)]
    return tuple(s for s in sizes if s <= top)


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts `tokens` tokens route to with top-k routing, uniform over `experts`."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens) if experts else 0.0


class V1CostModel(CostModel):
    """vLLM V1's step time (module docstring). `max_num_seqs`/`max_batched_tokens` set the CUDA-graph
    capture sizes (`enforce_eager`: none); `cpu_step_s + cpu_seq_s x sequences` is the CPU work async
    scheduling overlaps with the GPU (`overlap_cpu`; without async scheduling it adds to it); `paged`:
    apply the calibration file's paged factor."""

    def __init__(self, deployment: Deployment, block_size: int, paged: bool = False,
                 calibration: Calibration | None = None, *, max_num_seqs: int = 256,
                 max_batched_tokens: int = 8192, enforce_eager: bool = False,
                 cpu_step_s: float = 0.0, cpu_seq_s: float = 0.0, overlap_cpu: bool = True):
        super().__init__(deployment, block_size, paged, calibration, step_overhead_s=0.0)
        model, gpu, tp = deployment.model, deployment.gpu, deployment.tp
        layers = model.num_layers
        self.capture = () if enforce_eager else capture_sizes(max_num_seqs, max_batched_tokens)
        self.cpu_step_s, self.cpu_seq_s = cpu_step_s, cpu_seq_s
        self.overlap_cpu = overlap_cpu      # False: --no-async-scheduling, the CPU work comes before the GPU's
        wbytes = model.weight_bytes_per_param
        eff = FP8_GEMM_EFFICIENCY if gpu.flops(wbytes) != gpu.bf16_flops else LINEAR_FLOP_EFFICIENCY
        linear_params, read_bytes = _param_split(model)
        self._lin_s_per_token = 2 * linear_params / tp / (gpu.flops(wbytes) * eff)
        # weights: the dense part always, the experts as far as the step's tokens touch them; with expert
        # parallelism a GPU holds experts / (tp x dp) whole and the tokens of all dp engines reach them
        # (the engines step in lockstep: each taken to run a batch like this one)
        e = model.num_experts
        expert_bytes = deployment.expert_weight_bytes
        rate = gpu.hbm_bytes_per_s * LINEAR_HBM_EFFICIENCY
        self._dense_s = (read_bytes - expert_bytes) / tp / rate
        self._expert_s = expert_bytes / e / rate / (tp * deployment.dp if deployment.ep else tp) if e else 0.0
        self._ep_tokens = deployment.dp if deployment.ep else 1
        small = 3 if tp == 1 else 1          # rotary + 2 fused add-RMSNorms; with TP the norms fuse into the AR
        self._lin_fixed_s += layers * small * KERNEL_FIXED_S
        self._launch_s = layers * HOST_LAUNCH_S_PER_LAYER
        self._ar_bytes = model.hidden_size * model.dtype_bytes
        self._ar_calls = 2 * layers
        if calibration is None:            # one attention call per layer; KV read at the V1 rate
            attn_layers = sum(g.num_layers for g in model.layer_groups) or layers
            kv_rate = gpu.hbm_bytes_per_s * ATTN_KV_HBM_EFFICIENCY
            kv_scale = roofline.DECODE_ATTN_HBM_EFFICIENCY / ATTN_KV_HBM_EFFICIENCY     # (no paged factor here)
            flop_scale = roofline.PREFILL_ATTN_FLOP_EFFICIENCY / PREFILL_ATTN_FLOP_EFFICIENCY
            self._decode_s_per_token *= kv_scale
            self._attn_fixed_s = attn_layers * ATTN_FIXED_S
            self._decode_s_per_seq = (2 * model.state_bytes_per_request(tp) / kv_rate
                                      if model.state_bytes_per_request(tp) else 0.0)
            self._prefill_s_per_pair *= flop_scale
            self.capped = CappedAttention([
                CappedGroup(g.kind, g.size, g.decode_s_per_token * kv_scale, g.prefill_s_per_pair * flop_scale)
                for g in self.capped.groups])
        else:
            self._attn_fixed_s = self._decode_fixed_s
        self._decode_fixed_s = self._prefill_fixed_s = 0.0

    # -- the parts ---------------------------------------------------------------------------------
    def padded(self, tokens: int) -> tuple[int, bool]:
        """(tokens the step computes, whether it runs from a CUDA graph): padded up to the next captured
        size, or as they are (eager) above the largest."""
        if self.capture and tokens <= self.capture[-1]:
            return self.capture[bisect_left(self.capture, tokens)], True
        return tokens, False

    def weights_time(self, tokens: int) -> float:
        """Seconds to read the weights a step of `tokens` tokens uses (MoE: the experts they touch)."""
        if not self._expert_s:
            return self._dense_s
        m = self.deployment.model
        t = tokens * self._ep_tokens
        return self._dense_s + self._expert_s * experts_touched(t, m.num_experts, m.experts_per_token)

    def all_reduce_time(self, tokens: int) -> float:
        """Seconds of the two all-reduces per layer over `tokens` tokens (0 for tp 1)."""
        if tokens <= 0:
            return 0.0
        t, graph = self.padded(tokens)
        dep = self.deployment
        g = dep.gpu
        tp_ar = self._ar_calls * all_reduce_s(t * self._ar_bytes, dep.tp, g.link, g.link_bytes_per_s,
                                              g.pcie_bytes_per_s, graph)
        if not dep.ep or dep.dp == 1:
            return tp_ar
        # expert parallelism over tp x dp GPUs, vLLM's default all2all backend (allgather_reducescatter):
        # per MoE layer every GPU gathers the hidden states of all engines' tokens and reduce-scatters the
        # expert outputs: taken as one all-reduce of those bytes over the EP group (ASSUMED shape)
        ep_bytes = t * dep.dp * self._ar_bytes
        return tp_ar + self._ar_calls // 2 * all_reduce_s(ep_bytes, dep.tp * dep.dp, g.link, g.link_bytes_per_s,
                                                          g.pcie_bytes_per_s, graph)

    def cpu_work(self, seqs: int) -> float:
        """CPU seconds of a step of `seqs` sequences that async scheduling overlaps with the GPU."""
        return self.cpu_step_s + self.cpu_seq_s * seqs

    def timed_step(self, prefill_tokens: int, prefill_attn_tokens: int,
                   decode_seqs: int, decode_context_tokens: int) -> tuple[float, bool]:
        """(seconds, compute-bound) of one step: max(GPU time, overlapped CPU work); arguments as
        `CostModel.step_time`."""
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0:
            return self.cpu_work(0), False
        t, graph = self.padded(tokens)
        tiled = -(-t // 128) * 128
        gemm_compute = tiled * self._lin_s_per_token
        gemm_memory = self.weights_time(t) + t * self._act_s_per_token
        linear = self._lin_fixed_s + max(gemm_compute, gemm_memory)
        prefill = prefill_attn_tokens * self._prefill_s_per_pair
        decode = decode_seqs * self._decode_s_per_seq + decode_context_tokens * self._decode_s_per_token
        store = self._store_fixed_s + tokens * self._store_s_per_token
        gpu = linear + self._attn_fixed_s + prefill + decode + store + self.all_reduce_time(tokens)
        if not graph:
            gpu = max(gpu, self._launch_s)
        compute = (gemm_compute if gemm_compute > gemm_memory else 0.0) + prefill
        memory = (gemm_memory if gemm_compute <= gemm_memory else 0.0) + decode + store
        seqs = decode_seqs + (1 if prefill_tokens else 0)
        cpu = self.cpu_work(seqs)
        return (max(gpu, cpu) if self.overlap_cpu else gpu + cpu), compute > memory

    def step_time(self, prefill_tokens: int, prefill_attn_tokens: int,
                  decode_seqs: int, decode_context_tokens: int) -> float:
        """Seconds for one engine step (arguments as `CostModel.step_time`)."""
        return self.timed_step(prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens)[0]

    def compute_bound(self, prefill_tokens: int, prefill_attn_tokens: int,
                      decode_seqs: int, decode_context_tokens: int) -> bool:
        """Whether the step's kernels spend more time FLOP-bound than HBM-bound."""
        return self.timed_step(prefill_tokens, max(prefill_attn_tokens, 0), decode_seqs, decode_context_tokens)[1]

    def decode_step_times(self, seqs: int, first_context: int, steps: int,
                          growth: int | None = None, plus_s: float = 0.0) -> list[float]:
        """`step_time(0, 0, seqs, c)` + `plus_s` for c = first_context, + growth, ... (`steps` of them)."""
        grow = seqs if growth is None else growth
        return [self.step_time(0, 0, seqs, first_context + j * grow) + plus_s for j in range(steps)]
