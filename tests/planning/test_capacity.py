"""Static capacity (hand-computed figures), run flags, flat rows and trace rescaling."""

import numpy as np
import pytest

import kvsim
from kvsim.alloc.contiguous.allocator import reservation
from kvsim.planning.capacity import reserved_slots, whole_extents
from kvsim.planning.runs import config_row, make_config, summary_row


def _by_alloc(df):
    return df.set_index("allocator")


def test_static_opt13b_12gib_figures():
    # 12 GiB / 800 KiB per token = 15,728 slots; 983 blocks of 16; a 2048-token request takes 128 blocks
    df = _by_alloc(kvsim.static_capacity(model="opt-13b", gpu="a100-40gb", kv_gib=12, lengths=None))
    assert df.loc["paged", "capacity_tokens"] == 15728 and df.loc["paged", "num_blocks"] == 983
    assert df.loc["paged", "max_concurrency_at_max_len"] == pytest.approx(983 / 128)    # vLLM's 7.68x
    # buddy arenas 8192 + 4096 + 2048 + ...: 4 + 2 + 1 whole 2048-slot extents
    for name in ("contiguous-max", "contiguous-pow2", "contiguous-oracle"):
        assert df.loc[name, "capacity_tokens"] == 15728 and df.loc[name, "max_concurrency_at_max_len"] == 7
    assert "max_concurrency" not in df.columns


def test_static_block_size_and_max_len():
    df = _by_alloc(kvsim.static_capacity(model="opt-13b", kv_gib=12, block_size=32, max_model_len=1024,
                                         lengths=None))
    assert df.loc["paged", "num_blocks"] == 491 and df.loc["paged", "capacity_tokens"] == 491 * 32
    assert df.loc["paged", "max_concurrency_at_max_len"] == pytest.approx(491 / 32)
    assert df.loc["contiguous-max", "max_concurrency_at_max_len"] == 8 + 4 + 2 + 1


def test_whole_extents():
    assert whole_extents(15728, 2048, "buddy") == 7
    assert whole_extents(15728, 1500, "buddy") == 7          # rounded up to 2048
    assert whole_extents(15728, 1500, "first-fit") == 10
    assert whole_extents(15728, 128, "buddy") == 64 + 32 + 16 + 8 + 2


def test_reserved_slots_matches_the_allocator_policy():
    rng = np.random.default_rng(3)
    p = rng.integers(1, 1000, 500)
    final = p + rng.integers(0, 1500, 500)
    for policy in ("max", "pow2", "oracle"):
        want = [reservation(policy, int(a), int(b), 2048) for a, b in zip(p, final)]
        assert reserved_slots(policy, p, final, 2048).tolist() == want


def test_mean_slots_and_fill_on_a_tiny_trace():
    # prompts 10 and 100, outputs 7 and 29: peaks (P + M - 1) of 16 and 128 slots
    tr = kvsim.Trace.from_arrays([0.0, 1.0], [10, 100], [7, 29])
    df = _by_alloc(kvsim.static_capacity(model="opt-13b", kv_gib=12, lengths=tr, placement="first-fit"))
    assert df.loc["paged", "mean_slots_per_request"] == (16 + 128) / 2
    assert df.loc["contiguous-oracle", "mean_slots_per_request"] == (16 + 128) / 2
    assert df.loc["contiguous-pow2", "mean_slots_per_request"] == ((10 + 8) + (100 + 32)) / 2
    assert df.loc["contiguous-max", "mean_slots_per_request"] == 2048
    buddy = _by_alloc(kvsim.static_capacity(model="opt-13b", kv_gib=12, lengths=tr))
    assert buddy.loc["contiguous-pow2", "mean_slots_per_request"] == (32 + 256) / 2


def test_fill_concurrency_with_equal_requests():
    # every request peaks at 128 slots: 983 // 8 blocks, 15728 // 128 first fit, 122 buddy, 7 at max
    tr = kvsim.Trace.from_arrays(np.arange(300.0), [100] * 300, [29] * 300)
    ff = _by_alloc(kvsim.static_capacity(model="opt-13b", kv_gib=12, lengths=tr, placement="first-fit",
                                         trials=3))
    assert ff.loc["paged", "max_concurrency"] == 983 // 8
    assert ff.loc["contiguous-oracle", "max_concurrency"] == 15728 // 128
    assert ff.loc["contiguous-max", "max_concurrency"] == 7
    assert ff.loc["paged", "ratio_to_max"] == pytest.approx(122 / 7)
    bd = _by_alloc(kvsim.static_capacity(model="opt-13b", kv_gib=12, lengths=tr, trials=3))
    assert bd.loc["contiguous-oracle", "max_concurrency"] == 64 + 32 + 16 + 8 + 2


def test_static_preset_orders_the_allocators():
    df = _by_alloc(kvsim.static_capacity(model="opt-13b", kv_gib=12, lengths="alpaca", trials=10))
    c = df.max_concurrency
    assert c["paged"] > c["contiguous-oracle"] > c["contiguous-pow2"] > c["contiguous-max"] == 7


def test_make_config_flags():
    cfg = make_config(model="llama-2-7b", gpu="h100-80gb", tp="2", block_size="32", prefix_caching="true",
                      **{"max-num-seqs": 64}, kv_gib="none")
    assert cfg.deployment.model.name == "llama-2-7b" and cfg.deployment.tp == 2
    assert cfg.cache.block_size == 32 and cfg.cache.prefix_caching is True and cfg.cache.kv_gib is None
    assert cfg.scheduler.max_num_seqs == 64
    again = make_config(cfg, allocator="contiguous")
    assert again.deployment == cfg.deployment and again.cache.allocator == "contiguous"
    with pytest.raises(ValueError, match="unknown run flag 'blocksize'"):
        make_config(blocksize=8)
    with pytest.raises(ValueError, match="run flag block_size: 'x' is not a int"):
        make_config(block_size="x")
    with pytest.raises(ValueError, match="block size must be >= 1"):
        make_config(block_size=0)
    vllm = make_config(**{"tensor-parallel-size": 2, "max_num_batched_tokens": 4096}, model="llama-2-7b")
    assert vllm.deployment.tp == 2 and vllm.scheduler.max_batched_tokens == 4096
    short = make_config(model="llama-3-8b", max_model_len="2048", kv_cache_dtype="fp8")
    assert short.deployment.model.max_seq_len == 2048
    assert short.deployment.model.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 1        # fp8: 1 byte
    kept = make_config(short, tp=2)                   # a changed TP keeps the model as configured
    assert kept.deployment.model == short.deployment.model and kept.deployment.tp == 2
    row = config_row(cfg)
    assert row["model"] == "llama-2-7b" and row["block_size"] == 32 and row["max_num_seqs"] == 64


def test_summary_row_flattens():
    row = summary_row({"ttft_s": {"p99": 2.0}, "kv": {"mean_fraction": {"free": 0.5}}, "preemptions": 3})
    assert row == {"ttft_s_p99": 2.0, "kv_mean_fraction_free": 0.5, "preemptions": 3}


def test_simulate_api_takes_a_path_and_flags():
    r = kvsim.simulate("traces/tiny.jsonl", model="opt-13b", kv_gib=12)
    assert r.summary["kv"]["capacity_tokens"] == 15728
    assert r.summary["requests_finished"] == r.summary["requests_total"] > 0


def test_rescale_trace():
    t = kvsim.Trace.from_arrays([0.0, 2.0, 4.0], [5, 6, 7], [1, 2, 3], ids=["a", "b", "c"])
    assert kvsim.rescale_trace(t, time_scale=0.5).arrival_s.tolist() == [0.0, 1.0, 2.0]
    fast = kvsim.rescale_trace(t, rate_rps=3.0)             # 3 requests over 1 s
    assert fast.arrival_s.tolist() == [0.0, 0.5, 1.0] and fast.ids == ["a", "b", "c"]
    assert fast.prompt_tokens.tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="exactly one"):
        kvsim.rescale_trace(t)
    with pytest.raises(ValueError, match="time scale must be"):
        kvsim.rescale_trace(t, time_scale=0)
    with pytest.raises(ValueError, match="no arrival times to rescale"):
        kvsim.rescale_trace(kvsim.Trace.from_arrays([0.0, 0.0], [1, 1], [1, 1]), rate_rps=2)


def test_lazy_api_names():
    for name in kvsim.__all__:
        assert getattr(kvsim, name) is not None
    with pytest.raises(AttributeError):
        kvsim.no_such_name


def test_api_docstring_examples_run():
    import doctest
    import importlib

    for name in ("kvsim", "kvsim.planning.runs", "kvsim.planning.sweep.runner", "kvsim.planning.capacity",
                 "kvsim.planning.rate.search", "kvsim.trace.table"):
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, name
