"""Synthetic generators: paper means after the max_len cut, determinism, Poisson arrivals."""

import numpy as np
import pytest

from kvsim.tracegen import generate, sample_lengths

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
    with pytest.raises(ValueError, match="unknown preset 'lmsys'; known: sharegpt, alpaca"):
        generate("lmsys")
    with pytest.raises(ValueError, match="max_len 256 tokens is too small for preset 'sharegpt'"):
        generate("sharegpt", num_requests=5, max_len=256)
    with pytest.raises(ValueError, match="rate must be > 0"):
        generate("alpaca", rate_rps=0.0)
