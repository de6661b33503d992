"""Paged kernel families (kvsim/cost/kernels.py): the block sizes each runs (read from vLLM's source), their
cost curves, which profile runs which, and the tuner's use of them: default candidates, warnings for
sizes a kernel cannot run, block tables counted as the engine builds them."""

import numpy as np
import pytest

import kvsim
from kvsim.cost.kernels import KERNELS, get_kernel
from kvsim.cost.profiles import get_profile
from kvsim.planning import bookkeeping as bkp
from kvsim.planning.runs import make_config
from kvsim.planning.tune import _table_entries, tune_block_size


def test_block_sizes_each_kernel_runs():
    v0, fa, fi = KERNELS["vllm-v0-paged"], KERNELS["flash-attn"], KERNELS["flashinfer"]
    # vLLM v0.1 `--block-size` choices [8, 16, 32]; vLLM 0.33 FlashAttention MultipleOf(16); FlashInfer [16, 32, 64]
    assert [b for b in range(1, 300) if v0.accepts(b)] == [8, 16, 32]
    assert fa.accepts(48) and fa.accepts(16) and not fa.accepts(8) and not fa.accepts(1)
    assert [b for b in range(1, 300) if fi.accepts(b)] == [16, 32, 64]
    assert v0.candidates() == (8, 16, 32) and fa.candidates() == (16, 32, 64, 128, 256)
    with pytest.raises(ValueError, match="unknown kernel family 'x'"):
        get_kernel("x")


def test_cost_curves_by_hand():
    # 2023 kernel: 1.17 + 1 / b (1.23 at 16: the paper's 20-26 % over FasterTransformer); today's: 1
    assert KERNELS["vllm-v0-paged"].factor(16) == pytest.approx(1.2325)
    assert KERNELS["vllm-v0-paged"].factor(8) == pytest.approx(1.295)
    assert KERNELS["flash-attn"].factor(16) == 1.0


def test_profiles_name_their_kernel_and_table_layout():
    assert (get_profile("vllm-2023").kernel, get_profile("vllm-2023").block_table) == ("vllm-v0-paged", "padded-longest")
    assert (get_profile("vllm-v1").kernel, get_profile("vllm-v1").block_table) == ("flash-attn", "persistent")
    assert get_profile("vllm-2023:high").kernel == "vllm-v0-paged"        # variants keep the kernel


def test_block_tables_padded_as_each_engine_pads_them():
    # peaks P + M - 1 = 10, 4, 20, 40 tokens: 3, 1, 5, 10 blocks of 4
    tr = kvsim.Trace.from_arrays([0.0] * 4, [6, 2, 11, 21], [5, 3, 10, 20])
    v0 = make_config(model="opt-13b", kv_gib=1, engine_profile="vllm-2023")
    # v0: batch 3 pads to the expected longest of 3 draws, the 3/4 quantile of (1, 3, 5, 10) = 6.25 blocks
    assert np.quantile([1, 3, 5, 10], 0.75) == 6.25
    assert _table_entries(v0, tr, 4, 3.0, 9.0, 2.0) == (pytest.approx(18.75), pytest.approx(18.75))
    # never fewer than the blocks held
    assert _table_entries(v0, tr, 4, 3.0, 30.0, 2.0) == (30.0, 30.0)
    # V1: builds only the 2 new blocks, copies 3 rows of ceil(2048 / 4) = 512 entries (OPT-13B: 2048)
    v1 = make_config(model="opt-13b", kv_gib=1, engine_profile="vllm-v1")
    assert _table_entries(v1, tr, 4, 3.0, 9.0, 2.0) == (2.0, 3 * 512)


def test_bookkeeping_builds_and_copies_separately():
    bk = bkp.Bookkeeping(entry_s=1e-7, alloc_free_s=1e-6, copy_fixed_s=1e-5, copy_bytes_per_s=4e9)
    # build 10 entries (1 us), copy 1000 (4000 bytes / 4e9 = 1 us), fixed 10 us, 2 allocs (2 us)
    assert bk.step_s(10, 2, 1000) == pytest.approx(1e-6 + 1e-6 + 1e-5 + 2e-6)
    assert "stored defaults" in bkp.Bookkeeping().source


def test_tuner_defaults_to_the_kernel_sizes_and_warns_on_others():
    tr = kvsim.generate_trace("alpaca", rate_rps=5, num_requests=30, seed=0)
    r = tune_block_size(tr, model="opt-13b", kv_gib=1, engine_profile="vllm-2023")
    assert list(r.curve.block_size) == [8, 16, 32] and r.warnings == ()
    assert r.workload["kernel"] == "vllm-v0-paged" and r.workload["engine_profile"] == "vllm-2023"
    w = tune_block_size(tr, block_sizes=(4, 16), model="opt-13b", kv_gib=1, engine_profile="vllm-v1")
    assert len(w.warnings) == 1 and w.warnings[0].startswith("block size 4: the flash-attn kernel does not run it")
    # today's kernel: no gather cost at any size, in every run
    assert (w.curve.gather_fraction == 0).all()
    assert (r.curve.gather_fraction > 0).all()


def test_grid_edge_is_said():
    from kvsim.planning.tune import _edge_note
    fa = KERNELS["flash-attn"]
    assert "kernel also runs 512: widen --block-sizes" in _edge_note(256, [16, 64, 256], fa)
    assert "runs no smaller power of two" in _edge_note(16, [16, 64, 256], fa)
    assert _edge_note(64, [16, 64, 256], fa) == ""
    assert "runs no larger" in _edge_note(32, [8, 16, 32], KERNELS["vllm-v0-paged"])


def test_tuner_states_the_basis_of_its_costs_and_the_cpu_variants():
    tr = kvsim.generate_trace("alpaca", rate_rps=5, num_requests=30, seed=0)
    r = tune_block_size(tr, model="opt-13b", kv_gib=1, engine_profile="vllm-2023")
    assert set(r.workload["recommended_by_cpu_variant"]) == {"central", "low", "high"}
    assert r.workload["recommended_by_cpu_variant"]["central"] == r.recommended
    assert "Costs: paged kernel published level, assumed slope" in r.reason
    assert "bookkeeping assumed (stored defaults)" in r.reason and "Across CPU-time variants: central" in r.reason
    picks = set(r.workload["recommended_by_cpu_variant"].values())
    assert ("is a range" in r.reason) == (len(picks) > 1)
    off = tune_block_size(tr, model="opt-13b", kv_gib=1, engine_profile="ideal")
    assert "Across CPU-time variants" not in off.reason and "CPU time none" in off.reason
