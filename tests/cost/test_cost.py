"""The roofline cost model on a tiny model and GPU whose step times can be computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cost import roofline as cost
from kvsim.cost.roofline import ConstantCost, CostModel, default_paged_overhead
from kvsim.specs import Deployment, GpuSpec, ModelSpec, get_gpu, get_model

# 2 layers, 4 heads of 16: KV = 2 x 2 x 4 x 16 x 2 bytes = 512 bytes per token; 1e6 params = 2e6 bytes.
TINY = ModelSpec("tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                 dtype_bytes=2, max_seq_len=1024, num_params=1e6)
# 1 TFLOP/s, 1 GB/s HBM, 0.1 GB/s PCIe: weights take 2 ms to read, a token's linear layers 2 us.
TOY_GPU = GpuSpec("toy", memory_bytes=10**9, hbm_bytes_per_s=1e9, bf16_flops=1e12, pcie_bytes_per_s=1e8)
OVERHEAD_S = 1e-3


@pytest.fixture
def ideal(monkeypatch):
    """Every efficiency 1, every fixed time 0, no tiles, no activation traffic, all-reduce at 1 GB/s."""
    for name, value in {"LINEAR_FLOP_EFFICIENCY": 1.0, "LINEAR_HBM_EFFICIENCY": 1.0, "LINEAR_FIXED_S": 0.0,
                        "GEMM_TILE_TOKENS": 1, "ACTIVATION_HIDDENS_PER_TOKEN": 0,
                        "PREFILL_ATTN_FLOP_EFFICIENCY": 1.0, "PREFILL_ATTN_FIXED_S": 0.0,
                        "DECODE_ATTN_HBM_EFFICIENCY": 1.0, "DECODE_ATTN_FIXED_S": 0.0,
                        "DECODE_ATTN_PER_SEQ_S": 0.0, "STORE_KV_HBM_EFFICIENCY": 1.0,
                        "STORE_KV_FIXED_S": 0.0, "ALL_REDUCE_LATENCY_S": 0.0,
                        "ALL_REDUCE_BUS_BYTES_PER_S": 1e9}.items():
        monkeypatch.setattr(cost, name, value)


def tiny_cost(tp=1, paged=False, block_size=16, **kw) -> CostModel:
    return CostModel(Deployment(TINY, TOY_GPU, tp), block_size, paged, step_overhead_s=OVERHEAD_S, **kw)


def test_memory_bound_decode_step_by_hand(ideal):
    # 4 sequences, 400 KV tokens: weights 2e6 B / 1e9 = 2 ms (compute 4 x 2 us is less);
    # KV read 400 x 512 B = 204.8 us; KV write 4 x 512 B = 2.048 us; plus 1 ms overhead.
    assert tiny_cost().step_time(0, 0, 4, 400) == pytest.approx(1e-3 + 2e-3 + 204.8e-6 + 2.048e-6, rel=1e-12)


def test_compute_bound_prefill_step_by_hand(ideal):
    # 5000 tokens: 2 x 1e6 x 5000 FLOP / 1e12 = 10 ms (> 2 ms of weights); attention
    # 4 x 2 layers x 4 heads x 16 x 5000^2 / 2 = 6.4e9 FLOP = 6.4 ms; KV write 5000 x 512 B = 2.56 ms.
    assert tiny_cost().step_time(5000, 5000 * 5000, 0, 0) == pytest.approx(1e-3 + 10e-3 + 6.4e-3 + 2.56e-3,
                                                                            rel=1e-12)


def test_crossover_of_the_roofline(ideal):
    model = tiny_cost()
    assert model.linear_time(999) == pytest.approx(2e-3)          # memory bound below 1000 tokens
    assert model.linear_time(1500) == pytest.approx(3e-3)         # compute bound above


def test_default_fixed_times_tiles_and_activations(ideal, monkeypatch):
    monkeypatch.setattr(cost, "LINEAR_FIXED_S", 1e-5)
    monkeypatch.setattr(cost, "GEMM_TILE_TOKENS", 128)
    # 1001 tokens compute as 1024 (2.048 ms > 2 ms of weights), plus 2 layers x 10 us.
    assert tiny_cost().linear_time(1001) == pytest.approx(2e-5 + 2.048e-3)
    monkeypatch.setattr(cost, "ACTIVATION_HIDDENS_PER_TOKEN", 16)
    # 10 tokens: weights plus 10 x (16 x 64 x 2 B x 2 layers) of activations, plus 2 layers x 10 us.
    assert tiny_cost().linear_time(10) == pytest.approx(2e-5 + 2e-3 + 10 * 4096 / 1e9)


def test_tp2_halves_weight_traffic_and_kv_and_adds_all_reduce(ideal):
    one, two = tiny_cost(tp=1), tiny_cost(tp=2)
    assert two.linear_time(10) == pytest.approx(one.linear_time(10) / 2)
    assert two.decode_attention_time(4, 400) == pytest.approx(one.decode_attention_time(4, 400) / 2)
    assert one.all_reduce_time(10) == 0.0
    # 2 all-reduces x 2 layers x 10 tokens x 64 x 2 B, ring factor 2(2-1)/2 = 1, at 1 GB/s.
    assert two.all_reduce_time(10) == pytest.approx(2 * 2 * 10 * 64 * 2 / 1e9)


def test_tp2_halves_weight_traffic_with_default_constants():
    opt = get_model("opt-13b")
    one = CostModel(Deployment(opt, get_gpu("a100-40gb"), 1), 16, paged=True)
    two = CostModel(Deployment(opt, get_gpu("a100-40gb"), 2), 16, paged=True)
    fixed = opt.num_layers * cost.LINEAR_FIXED_S
    assert two.linear_time(1) - fixed == pytest.approx((one.linear_time(1) - fixed) / 2, rel=1e-3)


def test_paged_overhead_shape():
    f = default_paged_overhead
    assert f(1) > f(2) > f(4) > f(8) > f(16) >= f(32) >= f(128) > 1.0
    assert f(1) > 1.5 * f(16)                    # tiny blocks much slower
    assert 1.20 <= f(16) <= 1.26                 # the paper: 20-26 % slower than FasterTransformer
    assert f(16) - f(128) < 0.06                 # flat from 16 to 128
    paged, contiguous = tiny_cost(paged=True, block_size=16), tiny_cost(paged=False, block_size=16)
    assert contiguous.paged_overhead == 1.0
    assert paged.decode_attention_time(8, 4000) == pytest.approx(f(16) * contiguous.decode_attention_time(8, 4000))


def test_paged_overhead_only_touches_decode_attention():
    paged, contiguous = tiny_cost(paged=True, block_size=1), tiny_cost(paged=False)
    assert paged.step_time(300, 300 * 300, 0, 0) == contiguous.step_time(300, 300 * 300, 0, 0)
    assert paged.step_time(0, 0, 4, 400) > contiguous.step_time(0, 0, 4, 400)


steps = st.tuples(st.integers(0, 8192), st.integers(0, 2**24), st.integers(0, 512), st.integers(0, 2**20))


@settings(max_examples=300, deadline=None)
@given(base=steps, extra=steps, paged=st.booleans(), tp=st.sampled_from([1, 2, 4]))
def test_more_work_is_never_cheaper(base, extra, paged, tp):
    model = CostModel(Deployment(get_model("opt-66b"), get_gpu("a100-80gb"), tp), 16, paged)
    bigger = tuple(b + e for b, e in zip(base, extra))
    assert model.step_time(*bigger) >= model.step_time(*base) >= model.step_overhead_s


def test_empty_step_costs_the_overhead_only():
    assert tiny_cost().step_time(0, 0, 0, 0) == OVERHEAD_S


def test_swap_time_per_gpu_share_over_pcie():
    # 100 tokens x 512 B at 1e8 B/s; with tp = 2 each GPU moves its 256 B per token in parallel.
    assert tiny_cost().swap_time(100) == pytest.approx(5.12e-4)
    assert tiny_cost(tp=2).swap_time(100) == pytest.approx(2.56e-4)


def test_embeddings_are_not_linear_flops(ideal):
    """OPT-13B's tied 50272 x 5120 table is read once (as the LM head) but not multiplied per token:
    12.85e9 - 257,392,640 = 12,592,607,360 linear parameters, 2 FLOP each per token at the A100's
    312e12 FLOP/s (efficiency 1): 80.72 us per token (counting the table too would give 82.37 us).
    Both token counts are compute bound (4096 tokens: 0.33 s against 16.5 ms of weight reading)."""
    model = CostModel(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1), 16, paged=True)
    per_token = (model.linear_time(8192) - model.linear_time(4096)) / 4096
    assert per_token == pytest.approx(8.0721842e-5, rel=1e-7)


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        tiny_cost(block_size=0)
    with pytest.raises(ValueError, match="step_overhead_s must be >= 0"):
        CostModel(Deployment(TINY, TOY_GPU), 16, True, step_overhead_s=-1.0)


def test_constant_cost():
    c = ConstantCost(0.05, swap_s_per_token=1e-4)
    assert c.step_time(2048, 2048 * 2048, 0, 0) == c.step_time(0, 0, 1, 1) == 0.05
    assert c.swap_time(300) == pytest.approx(0.03)
    assert ConstantCost(0.01).swap_time(300) == 0.0
    with pytest.raises(ValueError, match="step_s must be positive"):
        ConstantCost(0.0)
    with pytest.raises(ValueError, match="swap_s_per_token must be >= 0"):
        ConstantCost(0.01, swap_s_per_token=-1.0)


def test_opt13b_sample_step_times_are_plausible():
    """A decode step of 32 x 500 tokens reads 25.7 GB of weights at 1.24 TB/s (21 ms) and 12.8 GB of KV
    at 1.48 TB/s x 1.23 paged (11 ms): 30-40 ms with fixed costs; a 2048-token prefill is compute bound
    (~53 TFLOP at ~220 TFLOP/s: 0.2-0.3 s)."""
    model = CostModel(Deployment(get_model("opt-13b"), get_gpu("a100-40gb")), 16, paged=True)
    assert 0.030 < model.step_time(0, 0, 32, 32 * 500) < 0.040
    assert 0.2 < model.step_time(2048, 2048 * 2048, 0, 0) < 0.3
    assert model.paged_overhead == pytest.approx(1.17 + 1 / 16)   # PAGED_OVERHEAD_FLOOR + BLOCK / 16


@pytest.fixture
def distinct(monkeypatch):
    """Every constant a different value away from 0 and 1, so each one's place in the formula shows."""
    for name, value in {"LINEAR_FLOP_EFFICIENCY": 0.5, "LINEAR_HBM_EFFICIENCY": 0.5, "LINEAR_FIXED_S": 1e-5,
                        "GEMM_TILE_TOKENS": 1, "ACTIVATION_HIDDENS_PER_TOKEN": 4,
                        "PREFILL_ATTN_FLOP_EFFICIENCY": 0.5, "PREFILL_ATTN_FIXED_S": 2e-5,
                        "DECODE_ATTN_HBM_EFFICIENCY": 0.5, "DECODE_ATTN_FIXED_S": 3e-5,
                        "DECODE_ATTN_PER_SEQ_S": 1e-6, "STORE_KV_HBM_EFFICIENCY": 0.5,
                        "STORE_KV_FIXED_S": 4e-6, "ALL_REDUCE_LATENCY_S": 5e-6,
                        "ALL_REDUCE_BUS_BYTES_PER_S": 1e9, "PAGED_OVERHEAD_FLOOR": 1.0,
                        "PAGED_OVERHEAD_BLOCK": 8.0}.items():
        monkeypatch.setattr(cost, name, value)


def test_mixed_step_by_hand_with_every_term(distinct):
    """tp = 2, paged block 16 (overhead 1 + 8/16 = 1.5); 100 prefill tokens (10,000 pairs) and 4 decodes
    reading 400 tokens: 104 tokens; KV 256 B per token per GPU.
    linear: 2 layers x 10 us + max(104 x 2 x 1e6 / 2 / 5e11 = 0.208 ms, 2e6 B / 2 / 5e8 = 2 ms
            + 104 x 4 x 64 x 2 B x 2 layers / 5e8 = 0.212992 ms) = 2.232992 ms;
    prefill attention: 2 x 20 us + 10,000 x (4 x 2 x 4 x 16 / 2 / 2 = 128 FLOP) / 5e11 = 42.56 us;
    decode attention: 1.5 x (2 x 30 us + 4 x 2 x 1 us + 400 x 256 B / 5e8) = 409.2 us;
    KV store: 2 x 4 us + 104 x 256 B / 5e8 = 61.248 us;
    all-reduce: 2 x 2 layers x 5 us + 104 x 2 x 2 x 64 x 2 B x ring 1 / 1e9 = 73.248 us;
    plus the 1 ms overhead: 3.819248 ms."""
    model = tiny_cost(tp=2, paged=True, block_size=16)
    assert model.paged_overhead == 1.5
    assert model.linear_time(104) == pytest.approx(2.232992e-3, rel=1e-12)
    assert model.prefill_attention_time(10_000) == pytest.approx(4.256e-5, rel=1e-12)
    assert model.decode_attention_time(4, 400) == pytest.approx(4.092e-4, rel=1e-12)
    assert model.store_kv_time(104) == pytest.approx(6.1248e-5, rel=1e-12)
    assert model.all_reduce_time(104) == pytest.approx(7.3248e-5, rel=1e-12)
    assert model.step_time(100, 10_000, 4, 400) == pytest.approx(3.819248e-3, rel=1e-12)


def test_single_units_and_zero_work(distinct):
    """One pair, one sequence, one token each cost their fixed time plus one unit; nothing costs 0."""
    model = tiny_cost(tp=2, paged=True, block_size=16)
    assert model.prefill_attention_time(1) == pytest.approx(4e-5 + 2.56e-10, rel=1e-12)
    assert model.decode_attention_time(1, 10) == pytest.approx(1.5 * (6e-5 + 2e-6 + 10 * 5.12e-7), rel=1e-12)
    assert model.all_reduce_time(1) == pytest.approx(2e-5 + 5.12e-7, rel=1e-12)
    assert (model.prefill_attention_time(0), model.decode_attention_time(0, 0), model.store_kv_time(0),
            model.all_reduce_time(0), model.linear_time(0)) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert CostModel(Deployment(TINY, TOY_GPU), 16, False, step_overhead_s=0.0).step_time(0, 0, 0, 0) == 0.0
    assert model.deployment == Deployment(TINY, TOY_GPU, 2)


def test_untied_embeddings_are_neither_computed_nor_read_twice(ideal):
    """Llama-2-7B's separate 32000 x 4096 input and output tables (131,072,000 each): linear FLOPs leave
    both out, 2 x (6.74e9 - 262,144,000) / 312e12 = 41.52 us per token; a step reads every weight but
    the input table (only gathered): (13.48e9 - 262,144,000) B / 2.039e12 B/s = 6.4825 ms."""
    model = CostModel(Deployment(get_model("llama-2-7b"), get_gpu("a100-80gb"), 1), 16, paged=True)
    assert (model.linear_time(8192) - model.linear_time(4096)) / 4096 == pytest.approx(4.1524718e-5, rel=1e-7)
    assert model.linear_time(1) == pytest.approx(6.4825189e-3, rel=1e-7)


def test_tied_embeddings_are_read_once_as_the_lm_head(ideal):
    """OPT-13B's tied table is read as the LM head: a 1-token step reads every weight, 12.85e9 x 2 B =
    25.7e9 B at the A100-40GB's 1.555e12 B/s = 16.527331 ms (compute: 80.7 us, less)."""
    model = CostModel(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1), 16, paged=True)
    assert model.linear_time(1) == pytest.approx(25.7e9 / 1.555e12, rel=1e-12)


def test_no_all_reduce_and_one_token_kv_write_without_tensor_parallelism(distinct):
    """tp = 1 has no all-reduce at all (not even the 5 us latency); one token's KV write is the fixed
    2 layers x 4 us plus 512 B / 5e8 B/s = 1.024 us."""
    model = tiny_cost(tp=1)
    assert model.all_reduce_time(10) == 0.0
    assert model.store_kv_time(1) == pytest.approx(8e-6 + 1.024e-6, rel=1e-12)


def test_decode_step_times_by_hand_and_equal_to_step_time(distinct):
    """tp = 2, paged block 16 (overhead 1.5), 4 sequences from 400 context tokens. First step:
    overhead 1 ms; linear 2 x 10 us + max(4 x 2 us, 2 ms + 4 x 2.048 us) = 2.028192 ms;
    decode attention 1.5 x (60 us + 4 x 2 x 1 us + 400 x 0.512 us) = 409.2 us; KV write
    8 us + 4 x 0.512 us = 10.048 us; all-reduce 20 us + 4 x 0.512 us = 22.048 us: 3.469488 ms.
    Each later step reads 4 more tokens: 1.5 x 4 x 0.512 us = 3.072 us more."""
    model = tiny_cost(tp=2, paged=True, block_size=16)
    times = model.decode_step_times(4, 400, 3)
    assert times == pytest.approx([3.469488e-3, 3.47256e-3, 3.475632e-3], rel=1e-12)
    assert times == [model.step_time(0, 0, 4, c) for c in (400, 404, 408)]     # bit for bit
    assert model.decode_step_times(0, 0, 2) == [OVERHEAD_S, OVERHEAD_S]      # nothing to decode
    assert ConstantCost(0.05).decode_step_times(4, 400, 3) == [0.05, 0.05, 0.05]


@pytest.mark.parametrize("step, expected", [
    ((0, 0, 0, 0), False),             # no work
    ((1500, 0, 0, 0), True),           # GEMMs 3 ms of compute > 2 ms of weights + 0.768 ms KV write
    ((999, 0, 0, 0), False),           # GEMMs read 2 ms of weights > 1.998 ms of compute
    ((0, 0, 4, 400), False),           # decode: weights and KV reads
    ((500, 500 * 20_000, 0, 0), True),   # attention 10^7 pairs x 0.256 ns = 2.56 ms > 2 + 0.256 ms
    ((500, 500 * 16_000, 0, 0), False),  # 8 x 10^6 pairs: 2.048 ms < 2.256 ms
])
def test_compute_bound_by_hand(ideal, step, expected):
    """Ideal tiny model, tp 1: GEMM compute 2 us per token, weights 2 ms a step, prefill attention
    256 FLOP per pair at 1e12 FLOP/s, KV write 512 B per token at 1e9 B/s."""
    assert tiny_cost().compute_bound(*step) is expected


def test_compute_bound_counts_decode_attention_as_memory(ideal):
    """1500 tokens of GEMMs on the compute side (3 ms) against the KV write (0.768 ms) plus decode
    attention: 4 sequences reading 5,000,000 tokens x 512 B = 2.56 ms tip it to memory (3.328 ms)."""
    model = tiny_cost()
    assert model.compute_bound(1496, 0, 4, 100) is True
    assert model.compute_bound(1496, 0, 4, 5_000_000) is False


def test_decode_step_times_of_one_sequence_grow_one_token_a_step(ideal):
    """1 sequence from 400 tokens (ideal tiny model): 1 ms + 2 ms of weights + 400 x 512 B / 1e9 B/s =
    204.8 us of KV read + 0.512 us of KV write; the next step reads one token (0.512 us) more."""
    assert tiny_cost().decode_step_times(1, 400, 2) == pytest.approx(
        [3.205312e-3, 3.205824e-3], rel=1e-12)


@pytest.mark.parametrize("step, expected", [
    ((998, 0, 4, 4), True),            # 1002 tokens with the decodes: GEMMs 2.004 ms of compute
    ((1200, 0, 0, 0), True),           # GEMMs 2.4 ms of compute > 0.6144 ms of KV write (weights not counted)
    ((1, 10**7, 0, 0), True),          # a 1-token chunk over 10^7 pairs: 2.56 ms of attention
])
def test_compute_bound_edges(ideal, step, expected):
    assert tiny_cost().compute_bound(*step) is expected


def test_compute_bound_with_gemm_tiles_and_activation_traffic(ideal, monkeypatch):
    """900 tokens compute as 1024 with 128-token tiles: 2.048 ms > 2 ms of weights. With 16 hiddens of
    activations per token (4.096 us) the GEMMs are memory bound: 2 + 2.048 ms + 0.256 ms of KV write
    = 4.304 ms against 2.56 ms of attention over 10^7 pairs."""
    monkeypatch.setattr(cost, "GEMM_TILE_TOKENS", 128)
    assert tiny_cost().compute_bound(900, 0, 0, 0) is True
    monkeypatch.setattr(cost, "GEMM_TILE_TOKENS", 1)
    monkeypatch.setattr(cost, "ACTIVATION_HIDDENS_PER_TOKEN", 16)
    assert tiny_cost().compute_bound(500, 10**7, 0, 0) is False


def test_compute_bound_ties_count_as_memory_bound(ideal):
    """Binary-exact rates: 2^20 params (2^21 B), 2^40 FLOP/s, 2^30 B/s: GEMMs 2^-19 s per token of
    compute against 2^-9 s of weights, equal at 1024 tokens, where they count as memory bound; KV write
    2^-21 s per token (512 B), prefill attention 2^-32 s per pair (256 FLOP).
    1024 tokens: memory 2^-9 + 2^-11 = 5 x 2^-11 s. 2^22 pairs (2^-10 s) are less; 5 x 2^21 pairs are
    exactly as much, and a tie is not compute bound."""
    model = ModelSpec("pow2", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                      dtype_bytes=2, max_seq_len=1024, num_params=2.0**20)
    gpu = GpuSpec("pow2", memory_bytes=2**34, hbm_bytes_per_s=2.0**30, bf16_flops=2.0**40,
                  pcie_bytes_per_s=2.0**30)
    c = CostModel(Deployment(model, gpu), 16, paged=False)
    assert c.linear_time(1024) == 2.0**-9
    assert c.compute_bound(1024, 2**22, 0, 0) is False
    assert c.compute_bound(1024, 5 * 2**21, 0, 0) is False
    assert c.compute_bound(1024, 5 * 2**21 + 1, 0, 0) is True


def test_step_time_rounds_gemm_tokens_to_tiles_and_counts_a_single_decode(ideal, monkeypatch):
    """One decoding sequence over 400 tokens: 1 ms + 2 ms of weights + 204.8 us of KV read + 0.512 us
    of KV write. 900 prefill tokens with 128-token tiles compute as 1024: 2.048 ms (> 2 ms of weights),
    plus 1 ms and 900 x 0.512 us = 460.8 us of KV write."""
    assert tiny_cost().step_time(0, 0, 1, 400) == pytest.approx(3.205312e-3, rel=1e-12)
    monkeypatch.setattr(cost, "GEMM_TILE_TOKENS", 128)
    assert tiny_cost().step_time(900, 0, 0, 0) == pytest.approx(3.5088e-3, rel=1e-12)


@pytest.mark.parametrize("fixed, step, expected", [
    # 2 layers x 2 ms of fixed prefill-attention time, counted only when a step attends to >= 1 pair:
    ({"PREFILL_ATTN_FIXED_S": 2e-3}, (999, 0, 0, 0), False),  # GEMMs 1.998 < 2 ms weights + 0.511488 ms
    ({"PREFILL_ATTN_FIXED_S": 2e-3}, (1, 1, 0, 0), True),     # 4 ms + 0.256 ns > 2 ms + 0.512 us
    # decode attention: 2 layers x (2 ms fixed + 1 ms per sequence), only when a step decodes:
    ({"DECODE_ATTN_FIXED_S": 2e-3, "DECODE_ATTN_PER_SEQ_S": 1e-3}, (1500, 0, 0, 0), True),   # 3 > 0.768 ms
    ({"DECODE_ATTN_FIXED_S": 2e-3, "DECODE_ATTN_PER_SEQ_S": 1e-3}, (1500, 0, 1, 0), False),
])
def test_compute_bound_fixed_attention_times_only_with_attention(ideal, monkeypatch, fixed, step, expected):
    """Ideal tiny model with large fixed attention times. The last case: 1501 tokens, GEMMs 3.002 ms of
    compute against 0.768512 ms of KV write plus one decode's 2 x (2 + 1) = 6 ms of attention: memory."""
    for name, value in fixed.items():
        monkeypatch.setattr(cost, name, value)
    assert tiny_cost().compute_bound(*step) is expected


@settings(max_examples=300, deadline=None)
@given(prefill=st.integers(0, 5000), pairs=st.integers(0, 10**8), seqs=st.integers(0, 512),
       context=st.integers(0, 10**6), tp=st.sampled_from([1, 2, 8]), paged=st.booleans())
def test_timed_step_is_the_sum_of_the_terms_bit_for_bit_and_the_bound(prefill, pairs, seqs, context, tp, paged):
    """`timed_step` (the simulator's one call a step) is, bit for bit, the overhead plus each term's own
    helper, added in the order `step_time` documents, and the same flag `compute_bound` gives."""
    model = CostModel(Deployment(get_model("opt-13b"), get_gpu("a100-80gb"), tp), 16, paged)
    tokens = prefill + seqs
    by_terms = (model.step_overhead_s + model.linear_time(tokens) + model.prefill_attention_time(pairs)
                + model.decode_attention_time(seqs, context) + model.store_kv_time(tokens)
                + model.all_reduce_time(tokens))
    seconds, bound = model.timed_step(prefill, pairs, seqs, context)
    assert seconds == by_terms and model.step_time(prefill, pairs, seqs, context) == by_terms
    assert bound is model.compute_bound(prefill, pairs, seqs, context)
    if tokens == 0:
        assert bound is False


@settings(max_examples=200, deadline=None)
@given(seqs=st.integers(0, 300), context=st.integers(0, 10**6), steps=st.integers(0, 40),
       growth=st.one_of(st.none(), st.integers(0, 300)), plus=st.floats(0.0, 0.05))
def test_decode_step_times_plus_adds_to_each_step_as_the_stepper_did(seqs, context, steps, growth, plus):
    """`plus_s` (the engine profile's CPU time a step) is added to each step last: bit for bit the sum
    the stepper made when it added it to the kernels' times itself."""
    model = CostModel(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1), 16, True)
    for cost in (model, ConstantCost(0.01)):
        assert cost.decode_step_times(seqs, context, steps, growth, plus) == \
            [d + plus for d in cost.decode_step_times(seqs, context, steps, growth)]
