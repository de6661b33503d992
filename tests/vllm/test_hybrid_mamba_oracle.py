"""Prefix caching with Mamba groups (vLLM 0.33's "align" Mamba cache mode: kvsim/alloc/hybrid/mamba.py)
against vLLM's own v1 Scheduler, step by step under the unchanged kvsim Scheduler: used blocks, blocks per
group, preemptions, finishes, tokens scheduled each step, then each request's hit tokens. vLLM's side:
tests/vllm/hybrid_scheduler_oracle_driver.py over tests/vllm/vllm_startup.py (its own start-up functions;
a case with a Mamba group and prefix caching runs vLLM's "align" mode with Mamba blocks of the block
size, as vLLM's Mamba model configs set it), synchronous scheduling.

The traces share prefixes that arrive over several steps (a 32-token budget admits about one prompt a
step), so later requests meet a prefix the full-attention group has cached but the Mamba group has no
state for: the junction vLLM then stops a chunk at and keeps (`shared_prefix_boundary`). Layouts: full +
Mamba, Jamba-like (seven Mamba, one full), Qwen3-Next-like (three Mamba, one full), sliding + full +
Mamba, each in vLLM's group order (groups of one spec together, by first appearance, as kvsim's
kvsim/specs/kv_groups.py orders them too: the order decides which freed blocks are reused first); retention 0 (vLLM's default), 16 (every 4th block's state kept) and none; pools small enough to
preempt. Block 16, budget 2048: full + Mamba and Qwen3-Next-like over four 200-600-token prefixes.

Then the same full + Mamba and Qwen3-Next-like cases with Mamba layers that export a state from inside a
prefill chunk ("mamba_checkpoints": vLLM's Mamba-2 mixer, or the gated delta net on FlashInfer's prefill
kernel): vLLM keeps a prompt's last chunk whole and holds a checkpoint block beside the running state.

Golden: tests/data/hybrid_oracle/mamba_vllm_0.33.json.gz (`python tests/vllm/test_hybrid_mamba_oracle.py`
regenerates it with the oracle venv); live: `--long` reruns vLLM and must reproduce it.
"""

import json
import random
from pathlib import Path

import pytest

from tests.vllm.scheduler_golden import check_golden, regenerate, vllm_records
from tests.vllm.test_hybrid_oracle import _oracle_python, load_golden
from tests.vllm.test_hybrid_scheduler_oracle import run_kvsim

DATA = Path(__file__).parents[1] / "data" / "hybrid_oracle" / "mamba_vllm_0.33.json.gz"
FULL, MAMBA, SWA8 = {"kind": "full"}, {"kind": "mamba"}, {"kind": "sliding", "window": 8}


def cases() -> list[dict]:
    """Block 4, budget 32, 16 sequences, 40 requests of 4 families (24-44-token shared prefixes, 0-16
    unique tokens, 1-24 outputs), some prompts resent whole; block 16, budget 2048, 60 requests."""
    rng = random.Random(3838)
    families = [[1000 * f + k for k in range(rng.randint(24, 44))] for f in range(1, 5)]
    prompts = [families[rng.randrange(4)] + [50_000 + 100 * i + k for k in range(rng.randint(0, 16) if i % 7 else 0)]
               for i in range(40)]
    reqs = [[len(p), rng.randint(1, 24)] for p in prompts]

    def small(groups, num_blocks, retention):
        return {"block_size": 4, "num_blocks": num_blocks, "groups": groups, "max_num_batched_tokens": 32,
                "max_num_seqs": 16, "max_model_len": 96, "requests": reqs, "caching": True, "prompts": prompts,
                "retention": retention}
    layouts = (([FULL, MAMBA], 30), ([MAMBA] * 7 + [FULL], 56), ([MAMBA] * 3 + [FULL], 40),
               ([SWA8, FULL, MAMBA], 45))
    out = [small(groups, nb, r) for groups, nb in layouts for r in (0, 16, "none")]
    prefixes = [[10_000 * f + k for k in range(rng.randint(200, 600))] for f in range(1, 5)]
    big = [prefixes[rng.randrange(4)] + [900_000 + 2000 * i + k for k in range(rng.randint(1, 300))]
           for i in range(60)]
    big_reqs = [[len(p), rng.randint(10, 300)] for p in big]

    def realistic(groups, num_blocks, retention):
        return {"block_size": 16, "num_blocks": num_blocks, "groups": groups, "max_num_batched_tokens": 2048,
                "max_num_seqs": 64, "max_model_len": 2048, "requests": big_reqs, "caching": True,
                "prompts": big, "retention": retention}
    out += [realistic(groups, nb, r) for groups, nb in (([FULL, MAMBA], 300), ([MAMBA] * 3 + [FULL], 400))
            for r in (0, 256, "none")]
    # Mamba layers that export a state from inside a prefill chunk (vLLM's Mamba-2 spec: one prefill
    # checkpoint block): full + Mamba and Qwen3-Next-like, both sizes, every retention
    out += [{**c, "mamba_checkpoints": True} for c in out if c["groups"] in ([FULL, MAMBA], [MAMBA] * 3 + [FULL])]
    return out


def _check(realistic_dense: bool) -> None:
    check_golden(DATA, cases(), run_kvsim, realistic_dense)


def test_kvsim_equals_vllm_with_mamba_prefix_caching_step_by_step():
    """Block 4 at retention 0, 16 and none; block 16 at vLLM's default 0."""
    _check(realistic_dense=False)


@pytest.mark.long
def test_kvsim_equals_vllm_with_mamba_prefix_caching_at_realistic_sizes():
    _check(realistic_dense=True)


def test_align_mode_as_vllm_runs_it():
    """The check can fail: vLLM serves hits with Mamba groups (the refusal is gone), fewer at retention 0
    than with dense snapshots on full + Mamba (block 4), and cuts the first prompt (29 tokens) at its last
    block boundary, 28, then gives the second a block-aligned 4 of the 32-token budget: full attention
    holds 7 + 1 blocks, the Mamba group one state block each."""
    golden, all_cases = load_golden(DATA), cases()
    hits = {(json.dumps(c["groups"]), c["block_size"], c["retention"]): sum(g[-1]["hits"])
            for c, g in zip(all_cases, golden)}
    assert all(total > 0 for total in hits.values())
    full_mamba = json.dumps([FULL, MAMBA])
    assert hits[(full_mamba, 4, 0)] < hits[(full_mamba, 4, "none")]
    assert all_cases[0]["requests"][0][0] == 29
    assert golden[0][0] == {"used": 10, "groups": [8, 2], "preempted": [], "tokens": 28 + 4, "finished": []}


@pytest.mark.long
@pytest.mark.skipif(_oracle_python() is None, reason="no vLLM oracle venv (../shared/oracle/setup.sh builds it)")
def test_vllm_live_reproduces_the_golden(tmp_path):
    assert json.loads(vllm_records(cases(), tmp_path, timeout=600)) == load_golden(DATA)


if __name__ == "__main__":      # regenerate the golden file with vLLM (the oracle venv must exist)
    regenerate(cases(), DATA, "mamba")
