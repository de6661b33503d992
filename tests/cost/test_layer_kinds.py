"""Attention cost per layer kind (issue 23 item 5): sliding layers read min(context, W), chunked layers
the current chunk, MLA its latent, Mamba a fixed state per sequence; worked by hand on small numbers,
windows equal to single steps bit for bit, and the engine's fast-forward still exact on hybrid models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.cost.layer_kinds import CappedAttention, CappedGroup
from kvsim.cost.roofline import DECODE_ATTN_HBM_EFFICIENCY, CostModel, default_paged_overhead
from kvsim.engine.config import CacheConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.specs.layers import LayerGroup
from kvsim.trace.table import Trace


def test_reads_by_hand():
    sliding, chunked = CappedGroup("sliding", 4, 1.0, 1.0), CappedGroup("chunked", 4, 1.0, 1.0)
    assert [sliding.read(c) for c in range(1, 8)] == [1, 2, 3, 4, 4, 4, 4]
    assert [chunked.read(c) for c in range(1, 10)] == [1, 2, 3, 4, 1, 2, 3, 4, 1]


def test_step_time_by_hand():
    capped = CappedAttention([CappedGroup("sliding", 4, 2.0, 10.0), CappedGroup("chunked", 3, 1.0, 100.0)])
    # prefill: a 3-token chunk ending at context 10, and a 2-token chunk ending at 2
    #   sliding pairs 3 x 4 + 2 x 2 = 16 -> 160 s; chunked pairs 3 x 3 + 2 x 2 = 13 -> 1300 s
    # decodes: context 6 with 2 sequences, context 2 with 1
    #   sliding reads 4 x 2 + 2 x 1 = 10 -> 20 s; chunked reads 3 x 2 + 2 x 1 = 8 -> 8 s
    assert capped.time([(3, 10), (2, 2)], [(6, 2), (2, 1)]) == 160 + 20 + 1300 + 8
    assert capped.time([], []) == 0.0
    assert not CappedAttention([])


@settings(max_examples=60, deadline=None)
@given(contexts=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 3)), min_size=1, max_size=6),
       steps=st.integers(1, 30), w=st.integers(1, 12), c=st.integers(1, 12))
def test_window_times_equal_single_steps_bit_for_bit(contexts, steps, w, c):
    capped = CappedAttention([CappedGroup("sliding", w, 3.7e-9, 1.1e-12), CappedGroup("chunked", c, 1.3e-9, 2e-12)])
    window = capped.window_times(contexts, steps).tolist()
    single = [capped.time([], [(ctx + k, n) for ctx, n in contexts]) for k in range(steps)]
    assert window == single


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="kind must be sliding or chunked"):
        CappedGroup("full", 4, 1.0, 1.0)
    with pytest.raises(ValueError, match="size must be >= 1"):
        CappedGroup("sliding", 0, 1.0, 1.0)


def _dep(model, gpu="h100-80gb", tp=1):
    return Deployment(model, get_gpu(gpu), tp)


def test_one_full_group_costs_what_the_plain_model_costs():
    plain = get_model("llama-3-8b")
    grouped = replace(plain, layer_groups=(LayerGroup("full", 32, 8, 128),))
    a, b = CostModel(_dep(plain), 16, True), CostModel(_dep(grouped), 16, True)
    for args in [(512, 512 * 512, 0, 0), (0, 0, 64, 64 * 900), (100, 100 * 300, 30, 30 * 2000)]:
        assert a.step_time(*args) == b.step_time(*args)
    assert not b.capped


def test_gpt_oss_sliding_layers_are_priced_by_window():
    model = get_model("gpt-oss-120b")
    sliding = [g for g in model.layer_groups if g.kind == "sliding"]
    full = [g for g in model.layer_groups if g.kind == "full"]
    assert [g.window for g in sliding] == [128] and sum(g.num_layers for g in sliding + full) == 36
    gpu = get_gpu("h100-80gb")
    cost = CostModel(_dep(model), 16, True)
    factor, rate = default_paged_overhead(16), gpu.hbm_bytes_per_s * DECODE_ATTN_HBM_EFFICIENCY
    per_layer_token = 2 * 8 * 64 * 2                       # K and V, 8 KV heads x 64, bf16
    # full-context reads: the 18 full layers only
    assert cost._decode_s_per_token == pytest.approx(factor * 18 * per_layer_token / rate, rel=1e-12)
    (g,) = cost.capped.groups
    assert (g.kind, g.size) == ("sliding", 128)
    assert g.decode_s_per_token == pytest.approx(factor * 18 * per_layer_token / rate, rel=1e-12)
    # one sequence at 10,000 tokens: sliding layers read 128 tokens, not 10,000
    assert cost.capped.time([], [(10_000, 1)]) == pytest.approx(128 * g.decode_s_per_token, rel=1e-12)


def test_mamba_state_is_read_and_written_per_sequence():
    model = get_model("nemotron-h-8b") if _has("nemotron-h-8b") else None
    if model is None:
        pytest.skip("no Mamba preset named nemotron-h-8b")
    gpu = get_gpu("h100-80gb")
    cost = CostModel(_dep(model), 16, True)
    attn_layers = sum(g.num_layers for g in model.layer_groups)
    factor = default_paged_overhead(16)
    per_seq = factor * attn_layers * 1.0e-6 + 2 * model.state_bytes_per_request(1) / (
        gpu.hbm_bytes_per_s * DECODE_ATTN_HBM_EFFICIENCY)
    assert cost._decode_s_per_seq == pytest.approx(per_seq, rel=1e-12)
    assert model.state_bytes_per_request(1) > 0


def _has(name: str) -> bool:
    try:
        get_model(name)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("model", ["gpt-oss-20b", "llama-4-scout"])
def test_fast_forward_stays_exact_on_hybrid_models(model):
    rng = np.random.default_rng(3)
    num = 40
    trace = Trace.from_arrays(np.sort(rng.uniform(0, 4, num)), rng.integers(1, 300, num),
                              rng.integers(1, 400, num))
    spec = get_model(model).with_max_model_len(1024)
    if spec.layer_groups[0].kind == "chunked":       # small chunks so decodes cross chunk boundaries
        spec = replace(spec, layer_groups=tuple(replace(g, chunk=64) if g.chunk else g for g in spec.layer_groups))
    else:
        spec = replace(spec, layer_groups=tuple(replace(g, window=48) if g.window else g for g in spec.layer_groups))
    cfg = SimConfig(Deployment(spec, get_gpu("h200"), 8 if model == "llama-4-scout" else 1),
                    CacheConfig(num_blocks=200))
    a = simulate(trace, cfg, fast_forward=False)
    b = simulate(trace, cfg)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert a.summary["kv"].get("groups") == b.summary["kv"].get("groups")     # per-kind memory too
    assert len(b.steps) > 100
