"""store_kv and copy_blocks: exact against Python-loop references."""

import pytest
import torch

from gpu_harness import reference
from gpu_harness.kernels import copy_blocks, store_kv


@pytest.mark.parametrize("dtype,bs,hk,d", [(torch.float32, 8, 2, 64), (torch.bfloat16, 16, 4, 80),
                                          (torch.float16, 32, 1, 128)])
def test_store_kv_matches_loop_reference(dtype, bs, hk, d, device, gen):
    num_blocks, tokens = 6, 20
    slots = torch.randperm(num_blocks * bs, generator=gen)[:tokens]  # unique
    slots[[0, 7, 13]] = -1  # padding tokens
    key = torch.randn(tokens, hk, d, generator=gen).to(device, dtype)
    value = torch.randn(tokens, hk, d, generator=gen).to(device, dtype)
    kc = torch.randn(num_blocks, bs, hk, d, generator=gen).to(device, dtype)
    vc = torch.randn(num_blocks, bs, hk, d, generator=gen).to(device, dtype)
    k_ref, v_ref = kc.clone(), vc.clone()
    reference.ref_store_kv(key, value, k_ref, v_ref, slots)
    store_kv(key, value, kc, vc, slots.to(device))
    assert torch.equal(kc, k_ref) and torch.equal(vc, v_ref)


def test_store_kv_padding_only_is_a_no_op(device, gen):
    kc = torch.randn(2, 8, 2, 64, generator=gen)
    vc = torch.randn(2, 8, 2, 64, generator=gen)
    before = kc.clone(), vc.clone()
    store_kv(torch.ones(3, 2, 64), torch.ones(3, 2, 64), kc, vc, torch.full((3,), -1, dtype=torch.int64))
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_store_kv_rejects_int32_slots():
    kc = torch.zeros(2, 8, 2, 64)
    with pytest.raises(ValueError, match="int64"):
        store_kv(torch.ones(1, 2, 64), torch.ones(1, 2, 64), kc, kc.clone(), torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks_matches_loop_reference(dtype, device, gen):
    kc = torch.randn(12, 16, 2, 80, generator=gen).to(device, dtype)
    vc = torch.randn(12, 16, 2, 80, generator=gen).to(device, dtype)
    mapping = torch.tensor([[0, 5], [3, 11], [7, 1]], dtype=torch.int64, device=device)
    k_ref, v_ref = kc.clone(), vc.clone()
    reference.ref_copy_blocks(k_ref, v_ref, mapping)
    copy_blocks(kc, vc, mapping)
    assert torch.equal(kc, k_ref) and torch.equal(vc, v_ref)
