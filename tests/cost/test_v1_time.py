"""The vllm-v1 time model (kvsim/cost/v1_time.py, kvsim/cost/collectives.py): decode steps worked by hand
under CUDA graphs and eagerly, the all-reduce term by TP against the measured points it is read from,
vLLM's capture sizes, experts touched, and async scheduling's overlap."""

from __future__ import annotations

import pytest

from kvsim.cost.collectives import all_reduce_s
from kvsim.cost.v1_time import V1CostModel, capture_sizes, experts_touched
from kvsim.specs import Deployment, GpuSpec, ModelSpec

US = 1e-6
# 2 layers, hidden 64, 4 heads of 16 (MHA), bf16, 1e8 parameters (no preset: every one a linear weight)
TOY = ModelSpec("toy-v1", 2, 64, 4, 4, 16, 2, 4096, 1e8)
TINY = ModelSpec("tiny-v1", 2, 64, 4, 4, 16, 2, 4096, 1e6)
GPU = GpuSpec("toy-gpu", 10**10, 1e12, 1e15, 1e10, 0.0, "nvlink", 1e11)


def model(spec=TOY, tp=1, **kw) -> V1CostModel:
    return V1CostModel(Deployment(spec, GPU, tp), 16, max_num_seqs=256, max_batched_tokens=8192, **kw)


def test_capture_sizes_are_vllms_defaults():
    sizes = capture_sizes(256, 8192)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (480, 496, 512) and len(sizes) == 3 + 31 + 17
    assert capture_sizes(128, 2048)[-1] == 256            # 2 x max_num_seqs
    assert capture_sizes(1024, 200)[-1] == 200            # capped by max_num_batched_tokens (8 to 248 by 8)
    m = model()
    assert m.padded(3) == (4, True) and m.padded(9) == (16, True) and m.padded(513) == (513, False)
    assert model(enforce_eager=True).padded(3) == (3, False)


def test_decode_step_under_cuda_graphs_by_hand():
    # batch 3 padded to 4, 300 KV tokens read; per term, seconds:
    linear = 2 * (15 + 3 * 3) * US + 2e8 / (1e12 * 0.8) + 4 * 16 * 64 * 2 * 2 / (1e12 * 0.8)
    # (5 linear kernels + rotary + 2 norms at 3 us per layer; weights; activations of 4 padded tokens)
    attention = 2 * 12 * US + 300 * 512 / (1e12 * 0.8)     # one call per layer; 512 KV bytes per token
    store = 2 * 3 * US + 3 * 512 / (1e12 * 0.5)
    assert model().step_time(0, 0, 3, 300) == pytest.approx(linear + attention + store, rel=1e-12)
    assert linear + attention + store == pytest.approx(328.2e-6, rel=1e-4)


def test_eager_steps_are_bound_by_the_hosts_kernel_launches():
    # the tiny model's kernels take 80.7 us; launching 2 layers eagerly takes 2 x 46.875 us on the host
    graph = model(TINY).step_time(0, 0, 3, 300)
    kernels = 2 * 24 * US + 2e6 / 0.8e12 + 4 * 16 * 64 * 4 / 0.8e12 + 2 * 12 * US + 300 * 512 / 0.8e12 \
        + 2 * 3 * US + 3 * 512 / 0.5e12
    assert graph == pytest.approx(kernels, rel=1e-12) and graph == pytest.approx(80.7e-6, rel=1e-3)
    eager = model(TINY, enforce_eager=True).step_time(0, 0, 3, 300)
    assert eager == pytest.approx(2 * 1.5e-3 / 32, rel=1e-12)
    # a big model hides the launches: eager costs what the (unpadded) kernels cost
    big_graph, big_eager = model().step_time(0, 0, 3, 300), model(enforce_eager=True).step_time(0, 0, 3, 300)
    assert big_eager == pytest.approx(big_graph - 4 * 16 * 64 * 2 * 2 / 0.8e12 + 3 * 16 * 64 * 2 * 2 / 0.8e12)


def test_async_scheduling_overlaps_cpu_work():
    gpu = model().step_time(0, 0, 3, 300)
    assert model(cpu_step_s=1e-3).step_time(0, 0, 3, 300) == pytest.approx(1e-3)           # CPU longer
    assert model(cpu_step_s=1e-4, cpu_seq_s=1e-5).step_time(0, 0, 3, 300) == pytest.approx(gpu)  # hidden
    # --no-async-scheduling: the CPU work (1e-4 + 3 x 1e-5 s) comes before the GPU's, not beside it
    sync = model(cpu_step_s=1e-4, cpu_seq_s=1e-5, overlap_cpu=False).step_time(0, 0, 3, 300)
    assert sync == pytest.approx(gpu + 1.3e-4, rel=1e-12)


def test_all_reduce_by_tp_against_the_measured_points():
    h100 = dict(link="nvlink", link_bytes_per_s=450e9, pcie_bytes_per_s=50e9)
    mib = 1024 * 1024
    # vLLM custom one-shot all-reduce inside CUDA graphs (engine-evidence/collectives.csv)
    for tp, size, measured in [(2, 0.5, 7), (4, 0.5, 10), (4, 1, 14), (4, 2, 23), (4, 4, 38), (6, 0.5, 13)]:
        got = all_reduce_s(size * mib, tp, graph=True, **h100) / US
        assert got == pytest.approx(measured, rel=0.15), (tp, size)
    # by hand: 5.5 us + (tp - 1) x bytes / (0.8 x 450 GB/s)
    assert all_reduce_s(mib, 2, graph=True, **h100) == pytest.approx(5.5e-6 + mib / 360e9)
    assert all_reduce_s(mib, 8, graph=True, **h100) == pytest.approx(5.5e-6 + 7 * mib / 360e9)
    assert all_reduce_s(mib, 2, graph=False, **h100) == pytest.approx(9e-6 + mib / 360e9)
    assert all_reduce_s(16 * mib, 4, graph=True, **h100) == pytest.approx(20e-6 + 1.5 * 16 * mib / 360e9)  # NCCL
    assert all_reduce_s(mib, 2, "pcie", 0.0, 25e9, True) == pytest.approx(40e-6 + mib / 25e9)
    assert all_reduce_s(mib, 1, graph=True, **h100) == 0.0
    # MI300X: one 64 GB/s link per peer, read in parallel: the same time at TP 2 and TP 8
    for tp in (2, 8):
        assert all_reduce_s(mib, tp, "xgmi", 448e9, 50e9, True) == pytest.approx(5.5e-6 + mib / (64e9 * 0.8))


def test_all_reduce_term_of_a_step():
    # tp 2: 2 calls per layer x 2 layers of 4 padded tokens x 64 x 2 bytes = 512 bytes each
    ar = model(tp=2).all_reduce_time(3)
    assert ar == pytest.approx(4 * (5.5e-6 + 512 / (0.8 * 1e11)), rel=1e-12)
    assert model().all_reduce_time(3) == 0.0


def test_moe_reads_the_experts_its_tokens_touch():
    assert experts_touched(1, 8, 2) == pytest.approx(2)
    assert experts_touched(8, 8, 2) == pytest.approx(8 * (1 - 0.75 ** 8))
    assert experts_touched(10**4, 8, 2) == pytest.approx(8)
    # 8 experts of 1e8 params, top-2, 0.5e8 shared: 8.5e8 total, 2.5e8 active
    moe = ModelSpec("moe-v1", 2, 64, 4, 4, 16, 2, 4096, 8.5e8, active_params=2.5e8, num_experts=8,
                    experts_per_token=2)
    m = model(moe)
    assert m.weights_time(1) == pytest.approx((0.5e8 + 2e8) * 2 / 0.8e12)
    assert m.weights_time(10**4) == pytest.approx(8.5e8 * 2 / 0.8e12)


def test_fp8_weights_use_the_fp8_rate():
    gpu = GpuSpec("fp8-gpu", 10**10, 1e12, 1e15, 1e10, 2e15, "nvlink", 1e11)
    bf16 = V1CostModel(Deployment(TOY, gpu), 16)
    fp8 = V1CostModel(Deployment(ModelSpec("toy-fp8", 2, 64, 4, 4, 16, 2, 4096, 1e8, weight_bytes_per_param=1),
                                 gpu), 16)
    # 2 x 1e8 FLOPs per token at 0.70 of 1e15 against 0.70 x 0.709 / 0.803 of 2e15
    assert fp8._lin_s_per_token / bf16._lin_s_per_token == pytest.approx(0.803 / 0.709 / 2)
    assert fp8.weights_time(1) == pytest.approx(bf16.weights_time(1) / 2)
