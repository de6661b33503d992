"""vLLM 0.33's prefix-cache retention interval (`--prefix-cache-retention-interval`: its default 0, a
positive interval, none) against kvsim's hybrid allocator under the unchanged kvsim Scheduler, step by step
(used blocks, blocks per group, preemptions, finishes, tokens scheduled, then each request's hit tokens).
vLLM's side: its own v1 Scheduler with the engine configured by its start-up functions
(tests/vllm/hybrid_scheduler_oracle_driver.py over tests/vllm/vllm_startup.py), synchronous scheduling.

The traces share prefixes that arrive over several steps (a 32-token budget admits about one prompt a
step; realistic: 2048), so later requests meet a prefix the full-attention group has cached but a sparse
sliding group has not: the junction vLLM then pins (`shared_prefix_boundary`). Layouts: full + sliding
(gpt-oss-like), sliding + full + sliding and five sliding + full (Gemma-3-like), full + chunked
(Llama-4-like), sliding + chunked.

Golden: tests/data/hybrid_oracle/retention_vllm_0.33.json.gz (`python tests/vllm/test_hybrid_retention_oracle.py`
regenerates it with the oracle venv); live: `--long` reruns vLLM and must reproduce it.
"""

import json
import random
from pathlib import Path

import pytest

from tests.vllm.scheduler_golden import check_golden, regenerate, vllm_records
from tests.vllm.test_hybrid_oracle import _oracle_python, load_golden
from tests.vllm.test_hybrid_scheduler_oracle import run_kvsim

DATA = Path(__file__).parents[1] / "data" / "hybrid_oracle" / "retention_vllm_0.33.json.gz"
FULL, SWA8, CHUNK8 = {"kind": "full"}, {"kind": "sliding", "window": 8}, {"kind": "chunked", "chunk": 8}


def cases() -> list[dict]:
    """Block 4, budget 32, 16 sequences, 40 requests of 4 families (24-44-token shared prefixes, 0-16
    unique tokens, 1-24 outputs); each caching layout at retention 0, 16 (a positive multiple of the
    block size: every 4th block's window is kept) and none. Block 16, budget 2048: gpt-oss-like and
    Gemma-3-like layouts over 60 requests with four 200-600-token prefixes, retention 0, 256, none."""
    rng = random.Random(38)
    families = [[1000 * f + k for k in range(rng.randint(24, 44))] for f in range(1, 5)]
    prompts = [families[rng.randrange(4)] + [50_000 + 100 * i + k for k in range(rng.randint(0, 16))]
               for i in range(40)]
    reqs = [[len(p), rng.randint(1, 24)] for p in prompts]

    def small(groups, num_blocks, retention):
        return {"block_size": 4, "num_blocks": num_blocks, "groups": groups, "max_num_batched_tokens": 32,
                "max_num_seqs": 16, "max_model_len": 96, "requests": reqs, "caching": True, "prompts": prompts,
                "retention": retention}
    out = [small(groups, nb, r) for groups, nb in (([FULL, SWA8], 40), ([SWA8, FULL, SWA8], 56),
                                                   ([FULL, CHUNK8], 40), ([SWA8, CHUNK8], 24))
           for r in (0, 16, "none") if r != 16 or SWA8 in groups]    # (vLLM refuses 16 without a sliding group)
    prefixes = [[10_000 * f + k for k in range(rng.randint(200, 600))] for f in range(1, 5)]
    big = [prefixes[rng.randrange(4)] + [900_000 + 2000 * i + k for k in range(rng.randint(1, 300))]
           for i in range(60)]
    big_reqs = [[len(p), rng.randint(10, 300)] for p in big]
    swa128, swa512 = {"kind": "sliding", "window": 128}, {"kind": "sliding", "window": 512}

    def realistic(groups, num_blocks, retention):
        return {"block_size": 16, "num_blocks": num_blocks, "groups": groups, "max_num_batched_tokens": 2048,
                "max_num_seqs": 64, "max_model_len": 2048, "requests": big_reqs, "caching": True,
                "prompts": big, "retention": retention}
    out += [realistic(groups, nb, r) for groups, nb in (([FULL, swa128], 300), ([swa512] * 5 + [FULL], 800))
            for r in (0, 256, "none")]
    return out


def _check(realistic_dense: bool) -> None:
    check_golden(DATA, cases(), run_kvsim, realistic_dense)


def test_kvsim_equals_vllm_at_every_retention_step_by_step():
    """Block 4 at retention 0, 16 and none; block 16 at vLLM's default 0."""
    _check(realistic_dense=False)


@pytest.mark.long
def test_kvsim_equals_vllm_at_realistic_sizes_with_interval_and_dense():
    _check(realistic_dense=True)


def test_retention_changes_what_vllm_serves():
    """The check can fail: on every sliding layout vLLM serves fewer hit tokens at retention 0 than at none
    (dense caching gives later siblings sliding-window hits that the default does not), while full +
    chunked (retention ignored) is the same under both."""
    golden, all_cases = load_golden(DATA), cases()
    hits = {}
    for case, want in zip(all_cases, golden):
        hits[(json.dumps(case["groups"]), case["block_size"], case["retention"])] = sum(want[-1]["hits"])
    for (groups, bs, retention), total in hits.items():
        if retention == 0:
            dense = hits[(groups, bs, "none")]
            if "sliding" in groups:
                assert total < dense, (groups, total, dense)
            else:
                assert total == dense
    assert all(total > 0 for (_, _, retention), total in hits.items() if retention == "none")
    # sliding + chunked (no full group, so no junction to pin) at retention 0: vLLM serves no hit at all
    assert hits[(json.dumps([SWA8, CHUNK8]), 4, 0)] == 0


def test_a_positive_interval_without_a_sliding_group_is_refused_as_vllm_does():
    """vLLM's `_validate_prefix_cache_retention_interval` refuses it at start-up (the driver fails there)."""
    from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
    with pytest.raises(ValueError, match="no sliding-window or Mamba"):
        HybridAllocator(40, 4, [GroupSpec("full"), GroupSpec("chunked", chunk=8)], 96, 32, retention_interval=16)
    with pytest.raises(ValueError, match="multiple of the block size"):
        HybridAllocator(40, 4, [GroupSpec("full"), GroupSpec("sliding", window=8)], 96, 32, retention_interval=6)
    HybridAllocator(40, 4, [GroupSpec("full"), GroupSpec("chunked", chunk=8)], 96, 32, retention_interval=0)


@pytest.mark.long
@pytest.mark.skipif(_oracle_python() is None, reason="no vLLM oracle venv (../shared/oracle/setup.sh builds it)")
def test_vllm_live_reproduces_the_golden(tmp_path):
    assert json.loads(vllm_records(cases(), tmp_path, timeout=600)) == load_golden(DATA)


if __name__ == "__main__":      # regenerate the golden file with vLLM (the oracle venv must exist)
    regenerate(cases(), DATA, "retention")
