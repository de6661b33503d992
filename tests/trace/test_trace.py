"""Trace core and the kvsim JSONL format: round trip, block ids, validation errors (file, line, field)."""

from pathlib import Path

import numpy as np
import pytest

from kvsim.trace.table import Trace, TraceError
from kvsim.trace.jsonl import _read_by_line, read_jsonl, write_jsonl

REPO = Path(__file__).resolve().parents[2]
GOOD = '{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}'


def same(a: Trace, b: Trace) -> None:
    for f in ("arrival_s", "prompt_tokens", "output_tokens", "n", "beam_width", "prefix_tokens"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert [a.request_id(i) for i in range(len(a))] == [b.request_id(i) for i in range(len(b))]
    assert [a.prompt_block_ids(i, 16) for i in range(len(a))] == [b.prompt_block_ids(i, 16) for i in range(len(b))]


def sample() -> Trace:
    return Trace.from_arrays([0.0, 0.123456789, 0.5, 2.0], [10, 40, 33, 1100], [5, 6, 7, 1], n=[1, 2, 1, 1],
                             beam_width=[1, 1, 4, 1], ids=["a", "b", "c", "d"],
                             prefix_group=["sys", "sys", None, None], prefix_tokens=[8, 32, 0, 0])


def test_jsonl_round_trip_keeps_every_field(tmp_path):
    t = sample()
    write_jsonl(t, tmp_path / "t.jsonl")
    back = read_jsonl(tmp_path / "t.jsonl")
    same(t, back)
    assert back.arrival_s[1] == 0.123456789 and back.prefix_group_names == ("sys",)
    assert back.source == "t.jsonl" and len(back) == 4


def test_round_trip_of_block_hashes_and_default_ids(tmp_path):
    t = Trace.from_arrays([0, 1, 1], [1100, 600, 5], [3, 4, 1], block_hashes=[[0, 1, 2], [0, 5], []],
                          hash_block_size=512)
    write_jsonl(t, tmp_path / "h.jsonl")
    back = read_jsonl(tmp_path / "h.jsonl", hash_block_size=512)
    same(t, back)
    assert back.ids is None and back.request_id(2) == "3"
    assert back.block_hashes(1).tolist() == [0, 5] and back.block_hashes(2).tolist() == []


def test_blank_lines_take_the_line_scan_and_give_the_same_trace(tmp_path):
    write_jsonl(sample(), tmp_path / "t.jsonl")
    text = (tmp_path / "t.jsonl").read_text().replace("\n", "\n\n", 1)
    (tmp_path / "b.jsonl").write_text(text)
    same(read_jsonl(tmp_path / "t.jsonl"), read_jsonl(tmp_path / "b.jsonl"))
    same(read_jsonl(tmp_path / "t.jsonl"), _read_by_line(tmp_path / "t.jsonl", None))


def test_prompt_block_ids_from_mooncake_hashes():
    # prompt 1100 tokens: hashes [0, 1, 2] cover blocks of 512 (the last one partial, as in Mooncake)
    t = Trace.from_arrays([0, 1], [1100, 600], [3, 4], block_hashes=[[0, 1, 2], [0, 5]], hash_block_size=512)
    assert t.prompt_block_ids(0, 512) == [0, 1]           # full blocks only
    assert t.prompt_block_ids(1, 512) == [0]
    a, b = t.prompt_block_ids(0, 16), t.prompt_block_ids(1, 16)
    assert len(a) == 1100 // 16 and len(b) == 600 // 16
    assert a[:32] == b[:32]                                # shared first 512-token block
    assert len(set(a[:32])) == 32                          # sub-blocks are distinct
    assert not set(a[32:]) & set(b[32:])                   # hash 1 vs hash 5
    assert a == t.prompt_block_ids(0, 16)                  # deterministic
    assert all(isinstance(x, int) and 0 <= x < 2**63 for x in a)
    assert t.prompt_block_ids(0, 128)[:4] != a[:4]         # ids depend on the block size
    with pytest.raises(ValueError, match="hash block size 512 tokens is not a multiple of block size 48"):
        t.prompt_block_ids(0, 48)


def test_prompt_block_ids_from_prefix_groups_and_none():
    t = sample()
    assert len(t.prompt_block_ids(0, 4)) == 2 and len(t.prompt_block_ids(1, 4)) == 8
    assert t.prompt_block_ids(1, 4)[:2] == t.prompt_block_ids(0, 4)
    assert t.prompt_block_ids(0, 16) == [] and t.prompt_block_ids(2, 4) == []
    other = Trace.from_arrays([0], [10], [1], prefix_group=["other"], prefix_tokens=[8])
    assert not set(other.prompt_block_ids(0, 4)) & set(t.prompt_block_ids(0, 4))


def test_block_ids_are_stable_across_processes():
    import subprocess
    import sys
    code = ("from kvsim.trace.table import Trace; t = Trace.from_arrays([0], [64], [1], prefix_group=['g'], "
            "prefix_tokens=[64], source='x'); print(t.prompt_block_ids(0, 16))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(s)}).stdout for s in (1, 2)}
    assert len(runs) == 1 and len(eval(runs.pop())) == 4


def test_slice_head_until_keep_ids_and_hashes():
    t = Trace.from_arrays([0, 1, 2, 3], [600, 600, 600, 600], [1, 1, 1, 1],
                          block_hashes=[[1, 2], [3], [], [4, 5]], hash_block_size=512)
    s = t.slice(1, 4)
    assert [s.request_id(i) for i in range(3)] == ["2", "3", "4"]
    assert s.block_hashes(0).tolist() == [3] and s.block_hashes(2).tolist() == [4, 5]
    assert len(t.head(2)) == 2 and t.head(2).ids is None
    assert len(t.until(2.0)) == 2 and len(t.until(2.5)) == 3


def test_summary_numbers():
    s = sample().summary()
    assert s["requests"] == 4 and s["duration_s"] == 2.0 and s["rate_rps"] == 2.0
    assert s["prompt_tokens"]["mean"] == pytest.approx((10 + 40 + 33 + 1100) / 4)
    assert s["output_tokens"]["max"] == 7 and s["n"]["max"] == 2 and s["beam_width"]["max"] == 4
    assert s["prefix"]["groups"] == 1 and s["prefix"]["requests_in_groups"] == 2
    assert s["prefix"]["mean_prefix_tokens"] == 20.0


def test_trace_arrays_are_read_only_and_validated():
    t = sample()
    with pytest.raises(ValueError):
        t.prompt_tokens[0] = 5
    with pytest.raises(ValueError, match="Trace.arrival_s must be non-decreasing; request 1"):
        Trace.from_arrays([1.0, 0.5], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="Trace.output_tokens must be >= 1; request 0"):
        Trace.from_arrays([0.0], [1], [0])


BAD = [
    ('{"arrival_s": 0, "prompt_tokens": -3, "output_tokens": 1}',
     r"bad\.jsonl:2: field 'prompt_tokens' must be an integer >= 1, got -3"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 0}',
     r"bad\.jsonl:2: field 'output_tokens' must be an integer >= 1, got 0"),
    ('{"arrival_s": 0, "prompt_tokens": 3}', r"bad\.jsonl:2: missing required field 'output_tokens'"),
    ('{"arrival_s": 0, "prompt_tokens": "3", "output_tokens": 1}',
     r"bad\.jsonl:2: field 'prompt_tokens' must be an integer >= 1, got \"3\""),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1.5}',
     r"bad\.jsonl:2: field 'output_tokens' must be an integer >= 1, got 1.5"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": true}',
     r"bad\.jsonl:2: field 'output_tokens' must be an integer >= 1, got true"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1', r"bad\.jsonl:2: malformed JSON"),
    ('[1, 2]', r"bad\.jsonl:2: expected a JSON object, got list"),
    ('{"arrival_s": "soon", "prompt_tokens": 3, "output_tokens": 1}',
     r"bad\.jsonl:2: field 'arrival_s' must be a finite number >= 0"),
    ('{"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 1}',
     r"bad\.jsonl:2: field 'arrival_s' must be a finite number >= 0"),
    ('{"arrival_s": 5, "prompt_tokens": 3, "output_tokens": 1}\n{"arrival_s": 4, "prompt_tokens": 3, "output_tokens": 1}',
     r"bad\.jsonl:3: field 'arrival_s' must be non-decreasing, got 4.0 after 5.0 on line 2"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "n": 0}',
     r"bad\.jsonl:2: field 'n' must be an integer >= 1, got 0"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "beam_width": "4"}',
     r"bad\.jsonl:2: field 'beam_width' must be an integer >= 1"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "beamwidth": 4}',
     r"bad\.jsonl:2: unknown field 'beamwidth'"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "prefix_group": "a"}',
     r"bad\.jsonl:2: field 'prefix_tokens' is required when 'prefix_group' is given"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "prefix_group": "a", "prefix_tokens": 4}',
     r"bad\.jsonl:2: field 'prefix_tokens' must be an integer <= 3 \(prompt_tokens\), got 4"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "prefix_group": 7, "prefix_tokens": 2}',
     r"bad\.jsonl:2: field 'prefix_group' must be a non-empty string"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "block_hashes": [1, "x"]}',
     r"bad\.jsonl:2: field 'block_hashes' must be a list of 64-bit integers"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "block_hashes": [1], "prefix_group": "a", "prefix_tokens": 2}',
     r"bad\.jsonl:2: field 'block_hashes' cannot be combined with 'prefix_group'"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "id": 5}',
     r"bad\.jsonl:2: field 'id' must be a string, got 5"),
    ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "id": "1"}',
     r"bad\.jsonl:2: field 'id': '1' is already the id of line 1"),
]


@pytest.mark.parametrize("line,message", BAD, ids=[m.split(":2: ")[-1][:40] for _, m in BAD])
def test_errors_name_file_line_and_field(tmp_path, line, message):
    (tmp_path / "bad.jsonl").write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message):
        read_jsonl(tmp_path / "bad.jsonl")


def test_error_deep_in_a_large_file_names_its_line(tmp_path):
    lines = [f'{{"arrival_s": {i}, "prompt_tokens": 3, "output_tokens": 1}}' for i in range(100_000)]
    lines[76_543] = lines[76_543].replace('"prompt_tokens": 3', '"prompt_tokens": 0')
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"big\.jsonl:76544: field 'prompt_tokens' must be an integer >= 1, got 0"):
        read_jsonl(tmp_path / "big.jsonl")


def test_too_many_block_hashes_for_the_hash_block_size(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"arrival_s": 0, "prompt_tokens": 600, "output_tokens": 1, '
                                        '"block_hashes": [1, 2, 3]}\n')
    assert len(read_jsonl(tmp_path / "bad.jsonl").block_hashes(0)) == 3   # unknown block size: accepted
    with pytest.raises(TraceError, match=r"bad\.jsonl:1: field 'block_hashes' has 3 entries, more than the 2"):
        read_jsonl(tmp_path / "bad.jsonl", hash_block_size=512)


def test_empty_file_is_an_error(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(TraceError, match=r"e\.jsonl:1: no requests"):
        read_jsonl(tmp_path / "e.jsonl")


def test_shipped_tiny_trace():
    t = read_jsonl(REPO / "traces" / "tiny.jsonl")
    assert len(t) == 10 and t.n.max() == 2 and t.request_id(1) == "r2"
    assert t.prompt_block_ids(2, 16) == t.prompt_block_ids(3, 16) and len(t.prompt_block_ids(2, 16)) == 3


def test_a_trace_shares_prompt_blocks_only_with_block_hashes_or_a_prefix_group():
    """Without either (or with every group None) `prompt_block_ids` is empty for every request."""
    plain = Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5])
    ungrouped = Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5], prefix_group=[None, None], prefix_tokens=[0, 0])
    grouped = Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5], prefix_group=["sys", None], prefix_tokens=[32, 0])
    hashed = Trace.from_arrays([0.0, 1.0], [40, 40], [5, 5], block_hashes=[[7, 8], [7]], hash_block_size=16)
    assert [t.shares_prompt_blocks for t in (plain, ungrouped, grouped, hashed)] == [False, False, True, True]
    assert [plain.prompt_block_ids(i, 16) + ungrouped.prompt_block_ids(i, 16) for i in (0, 1)] == [[], []]
    assert len(grouped.prompt_block_ids(0, 16)) == 2 and hashed.prompt_block_ids(0, 16) == [7, 8]
