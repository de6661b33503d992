"""The client/server path: what a client-side TTFT holds besides the engine's queueing and prefill.

An HTTP client's request goes through the API server before the engine sees it (HTTP parsing, the chat
or completion template, tokenization of the prompt) and the first token comes back through it
(detokenization of the first chunk, the streamed HTTP chunk). kvsim's engine times start when the engine
receives the request, so a client-measured TTFT and e2e get this term added:

    client_path_s = fixed_s + per_prompt_token_s x prompt tokens

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

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_prompt_token_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"client path: {name} must be a finite number >= 0, got {value}")

    def seconds(self, prompt_tokens, client: str):
        """The term for requests of `prompt_tokens` (a number or numpy array) under `client`."""
        if client not in HTTP_CLIENTS:
            return 0.0 * prompt_tokens
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens

    def to_dict(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_prompt_token_s": self.per_prompt_token_s, "source": self.source}

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
                       str(data.get("source", where)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: field 'client_path': {exc}") from None


def fit_client(rows, fallback: ClientPath) -> tuple[ClientPath, dict]:
    """`fixed_s` (>= 0; the per-token part kept at `fallback`'s) fitted to TTFT rows `(measured_s,
    engine_s, prompt_tokens)` (stage means of sustained HTTP-client runs: the measured TTFT, the engine's
    TTFT the fitted profile predicts, the prompt), minimizing the sum of absolute relative TTFT errors: a
    weighted median of the gaps (weights 1 / measured TTFT), robust to a stage whose TTFT holds something
    else (a server near saturation queues). Returns (path, {"client_fixed_s": why kept} or {})."""
    import numpy as np
    if len(rows) < 2:
        return fallback, {"client_fixed_s": f"too few TTFT rows of sustained HTTP-client runs ({len(rows)}): "
                                            "kept at the evidence value"}
    meas, eng, prompt = (np.array(c, dtype=float) for c in zip(*rows))
    gap = meas - eng - fallback.per_prompt_token_s * prompt
    order = np.argsort(gap, kind="stable")
    weight = np.cumsum((1.0 / meas)[order])
    fixed = max(float(gap[order][np.searchsorted(weight, weight[-1] / 2)]), 0.0)   # the weighted median
    return ClientPath(fixed, fallback.per_prompt_token_s,
                      f"kvsim calibrate: weighted median TTFT gap over {len(rows)} sustained stages"), {}
