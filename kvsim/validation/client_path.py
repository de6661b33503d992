"""The client/server path: what a client-side TTFT holds besides the engine's queueing and prefill.

An HTTP client's request goes through the API server before the engine sees it (HTTP parsing, the chat
or completion template, tokenization of the prompt) and the first token comes back through it
(detokenization of the first chunk, the streamed HTTP chunk). kvsim's engine times start when the engine
receives the request, so a client-measured TTFT and e2e get this term added:

    client_path_s = fixed_s + per_prompt_token_s x prompt tokens + per_seq_s x running sequences

(running sequences: those the engine runs when the request arrives; the API server process detokenizes
and streams every running request's new token each step, so a new request's first chunk waits behind
them: the single API process's bottleneck, vllm PR #17546 and RFC #12705 in the engine-evidence
api_server rows. No public figure gives its size: the default is 0 and `kvsim calibrate` fits it.)

Default (central) values, from ../shared/calibration/engine-evidence/README.md, "What a time model can
take from this", row "API server added to TTFT (HTTP + tokenize + first stream chunk)": low 1 ms, central
3 ms + ~3 us per prompt token, high 15 ms + 20 us per token. That row is judgement on thin evidence:
the only component figures are a Hugging Face tokenizer at 10-21 us per token for a 131-token prompt
(tenstorrent/tt-inference-server issue #2173, not vLLM) and vLLM's API server running in its own
process since v0.6.0 (vLLM v0.6.0 blog, 2024-09-05), so the term is a separate, named parameter that
`kvsim calibrate` fits (`client_fixed_s`) where measured runs allow. Runs measured on the engine's own
clock (vLLM's queued_ts, no HTTP) get none of it. Seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Central figures of the evidence row cited above (seconds, seconds per prompt token).
CLIENT_FIXED_S = 3e-3
CLIENT_PER_PROMPT_TOKEN_S = 3e-6
#: The evidence row's low and high ends, for a sensitivity band.
CLIENT_LOW = (1e-3, 0.0)
CLIENT_HIGH = (15e-3, 20e-6)

#: Clients that time from their own send (the path applies) or from the engine's clock (it does not).
HTTP_CLIENTS = ("inference-perf", "vllm-bench-serve")


@dataclass(frozen=True, slots=True)
class ClientPath:
    """fixed_s + per_prompt_token_s x prompt tokens, added to TTFT and e2e of HTTP clients."""

    fixed_s: float = CLIENT_FIXED_S
    per_prompt_token_s: float = CLIENT_PER_PROMPT_TOKEN_S
    source: str = ("engine-evidence README, API-server row, central (3 ms + 3 us/prompt token); "
                   "judgement on thin evidence")
    per_seq_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_prompt_token_s", "per_seq_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"client path: {name} must be a finite number >= 0, got {value}")

    def seconds(self, prompt_tokens, client: str, running=0.0):
        """The term for requests of `prompt_tokens` arriving while `running` sequences run (numbers or
        numpy arrays) under `client`."""
        if client not in HTTP_CLIENTS:
            return 0.0 * prompt_tokens
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens + self.per_seq_s * running

    def to_dict(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_prompt_token_s": self.per_prompt_token_s,
                "per_seq_s": self.per_seq_s, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict | None, where: str) -> "ClientPath":
        """From a profile file's `client_path` object (absent: the default)."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"{where}: field 'client_path' must be an object")
        try:
            return cls(float(data.get("fixed_s", CLIENT_FIXED_S)),
                       float(data.get("per_prompt_token_s", CLIENT_PER_PROMPT_TOKEN_S)),
                       str(data.get("source", where)), float(data.get("per_seq_s", 0.0)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: field 'client_path': {exc}") from None


def running_at(step_time_s, step_running, arrival_s):
    """Sequences the engine runs when each request arrives: the running count of the last step that
    started at or before its arrival (0 before the first step). numpy arrays in, one out."""
    import numpy as np
    t = np.asarray(step_time_s, dtype=float)
    n = np.asarray(step_running, dtype=float)
    idx = np.searchsorted(t, np.asarray(arrival_s, dtype=float), side="right") - 1
    return np.where(idx >= 0, n[np.clip(idx, 0, max(len(n) - 1, 0))] if len(n) else 0.0, 0.0)


#: Bound of the fitted per-running-sequence term (seconds): a millisecond per stream would be a slower API
#: server than any measured here; a fit that wants more is pinned there.
MAX_PER_SEQ_S = 1e-3


def fit_client(rows, fallback: ClientPath) -> tuple[ClientPath, dict]:
    """`fixed_s` and `per_seq_s` (both >= 0; the per-token part kept at `fallback`'s) fitted to TTFT rows
    `(measured_s, engine_s, prompt_tokens, running)` (stage means of sustained HTTP-client runs: measured
    TTFT, the engine's predicted TTFT, the prompt, the sequences running at arrival), minimizing the sum of
    absolute relative TTFT errors: least absolute deviations, robust to a run whose TTFT holds something
    else (a stage near saturation). Exact: an optimum passes through two rows, or one on a bound, so the
    candidates are enumerated. Returns (path, {parameter: why kept at `fallback`'s value})."""
    import numpy as np
    why: dict = {}
    if len(rows) < 2:
        why["client_fixed_s"] = why["client_seq_s"] = (f"too few TTFT rows of sustained HTTP-client runs "
                                                        f"({len(rows)}): kept at the evidence value")
        return fallback, why
    meas, eng, prompt, n = (np.array(c, dtype=float) for c in zip(*rows))
    gap = meas - eng - fallback.per_prompt_token_s * prompt
    weight = 1.0 / meas

    def cost(c):
        return float(np.sum(np.abs(c[0] + c[1] * n - gap) * weight))

    cands = [(max(g, 0.0), 0.0) for g in gap]
    if len(rows) >= 4 and np.ptp(n) >= 0.1 * max(n.mean(), 1e-9):
        cands += [(0.0, min(g / m, MAX_PER_SEQ_S)) for g, m in zip(gap, n) if m > 0 and g > 0]
        for i in range(len(rows)):
            for j in range(i + 1, len(rows)):
                if n[i] != n[j]:
                    slope = (gap[j] - gap[i]) / (n[j] - n[i])
                    if 0.0 <= slope <= MAX_PER_SEQ_S and gap[i] - slope * n[i] >= 0:
                        cands.append((gap[i] - slope * n[i], slope))
    else:
        why["client_seq_s"] = ("not identifiable: too few TTFT rows or the running batch barely varies "
                               "across them: kept at 0")
    fixed, seq = min(cands, key=cost)
    return ClientPath(float(fixed), fallback.per_prompt_token_s,
                      f"kvsim calibrate: TTFT of {len(rows)} sustained stages (least absolute relative error)",
                      float(seq)), why
