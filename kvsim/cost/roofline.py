"""Step-time model: a per-layer roofline plus a fixed step overhead, or a calibration file's fit.

Times are seconds for the whole tensor-parallel deployment (its `tp` GPUs work in parallel, each on 1/tp
of the weights, heads and KV). Rates are FLOP/s and bytes/s. The constants below are defaults; each
names its source, and docs/cost-model.md states how far the model is from real profiles.
"""

from __future__ import annotations

from kvsim.cost.calibration import Calibration
from kvsim.cost.kernels import KERNELS
from kvsim.cost.layer_kinds import CappedAttention, CappedGroup
from kvsim.specs import Deployment, ModelSpec

#: Fixed CPU time per engine step (scheduling, input preparation, sampling, output processing): the
#: order of magnitude of vLLM's per-step CPU time; not measured in the shipped profiles.
STEP_OVERHEAD_S = 2e-3

#: Fraction of dense bf16 peak FLOP/s the projection and MLP GEMMs reach at large token counts. Fitted to
#: Vidur's A100 and H100 Llama-2-7B/70B and Llama-3-8B profiles (they reach 0.67-0.75 of peak).
LINEAR_FLOP_EFFICIENCY = 0.70
#: Fraction of HBM bandwidth the same GEMMs reach when weight reading dominates (few tokens). Vidur's
#: profiles: 0.74-0.77 on A100-80GB, 0.75-0.87 on H100 (single-GPU shards of 7B and 70B).
LINEAR_HBM_EFFICIENCY = 0.80
#: Fixed time per layer of the linear operators (about 3 us each for QKV, output, up, activation and
#: down kernels): Vidur's profiles bottom out at 30-55 us per layer for small tensor-parallel shards.
LINEAR_FIXED_S = 1.5e-5
#: GEMMs compute whole tiles of this many tokens, so the compute term counts tokens rounded up to a
#: multiple of it (the profiles jump by up to 2x just past 128, 256 and 512 tokens).
GEMM_TILE_TOKENS = 128
#: Activation elements read or written per token per layer, in units of hidden_size (inputs and outputs
#: of the QKV, output, up, activation and down operators: about 12-24 for LLaMA and OPT shapes).
ACTIVATION_HIDDENS_PER_TOKEN = 16

#: Prefill attention: fraction of peak FLOP/s, counting FLOPs as 4 x heads x head_dim x query-key pairs / 2
#: (the causal halving applied to every chunk). Least-squares fit to Vidur's Llama-2-7B A100 prefill
#: anchors: their kernel reaches only 45-55 TFLOP/s counted this way (FlashAttention-2 reaches 0.5-0.7).
PREFILL_ATTN_FLOP_EFFICIENCY = 0.17
#: Prefill attention fixed time per layer (kernel launch and setup), seconds; same least-squares fit.
PREFILL_ATTN_FIXED_S = 3.0e-5

#: Contiguous decode attention = DECODE_ATTN_FIXED_S + seqs x DECODE_ATTN_PER_SEQ_S + KV bytes /
#: (HBM x DECODE_ATTN_HBM_EFFICIENCY) per layer. Least-squares fit (relative error) to Vidur's
#: Llama-2-7B A100 decode anchors: that kernel is paged (block 16) yet reads KV at 0.96 of HBM
#: bandwidth, so a contiguous kernel is taken to be no slower; the paged default below adds the paper's
#: overhead on top (docs/cost-model.md states the resulting gap).
DECODE_ATTN_HBM_EFFICIENCY = 0.95
DECODE_ATTN_FIXED_S = 8.0e-6      # per layer, one launch (anchor: batch 1 at 32 tokens, 9 us)
DECODE_ATTN_PER_SEQ_S = 1.0e-6    # per sequence per layer (at 32 tokens: batch 1 -> 86, 9 -> 128 us)

#: Paged/contiguous decode attention time is PAGED_OVERHEAD_FLOOR + PAGED_OVERHEAD_BLOCK / block_size:
#: the 2023 PagedAttention kernel's curve (`kvsim.cost.kernels`, family "vllm-v0-paged": 1.23 at block 16
#: from the vLLM paper's Sec. 7.1 kernel microbenchmark; the 1/b slope is assumed, see there).
PAGED_OVERHEAD_FLOOR = KERNELS["vllm-v0-paged"].floor
PAGED_OVERHEAD_BLOCK = KERNELS["vllm-v0-paged"].per_block

#: KV write (reshape-and-cache): fixed time per layer and fraction of HBM bandwidth for scattered rows
#: (the order of the example in docs/calibration-format.md: 2.5e12 of an H200's 4.8e12 bytes/s).
STORE_KV_FIXED_S = 3.0e-6
STORE_KV_HBM_EFFICIENCY = 0.5

#: Fixed time of one host<->device copy call (cudaMemcpyAsync): 5-7 us per call measured for many small
#: chunks (DualPath, Wu et al., arXiv 2602.21548, Sec. 5.2); the upper end is taken. vLLM v0 swaps a
#: request with one call per block, per layer, for keys and for values (csrc/cache_kernels.cu
#: `swap_blocks` loops `cudaMemcpyAsync` over the block mapping; worker/cache_engine.py `_swap` calls it
#: for each layer's key and value cache), so a swap of B blocks costs 2 x layers x B calls on top of its
#: bytes over PCIe (the alpha-beta model of a transfer: latency + bytes / bandwidth per call).
SWAP_COPY_FIXED_S = 7e-6

#: Tensor-parallel all-reduce: latency per call and NCCL bus bandwidth (algorithm bandwidth x
#: 2(n-1)/n). Least-squares fit over 0.1-60 MB to Vidur's A100 2-GPU NVLink profile.
ALL_REDUCE_LATENCY_S = 3.9e-5
ALL_REDUCE_BUS_BYTES_PER_S = 1.96e11

#: (vocab size, tied input/output embeddings) of presets, from their config.json; ModelSpec has no vocab.
#: Other models count every parameter as a linear-layer weight (an overestimate of 4-13 %).
EMBEDDINGS: dict[str, tuple[int, bool]] = {
    "opt-13b": (50272, True), "opt-66b": (50272, True), "opt-175b": (50272, True),
    "llama-13b": (32000, False), "llama-2-7b": (32000, False), "llama-2-13b": (32000, False),
    "llama-2-70b": (32000, False), "llama-3-8b": (128256, False), "llama-3-70b": (128256, False),
    "llama-3.1-8b": (128256, False), "mistral-7b": (32000, False), "mixtral-8x7b": (32000, False),
    "qwen2.5-7b": (152064, False),
}


def default_paged_overhead(block_size: int) -> float:
    """Paged/contiguous decode attention time at `block_size` without a calibration file."""
    return PAGED_OVERHEAD_FLOOR + PAGED_OVERHEAD_BLOCK / block_size


def _param_split(model: ModelSpec) -> tuple[float, float]:
    """(parameters one token computes with in linear layers, weight bytes read per step): the LM head is
    read once per step but computed for one token per sequence only; an untied input embedding is only
    gathered. A MoE model computes with its active experts but a batch reads them all (with 8 experts,
    top-2, a batch of 8 tokens already touches 90 % of them); quantized weights are read at their size."""
    vocab, tied = EMBEDDINGS.get(model.name, (0, True))
    table = vocab * model.hidden_size
    return (model.compute_params - table * (1 if tied else 2),
            model.weight_bytes - (0 if tied else table * model.dtype_bytes))


class CostModel:
    """Roofline step times for one deployment; a `Calibration` replaces the decode-attention,
    paged-overhead and KV-store defaults. Everything is precomputed here; the per-step methods are a few
    multiply-adds."""

    def __init__(self, deployment: Deployment, block_size: int, paged: bool,
                 calibration: Calibration | None = None, step_overhead_s: float = STEP_OVERHEAD_S):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if step_overhead_s < 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {step_overhead_s}")
        model, gpu, tp = deployment.model, deployment.gpu, deployment.tp
        layers = model.num_layers
        flops = gpu.bf16_flops
        hbm = gpu.hbm_bytes_per_s
        linear_params, read_bytes = _param_split(model)
        kv_bytes = model.kv_bytes_per_token(tp)        # one token, all layers, one GPU
        self.deployment = deployment
        self.step_overhead_s = step_overhead_s
        # Linear layers: seconds per token (compute), per step (weights) and per token (activations).
        self._lin_s_per_token = 2 * linear_params / tp / (flops * LINEAR_FLOP_EFFICIENCY)
        self._lin_fixed_s = layers * LINEAR_FIXED_S
        self._weights_s = read_bytes / tp / (hbm * LINEAR_HBM_EFFICIENCY)
        self._act_s_per_token = (ACTIVATION_HIDDENS_PER_TOKEN * model.hidden_size * model.dtype_bytes
                                 * layers / (hbm * LINEAR_HBM_EFFICIENCY))
        # Prefill attention: seconds per query-key pair (causal halving included) and per step.
        attn_layers, full_layers, read_bytes_per_token = layers, layers, kv_bytes
        if model.layer_groups:          # hybrid: sliding/chunked layers are priced apart, Mamba has none
            attn_layers = sum(g.num_layers for g in model.layer_groups)      # a kernel launch each
            full = [g for g in model.layer_groups if g.kind in ("full", "mla")]
            full_layers = sum(g.num_layers for g in full)
            read_bytes_per_token = sum(g.bytes_per_token(tp, model.kv_bytes) for g in full)

        def s_per_pair(n_layers: int) -> float:     # (the 2023 expression, bit for bit)
            return 4 * n_layers * model.num_heads * model.head_dim / 2 / tp / (flops * PREFILL_ATTN_FLOP_EFFICIENCY)
        self._prefill_s_per_pair = s_per_pair(full_layers)
        self._prefill_fixed_s = attn_layers * PREFILL_ATTN_FIXED_S
        # Decode attention (paged factor folded in) and KV writes.
        if calibration is None:
            factor = default_paged_overhead(block_size) if paged else 1.0
            decode_fixed, decode_per_seq = DECODE_ATTN_FIXED_S, DECODE_ATTN_PER_SEQ_S
            decode_rate = hbm * DECODE_ATTN_HBM_EFFICIENCY
            store_fixed, store_rate = STORE_KV_FIXED_S, hbm * STORE_KV_HBM_EFFICIENCY
        else:
            factor = calibration.paged_overhead_at(block_size) if paged else 1.0
            decode_fixed, decode_per_seq = calibration.decode_attn_fixed_s, 0.0
            decode_rate = calibration.decode_attn_bytes_per_s
            store_fixed, store_rate = calibration.store_kv_fixed_s, calibration.store_kv_bytes_per_s
        self.paged_overhead = factor
        self._decode_fixed_s = factor * attn_layers * decode_fixed
        self._decode_s_per_seq = factor * attn_layers * decode_per_seq
        self._decode_s_per_token = factor * read_bytes_per_token / decode_rate
        # sliding / chunked layers (priced per sequence, `capped`); Mamba: its state read and written
        self.capped = CappedAttention([
            CappedGroup(g.kind, g.window or g.chunk, factor * g.bytes_per_token(tp, model.kv_bytes) / decode_rate,
                        s_per_pair(g.num_layers))
            for g in model.layer_groups if g.kind in ("sliding", "chunked")])
        if model.state_bytes_per_request(tp):
            self._decode_s_per_seq += 2 * model.state_bytes_per_request(tp) / (hbm * DECODE_ATTN_HBM_EFFICIENCY)
        self._store_fixed_s = attn_layers * store_fixed
        self._store_s_per_token = kv_bytes / store_rate
        # All-reduce: two per layer of tokens x hidden x dtype bytes (none without tensor parallelism).
        ring = 2 * (tp - 1) / tp
        self._ar_fixed_s = 2 * layers * ALL_REDUCE_LATENCY_S if tp > 1 else 0.0
        self._ar_s_per_token = (2 * layers * model.hidden_size * model.dtype_bytes * ring
                                / ALL_REDUCE_BUS_BYTES_PER_S)
        self._swap_s_per_token = kv_bytes / gpu.pcie_bytes_per_s
        self._swap_s_per_block = 2 * layers * SWAP_COPY_FIXED_S       # key and value copy of each layer

    def linear_time(self, tokens: int) -> float:
        """Seconds for all projection and MLP layers over `tokens` tokens: a fixed time plus
        max(compute on whole GEMM tiles, weight and activation traffic)."""
        if tokens <= 0:
            return 0.0
        tiled = -(-tokens // GEMM_TILE_TOKENS) * GEMM_TILE_TOKENS
        return self._lin_fixed_s + max(tiled * self._lin_s_per_token,
                                       self._weights_s + tokens * self._act_s_per_token)

    def prefill_attention_time(self, attn_pairs: int) -> float:
        """Seconds of prefill attention over `attn_pairs` query-key pairs (before causal halving)."""
        return self._prefill_fixed_s + attn_pairs * self._prefill_s_per_pair if attn_pairs > 0 else 0.0

    def decode_attention_time(self, seqs: int, context_tokens: int) -> float:
        """Seconds of decode attention for `seqs` sequences reading `context_tokens` KV tokens in all."""
        if seqs <= 0:
            return 0.0
        return (self._decode_fixed_s + seqs * self._decode_s_per_seq
                + context_tokens * self._decode_s_per_token)

    def store_kv_time(self, tokens: int) -> float:
        """Seconds to write the K and V of `tokens` new tokens into the cache."""
        return self._store_fixed_s + tokens * self._store_s_per_token if tokens > 0 else 0.0

    def all_reduce_time(self, tokens: int) -> float:
        """Seconds of the two all-reduces per layer over `tokens` tokens (0 for tp = 1)."""
        return self._ar_fixed_s + tokens * self._ar_s_per_token if tokens > 0 else 0.0

    def step_time(self, prefill_tokens: int, prefill_attn_tokens: int,
                  decode_seqs: int, decode_context_tokens: int) -> float:
        """Seconds for one engine step.

        prefill_tokens: new tokens computed by prefill (chunks) this step; prefill_attn_tokens: sum over
        prefilling sequences of chunk_len x context_len_after_chunk (query-key pairs, before the causal
        halving); decode_seqs: sequences producing one decode token; decode_context_tokens: sum of their
        context lengths (KV tokens read).
        """
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0 or prefill_attn_tokens < 0:
            return (self.step_overhead_s + self.linear_time(tokens)
                    + self.prefill_attention_time(prefill_attn_tokens)
                    + self.decode_attention_time(decode_seqs, decode_context_tokens)
                    + self.store_kv_time(tokens) + self.all_reduce_time(tokens))
        return self.timed_step(prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens)[0]

    def timed_step(self, prefill_tokens: int, prefill_attn_tokens: int,
                   decode_seqs: int, decode_context_tokens: int) -> tuple[float, bool]:
        """(`step_time`, `compute_bound`) of one step (arguments as `step_time`), from one pass: the
        simulator asks both every step. The helpers are inlined: bit for bit the same sum."""
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0 or prefill_attn_tokens < 0:
            return (self.step_time(prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens),
                    self.compute_bound(prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens))
        tiled = -(-tokens // GEMM_TILE_TOKENS) * GEMM_TILE_TOKENS
        gemm_compute, gemm_memory = tiled * self._lin_s_per_token, self._weights_s + tokens * self._act_s_per_token
        linear = self._lin_fixed_s + (gemm_compute if gemm_compute >= gemm_memory else gemm_memory)
        prefill = self._prefill_fixed_s + prefill_attn_tokens * self._prefill_s_per_pair if prefill_attn_tokens else 0.0
        decode = (self._decode_fixed_s + decode_seqs * self._decode_s_per_seq
                  + decode_context_tokens * self._decode_s_per_token) if decode_seqs > 0 else 0.0
        store = self._store_fixed_s + tokens * self._store_s_per_token
        seconds = (self.step_overhead_s + linear + prefill + decode + store
                   + (self._ar_fixed_s + tokens * self._ar_s_per_token))
        # FLOP-bound kernel time (GEMMs on the compute side of their roofline, prefill attention) against
        # HBM-bound time (GEMMs on the weight-reading side, decode attention, KV writes)
        compute = (gemm_compute if gemm_compute > gemm_memory else 0.0) + prefill
        memory = (gemm_memory if gemm_compute <= gemm_memory else 0.0) + decode + store
        return seconds, compute > memory

    def decode_step_times(self, seqs: int, first_context: int, steps: int,
                          growth: int | None = None, plus_s: float = 0.0) -> list[float]:
        """`step_time(0, 0, seqs, c)` (+ `plus_s`, e.g. an engine's CPU time) for c = first_context,
        first_context + growth, ... (`steps` of them: a steady decode phase; `growth` defaults to `seqs`,
        less when some of the sequences are padding: a static batch), bit for bit (the same operations
        in the same order)."""
        grow = seqs if growth is None else growth
        if seqs <= 0:
            empty = self.step_time(0, 0, seqs, first_context)
            return [empty + plus_s if plus_s else empty] * steps
        head = self.step_overhead_s + self.linear_time(seqs) + self.prefill_attention_time(0)
        attn, per_token = self._decode_fixed_s + seqs * self._decode_s_per_seq, self._decode_s_per_token
        store, reduce = self.store_kv_time(seqs), self.all_reduce_time(seqs)
        contexts = range(first_context, first_context + steps * grow, grow) if grow > 0 else [first_context] * steps
        if plus_s:
            return [head + (attn + c * per_token) + store + reduce + plus_s for c in contexts]
        return [head + (attn + c * per_token) + store + reduce for c in contexts]

    def compute_bound(self, prefill_tokens: int, prefill_attn_tokens: int,
                      decode_seqs: int, decode_context_tokens: int) -> bool:
        """Whether a step (arguments as `step_time`) spends more kernel time bound by FLOPs (GEMMs on
        the compute side of their roofline, prefill attention) than by HBM traffic (GEMMs on the
        weight-reading side, decode attention, KV writes)."""
        if prefill_tokens + decode_seqs <= 0:
            return False
        return self.timed_step(prefill_tokens, max(prefill_attn_tokens, 0), decode_seqs, decode_context_tokens)[1]

    def swap_time(self, num_tokens: int, num_blocks: int = 0) -> float:
        """Seconds to move `num_tokens` of KV (all layers) one way over PCIe in `num_blocks` contiguous
        pieces (vLLM v0: one per block; a contiguous sequence: one): the bytes over the link plus
        SWAP_COPY_FIXED_S per copy call, two calls (key, value) per layer per piece. Each of the tp GPUs
        moves its own 1/tp share over its own link at the same time, so the time is that of one GPU's."""
        return num_tokens * self._swap_s_per_token + num_blocks * self._swap_s_per_block


class ConstantCost:
    """Every step takes `step_s` seconds and a swap `swap_s_per_token` per token: for exact golden tests."""

    def __init__(self, step_s: float, swap_s_per_token: float = 0.0):
        if step_s <= 0:
            raise ValueError(f"step_s must be positive, got {step_s}")
        if swap_s_per_token < 0:
            raise ValueError(f"swap_s_per_token must be >= 0, got {swap_s_per_token}")
        self.step_s = step_s
        self.swap_s_per_token = swap_s_per_token

    def step_time(self, prefill_tokens: int, prefill_attn_tokens: int,
                  decode_seqs: int, decode_context_tokens: int) -> float:
        """`step_s`, whatever the batch."""
        return self.step_s

    def decode_step_times(self, seqs: int, first_context: int, steps: int,
                          growth: int | None = None, plus_s: float = 0.0) -> list[float]:
        """`steps` x `step_s` (+ `plus_s`)."""
        return [self.step_s + plus_s if plus_s else self.step_s] * steps

    def swap_time(self, num_tokens: int, num_blocks: int = 0) -> float:
        """`num_tokens` x `swap_s_per_token` seconds (no fixed cost per piece)."""
        return num_tokens * self.swap_s_per_token
