"""kvsim's hybrid allocator against vLLM 0.33's own KVCacheManager (tests/vllm/hybrid_oracle_driver.py), op by op:
admissions (vLLM's full-sequence gate with the sliding / chunked admission cap), prefill chunks, decode
tokens and frees over full + sliding window, full + chunked local, full + Mamba and full + sliding + Mamba
groups sharing one pool. After every op both must agree on the outcome, the free blocks and every live
request's block table per group, block ids included (vLLM's minus one: its block 0 is the null block).

Prefix caching at the retention interval a scenario names (absent: none, dense; else vLLM's default 0 and
8 tokens, kvsim/alloc/hybrid/retention.py), block ids included.

Golden: vLLM's records are stored in tests/data/hybrid_oracle/vllm_0.33.json.gz (made by the driver:
`python tests/vllm/test_hybrid_oracle.py` regenerates it);
Live (`--long`): where the oracle venv exists ($ORACLE_VENV, default ~/.cache/vllm-oracle-venv) vLLM is
rerun and must reproduce them.
"""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.alloc.hybrid import GroupSpec, HybridAllocator

DATA = Path(__file__).parents[1] / "data" / "hybrid_oracle" / "vllm_0.33.json.gz"


def load_golden(path: Path) -> list:
    """A gzipped JSON golden file."""
    with gzip.open(path, "rt") as f:
        return json.load(f)
FULL, SWA4, CHUNK4, MAMBA = {"kind": "full"}, {"kind": "sliding", "window": 4}, {"kind": "chunked", "chunk": 4}, {"kind": "mamba"}


def _scenario(groups, num_blocks, ops):
    return {"block_size": 2, "num_blocks": num_blocks, "max_model_len": 64, "max_in_flight_tokens": 8,
            "groups": groups, "ops": ops}


def _decode(rids, steps):
    return [["grow", r, 1] for _ in range(steps) for r in rids]


def scenarios() -> list[dict]:
    """Block size 2, max_model_len 64, 8 tokens in flight (one batch of max_num_batched_tokens 8)."""
    mixed = ([["admit", 0, 5, 5], ["grow", 0, 1], ["admit", 1, 6, 6]] + _decode([0, 1], 3)
             + [["admit", 2, 9, 8], ["grow", 2, 1]] + _decode([0, 1, 2], 4) + [["free", 1]]
             + _decode([0, 2], 3) + [["free", 0], ["admit", 3, 3, 3]] + _decode([2, 3], 5) + [["free", 2], ["free", 3]])
    # a 30-token prompt in 8-token chunks: the gate counts the sliding group's min(15, cdiv(3 + 8, 2) + 1 = 7)
    # blocks, so 15 + 7 = 22 <= 25 blocks admit it where 15 + 15 would not
    long = [["admit", 0, 30, 8], ["grow", 0, 8], ["grow", 0, 8], ["grow", 0, 6]] + _decode([0], 4) + [["free", 0]]
    short = ([["admit", 0, 4, 4], ["admit", 1, 4, 4], ["admit", 2, 3, 3]] + _decode([0, 1], 1) + [["free", 1]]
             + _decode([0], 3) + [["free", 0]])
    # prefix caching: prompts sharing a 16-token prefix P (8 blocks); D is P itself (at most 7 blocks hit)
    p = list(range(100, 116))
    a, b, c, d = p + [1, 2, 3], p + [4, 5], p[:8] + [9] * 6, p
    cached = ([["admitc", 0, a], ["grow", 0, 8], ["grow", 0, 3]] + _decode([0], 3) + [["admitc", 1, b]]
              + _decode([0, 1], 2) + [["free", 0], ["admitc", 2, c], ["grow", 2, 6], ["admitc", 3, d], ["grow", 3, 2]]
              + _decode([1, 2, 3], 4) + [["free", 1], ["readmit", 0]] + _decode([0, 2, 3], 3)
              + [["free", 2], ["readmit", 1], ["admitc", 4, a]] + _decode([0, 1, 3, 4], 3)
              + [["free", 0], ["free", 1], ["free", 3], ["free", 4]])
    SWA6 = {"kind": "sliding", "window": 6}
    return [_scenario(g, n, mixed) for g, n in (([FULL, SWA4], 12), ([FULL, SWA4], 20), ([FULL, CHUNK4], 12),
                                                 ([FULL, CHUNK4], 20), ([FULL, MAMBA], 12), ([FULL, SWA4, MAMBA], 16))] + \
        [_scenario([FULL, SWA4], 25, long), _scenario([FULL, CHUNK4], 25, long), _scenario([FULL, SWA4], 6, short)] + \
        [{**_scenario(g, n, cached), "caching": True}
         for g, n in (([FULL, SWA4], 60), ([FULL, SWA4], 24), ([FULL, CHUNK4], 60), ([FULL, CHUNK4], 24),
                      ([SWA4, FULL, SWA4], 60), ([SWA4, SWA6], 40), ([FULL, SWA6, CHUNK4], 40), ([FULL, SWA4, SWA6], 30))] + \
        [{**_scenario(g, n, cached), "caching": True, "retention": r}     # vLLM's default 0, and an interval
         for g, n in (([FULL, SWA4], 60), ([FULL, SWA4], 24), ([SWA4, FULL, SWA4], 60), ([SWA4, SWA6], 40),
                      ([FULL, SWA6, CHUNK4], 40), ([FULL, SWA4, SWA6], 30)) for r in (0, 8)]


def _content_ids(tokens: list[int], block_size: int, ids: dict) -> list[int]:
    """Content ids of the full blocks of `tokens`, equal for equal prefixes (the trace's block hashes)."""
    out, parent = [], -1
    for k in range(len(tokens) // block_size):
        parent = ids.setdefault((parent, tuple(tokens[k * block_size:(k + 1) * block_size])), len(ids))
        out.append(parent)
    return out


def replay(s: dict) -> list[dict]:
    """The driver's ops on kvsim's allocator, recorded the same way (invariants checked after each)."""
    chunk, bs = s["max_in_flight_tokens"], s["block_size"]
    a = HybridAllocator(s["num_blocks"], bs, [GroupSpec(**g) for g in s["groups"]], s["max_model_len"],
                        chunk, prefill_chunk_tokens=chunk, prefix_caching=s.get("caching", False),
                        retention_interval=None if s.get("retention", "none") == "none" else s["retention"])
    live, out, ids, content, total = [], [], {}, {}, {}
    for kind, rid, *args in s["ops"]:
        hit = 0
        if kind in ("admitc", "readmit"):
            if kind == "admitc":
                content[rid], total[rid] = _content_ids(args[0], bs, ids), len(args[0])
            n = total[rid]
            hit = a.cached_tokens(n, content[rid], rid)
            hold = hit + min(n - hit, chunk)
            ok = a.can_allocate(n, n, content[rid], rid) and a.can_hold(hold, n, content[rid], rid)
            if ok:
                assert a.allocate(rid, n, n, content[rid], hold) == hit
                live.append(rid)
        elif kind != "admit" and rid not in live:
            ok = None
        elif kind == "admit":
            ok = a.can_allocate(args[0], args[0]) and a.can_hold(args[1], args[0])
            if ok:
                a.allocate(rid, args[0], args[0], hold_tokens=args[1])
                live.append(rid)
        elif kind == "grow":
            total[rid] = max(total.get(rid, 0), a.num_tokens(rid) + args[0])
            ok = a.can_append(rid, args[0])
            if ok:
                a.append(rid, args[0])
            else:
                a.free(rid)
                live.remove(rid)
        else:
            a.free(rid)
            live.remove(rid)
            ok = True
        a.check_invariants()
        record = {"ok": ok, "free": a.num_free_blocks, "tables": {str(r): a.group_block_tables(r) for r in live}}
        if s.get("caching"):
            record["hit"] = hit
        out.append(record)
    return out


def test_kvsim_equals_vllm_op_by_op():
    golden = load_golden(DATA)
    cases = scenarios()
    assert len(golden) == len(cases)
    for s, expected in zip(cases, golden):
        got = replay(s)
        for j, (g, e) in enumerate(zip(got, expected)):
            assert g == e, f"groups {s['groups']}, {s['num_blocks']} blocks, op {j} {s['ops'][j]}"
        assert len(got) == len(expected)
    # the golden data exercises what it should: refusals at the gate, failed grows, window frees
    oks = [r["ok"] for case in golden for r in case]
    assert oks.count(False) >= 5 and oks.count(True) > 100
    # and retention matters: full + sliding 4 at 60 blocks, vLLM serves 98 hit tokens dense, 60 at 0, 84 at 8
    hits = {(json.dumps(s["groups"]), s["num_blocks"], s.get("retention", "none")): sum(r["hit"] for r in g)
            for s, g in zip(cases, golden) if s.get("caching")}
    key = json.dumps([FULL, SWA4]), 60
    assert (hits[(*key, "none")], hits[(*key, 0)], hits[(*key, 8)]) == (98, 60, 84)


def _oracle_python() -> Path | None:
    python = Path(os.environ.get("ORACLE_VENV", Path.home() / ".cache" / "vllm-oracle-venv")) / "bin" / "python"
    return python if python.exists() else None


@pytest.mark.long
@pytest.mark.skipif(_oracle_python() is None, reason="no vLLM oracle venv (../shared/oracle/setup.sh builds it)")
def test_vllm_live_reproduces_the_golden(tmp_path):
    cases, out = tmp_path / "cases.json", tmp_path / "out.json"
    cases.write_text(json.dumps(scenarios()))
    subprocess.run([str(_oracle_python()), "-W", "ignore", str(Path(__file__).parent / "hybrid_oracle_driver.py"),
                    str(cases), str(out)], check=True, capture_output=True, timeout=600)
    assert json.loads(out.read_text()) == load_golden(DATA)


if __name__ == "__main__":      # regenerate the golden file with vLLM (oracle venv's python must exist)
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/hybrid_cases.json")
    path.write_text(json.dumps(scenarios()))
    raw = path.with_suffix(".out.json")
    subprocess.run([str(_oracle_python()), "-W", "ignore", str(Path(__file__).parent / "hybrid_oracle_driver.py"),
                    str(path), str(raw)], check=True)
    with gzip.open(DATA, "wt") as f:
        f.write(raw.read_text())
