"""Synthetic generators: paper means after the max_len cut, determinism, Poisson arrivals."""

import numpy as np
import pytest

from kvsim.trace.synthetic import generate, sample_lengths

TARGETS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}


@pytest.mark.parametrize("preset", sorted(TARGETS))
def test_means_within_one_percent_after_the_cap(preset):
    prompt, output = sample_lengths(preset, 100_000, np.random.default_rng(0), max_len=2048)
    p, o = TARGETS[preset]
    assert abs(prompt.mean() / p - 1) < 0.01 and abs(output.mean() / o - 1) < 0.01
    assert (prompt + output).max() <= 2048 and prompt.min() >= 1 and output.min() >= 1
    assert np.percentile(output, 99) > 3 * o / 2                # long tail, not a narrow bell


def test_means_hold_for_another_max_len():
    prompt, output = sample_lengths("sharegpt", 100_000, np.random.default_rng(1), max_len=1024)
    assert (prompt + output).max() <= 1024
    assert abs(prompt.mean() / 161.31 - 1) < 0.01 and abs(output.mean() / 337.99 - 1) < 0.01


def test_generate_is_deterministic_and_poisson():
    a = generate("sharegpt", rate_rps=5.0, duration_s=2000.0, seed=7)
    b = generate("sharegpt", rate_rps=5.0, duration_s=2000.0, seed=7)
    c = generate("sharegpt", rate_rps=5.0, duration_s=2000.0, seed=8)
    assert a.arrival_s.tolist() == b.arrival_s.tolist() and a.prompt_tokens.tolist() == b.prompt_tokens.tolist()
    assert a.prompt_tokens.tolist() != c.prompt_tokens.tolist()
    gaps = np.diff(a.arrival_s)
    assert abs(len(a) / 10_000 - 1) < 0.05 and a.arrival_s[-1] < 2000.0
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05            # exponential gaps: CV 1


def test_generate_options():
    t = generate("alpaca", rate_rps=30.0, num_requests=500, n=4, beam_width=2, seed=0)
    assert len(t) == 500 and set(t.n.tolist()) == {4} and set(t.beam_width.tolist()) == {2}
    with pytest.raises(ValueError, match="unknown preset 'lmsys'; known: sharegpt, alpaca, arxiv"):
        generate("lmsys")
    with pytest.raises(ValueError, match="max_len 256 tokens is too small for preset 'sharegpt'"):
        generate("sharegpt", num_requests=5, max_len=256)
    with pytest.raises(ValueError, match="rate must be > 0"):
        generate("alpaca", rate_rps=0.0)


def test_few_shot_prefix_is_shared_by_every_request():
    from kvsim.trace.synthetic import generate
    t = generate("alpaca", num_requests=50, shared_prefix_tokens=80, seed=3)
    plain = generate("alpaca", num_requests=50, seed=3, max_len=2048 - 80)
    assert (t.prompt_tokens == plain.prompt_tokens + 80).all()
    assert t.prompt_block_ids(0, 16) == t.prompt_block_ids(49, 16) and len(t.prompt_block_ids(0, 16)) == 5
    assert (t.prompt_tokens + t.output_tokens <= 2048).all()


def test_few_shot_prefix_hits_every_request_after_the_first(tmp_path):
    from typer.testing import CliRunner
    import json
    from kvsim.cli.app import app
    out = tmp_path / "t.jsonl"
    r = CliRunner().invoke(app, ["trace", "gen", "--preset", "alpaca", "--num-requests", "20", "--rate", "0.5",
                                 "--shared-prefix", "341", "-o", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["run", str(out), "--prefix-caching", "--quiet", "--json", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "s.json").read_text())
    prompts = sum(json.loads(line)["prompt_tokens"] for line in out.read_text().splitlines())
    assert s["prefix_cache_hit_tokens"] == 19 * 336                  # floor(341 / 16) = 21 blocks each
    assert s["prefix_cache_hit_rate"] == 19 * 336 / prompts
    bad = CliRunner().invoke(app, ["trace", "gen", "--preset", "alpaca", "--shared-prefix", "1024", "-o", str(out)])
    assert bad.exit_code == 2 and "shared prefix must be 0..1023 tokens" in bad.output
