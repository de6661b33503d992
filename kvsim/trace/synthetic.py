"""Synthetic traces: Poisson arrivals and long-tailed (lognormal) prompt/output lengths.

Presets follow the vLLM paper's workloads: ShareGPT (mean prompt 161.31, mean output 337.99 tokens) and
Alpaca (19.31 / 58.45). Lengths are rounded lognormals (at least 1 token) and a request whose
prompt + output exceeds `max_len` tokens is redrawn, as the paper's ShareGPT preprocessing drops such
requests. The lognormal locations are solved (exactly, on the discrete distribution) so that the means
*after* that cut equal the targets for the given `max_len`; the shapes (sigma) set the tails and are
our choice, not fitted to the datasets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvsim.trace.table import Trace


@dataclass(frozen=True)
class LengthPreset:
    """Target means (tokens, after the max_len cut) and lognormal shapes of prompt and output lengths."""

    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float


PRESETS = {
    "sharegpt": LengthPreset(prompt_mean=161.31, output_mean=337.99, prompt_sigma=1.2, output_sigma=1.0),
    "alpaca": LengthPreset(prompt_mean=19.31, output_mean=58.45, prompt_sigma=0.6, output_sigma=0.9),
    # long prompts, short answers: arXiv summarization (Vidur's processed trace, 28,257 requests,
    # Llama-2 tokenizer, MIT: mean prompt 2,588.08, output 291.43; standard deviations of the log
    # lengths 0.755 and 0.796); use max_len >= 8192
    "arxiv": LengthPreset(prompt_mean=2588.08, output_mean=291.43, prompt_sigma=0.755, output_sigma=0.796),
}


def _pmf(mu: float, sigma: float, max_len: int) -> np.ndarray:
    """P(length = k) for k = 0..max_len of max(1, round(lognormal(mu, sigma))); index 0 is unused."""
    edges = np.arange(max_len + 1) + 0.5
    z = (np.log(edges) - mu) / (sigma * math.sqrt(2))
    cdf = 0.5 * np.array([math.erfc(-v) for v in z])
    pmf = np.zeros(max_len + 1)
    pmf[1] = cdf[1]
    pmf[2:] = np.diff(cdf[1:])
    return pmf


def _cut_means(mu_p: float, mu_o: float, p: LengthPreset, max_len: int) -> tuple[float, float]:
    """Mean prompt and output lengths (tokens) of the pairs with prompt + output <= max_len."""
    fp, fo = _pmf(mu_p, p.prompt_sigma, max_len), _pmf(mu_o, p.output_sigma, max_len)
    k = np.arange(max_len + 1)
    room = max_len - k                                   # output tokens a prompt of k leaves
    cdf_o, mean_part_o = np.cumsum(fo), np.cumsum(k * fo)
    keep = fp * cdf_o[np.clip(room, 0, None)]
    keep[room < 1] = 0.0
    total = keep.sum()
    out_part = fp * mean_part_o[np.clip(room, 0, None)]
    out_part[room < 1] = 0.0
    return float((k * keep).sum() / total), float(out_part.sum() / total)


@lru_cache(maxsize=16)
def lognormal_params(preset: str, max_len: int) -> tuple[float, float]:
    """(mu_prompt, mu_output) whose cut means equal the preset's targets within 1e-6 relative."""
    p = preset_of(preset)
    if p.prompt_mean + p.output_mean >= max_len * 0.75:
        raise ValueError(f"max_len {max_len} tokens is too small for preset {preset!r} "
                         f"(mean prompt + output {p.prompt_mean + p.output_mean:.0f} tokens)")
    mu_p = math.log(p.prompt_mean) - p.prompt_sigma**2 / 2
    mu_o = math.log(p.output_mean) - p.output_sigma**2 / 2
    for _ in range(200):
        mp, mo = _cut_means(mu_p, mu_o, p, max_len)
        if abs(mp / p.prompt_mean - 1) < 1e-6 and abs(mo / p.output_mean - 1) < 1e-6:
            return mu_p, mu_o
        mu_p += math.log(p.prompt_mean / mp)
        mu_o += math.log(p.output_mean / mo)
    raise ValueError(f"cannot reach preset {preset!r} means with max_len {max_len} tokens")


def preset_of(name: str) -> LengthPreset:
    """The named preset; an unknown name lists the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def poisson_arrivals(rate_rps: float, rng: np.random.Generator, *, num: int | None = None,
                     duration_s: float | None = None) -> np.ndarray:
    """Arrival times (s, from 0) of a Poisson process: `num` of them, or all before `duration_s`."""
    if not rate_rps > 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate_rps}")
    if num is not None:
        return np.cumsum(rng.exponential(1.0 / rate_rps, num))
    if duration_s is None or duration_s <= 0:
        raise ValueError(f"duration must be > 0 s, got {duration_s}")
    chunks, t = [], 0.0
    while t < duration_s:
        c = t + np.cumsum(rng.exponential(1.0 / rate_rps, max(16, int(rate_rps * duration_s * 1.1))))
        chunks.append(c)
        t = c[-1]
    arrivals = np.concatenate(chunks)
    return arrivals[arrivals < duration_s]


def sample_lengths(preset: str, num: int, rng: np.random.Generator, max_len: int = 2048
                   ) -> tuple[np.ndarray, np.ndarray]:
    """`num` (prompt, output) token lengths, each >= 1, with prompt + output <= max_len."""
    p = preset_of(preset)
    mu_p, mu_o = lognormal_params(preset, max_len)
    prompts, outputs, have = [], [], 0
    while have < num:
        draw = max(64, int((num - have) * 1.2))
        pr = np.maximum(1, np.rint(rng.lognormal(mu_p, p.prompt_sigma, draw))).astype(np.int64)
        out = np.maximum(1, np.rint(rng.lognormal(mu_o, p.output_sigma, draw))).astype(np.int64)
        ok = pr + out <= max_len
        prompts.append(pr[ok])
        outputs.append(out[ok])
        have += int(ok.sum())
    return np.concatenate(prompts)[:num], np.concatenate(outputs)[:num]


def generate(preset: str, *, rate_rps: float = 2.0, duration_s: float | None = 3600.0,
             num_requests: int | None = None, n: int = 1, beam_width: int = 1, max_len: int = 2048,
             shared_prefix_tokens: int = 0, seed: int = 0) -> Trace:
    """A synthetic trace: Poisson arrivals at `rate_rps` for `duration_s` seconds (or exactly
    `num_requests` requests when given), preset lengths, every request with `n` samples and `beam_width`.
    `shared_prefix_tokens` > 0: a few-shot workload, every prompt starts with the same prefix of that
    many tokens (prefix group "few-shot"), followed by a preset prompt drawn with `max_len` less the
    prefix (the vLLM paper's translation experiment uses 80- and 341-token prefixes).
    Arrival times are rounded to microseconds. Deterministic for a seed."""
    if n < 1 or beam_width < 1:
        raise ValueError(f"n and beam_width must be >= 1, got n={n}, beam_width={beam_width}")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not 0 <= shared_prefix_tokens < max_len // 2:
        raise ValueError(f"shared prefix must be 0..{max_len // 2 - 1} tokens (under half of max_len "
                         f"{max_len}), got {shared_prefix_tokens}")
    rng = np.random.default_rng(seed)
    arrivals = np.round(poisson_arrivals(rate_rps, rng, num=num_requests, duration_s=duration_s), 6)
    prompt, output = sample_lengths(preset, len(arrivals), rng, max_len - shared_prefix_tokens)
    source = f"{preset}-rate{rate_rps:g}-seed{seed}"
    if not shared_prefix_tokens:
        return Trace.from_arrays(arrivals, prompt, output, n=n, beam_width=beam_width, source=source)
    num = len(arrivals)
    return Trace.from_arrays(arrivals, prompt + shared_prefix_tokens, output, n=n, beam_width=beam_width,
                             prefix_group=["few-shot"] * num, prefix_tokens=[shared_prefix_tokens] * num,
                             source=f"{source}-prefix{shared_prefix_tokens}")
