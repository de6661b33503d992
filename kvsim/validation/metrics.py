"""Metrics as each client defines them, for measured and predicted runs alike (means; ms; requests/s).

- `e2e_ms`: send to the last token (inference-perf `request_latency`, vllm bench `e2el`; engine clock:
  last_token_ts - queued_ts).
- `ttft_ms`: send to the first streamed token (inference-perf and vllm bench: client side, with the
  client path of `kvsim.validation.client_path`; engine clock: first_token_ts - queued_ts).
- `itl_ms`: the sim-to-real study's ITL, (mean e2e - mean TTFT) / (mean output tokens - 1) with the
  client's own count of output tokens (inference-perf re-tokenizes the stream: ~0.85 x what was
  generated; the predicted figure divides by the same measured count, so comparing it is comparing
  mean e2e - mean TTFT). vllm bench serve's `mean_itl_ms` is the mean gap between streamed chunks,
  which with one token per chunk is the same quotient over all requests.
- `tpot_ms`: (mean e2e - mean TTFT) / (output_len - 1) with the tokens the server generated, the
  physical decode time per token (vllm bench serve's TPOT is the per-request mean of the same quotient).
- `throughput_rps`: finished requests over first send to last token.
"""

from __future__ import annotations

import numpy as np

#: Compared metrics, in table order.
METRICS = ("e2e_ms", "ttft_ms", "itl_ms", "tpot_ms", "throughput_rps")
#: The four the headline medians use.
HEADLINE = ("e2e_ms", "ttft_ms", "itl_ms", "throughput_rps")

DEFINITIONS = {
    "inference-perf": {
        "e2e_ms": "inference-perf request_latency: client send to last streamed chunk (mean)",
        "ttft_ms": "inference-perf time_to_first_token: client send to first chunk, incl. HTTP + tokenization (mean)",
        "itl_ms": "sim-to-real study ITL: (mean e2e - mean TTFT) / (client re-tokenized output count - 1)",
        "tpot_ms": "(mean e2e - mean TTFT) / (output_len - 1), generated tokens",
        "throughput_rps": "inference-perf successes.requests_per_sec: successes over the stage's span",
    },
    "vllm-engine": {
        "e2e_ms": "last_token_ts - queued_ts (vLLM engine clock, mean)",
        "ttft_ms": "first_token_ts - queued_ts (vLLM engine clock, mean; no client path)",
        "itl_ms": "(mean e2e - mean TTFT) / (mean output tokens - 1)",
        "tpot_ms": "per request (last - first token) / (output tokens - 1), mean",
        "throughput_rps": "requests over first queued to last token",
    },
    "vllm-bench-serve": {
        "e2e_ms": "vllm bench serve mean_e2el_ms: client send to last chunk",
        "ttft_ms": "vllm bench serve mean_ttft_ms: client send to first chunk, incl. HTTP + tokenization",
        "itl_ms": "vllm bench serve mean_itl_ms: mean gap between streamed chunks",
        "tpot_ms": "vllm bench serve mean_tpot_ms: per request (e2el - ttft) / (output tokens - 1), mean",
        "throughput_rps": "vllm bench serve request_throughput: completed over the benchmark duration",
    },
}


def summarize(arrival_s, first_s, finished_s, output_tokens, client_path_s, client_output_mean=None) -> dict:
    """The metrics (module docstring) of finished requests: arrays in seconds and tokens;
    `client_path_s` the client path per request (0 on the engine clock); `client_output_mean` the
    client's own mean output count (None: the generated counts)."""
    ok = np.isfinite(finished_s) & np.isfinite(first_s)
    if not ok.any():
        return {"finished": 0}
    arrival, first, done = arrival_s[ok], first_s[ok], finished_s[ok]
    path = np.broadcast_to(client_path_s, arrival_s.shape)[ok]
    out = output_tokens[ok].astype(float)
    ttft = (first - arrival + path) * 1e3
    e2e = (done - arrival + path) * 1e3
    decode = e2e.mean() - ttft.mean()
    counted = client_output_mean if client_output_mean is not None else out.mean()
    span = done.max() - arrival.min()
    multi = out > 1
    tpot = float(np.mean((e2e[multi] - ttft[multi]) / (out[multi] - 1))) if multi.any() else float("nan")
    return {"e2e_ms": float(e2e.mean()), "ttft_ms": float(ttft.mean()),
            "itl_ms": float(decode / (counted - 1)) if counted > 1 else float("nan"),
            "tpot_ms": tpot if client_output_mean is None else float(decode / (out.mean() - 1)),
            "throughput_rps": float(ok.sum() / span) if span > 0 else float("nan"),
            "finished": int(ok.sum())}


def measured_from_requests(rows, where: str) -> dict:
    """Whole-run metrics of per-request rows (arrival_s, output_tokens, ttft_ms, e2e_ms)."""
    try:
        arrival = np.array([float(r["arrival_s"]) for r in rows])
        ttft = np.array([float(r["ttft_ms"]) for r in rows]) / 1e3
        e2e = np.array([float(r["e2e_ms"]) for r in rows]) / 1e3
        out = np.array([int(r["output_tokens"]) for r in rows])
    except KeyError as exc:
        raise ValueError(f"{where}: every request needs field {exc.args[0]!r} to be compared") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: bad request field: {exc}") from None
    got = summarize(arrival, arrival + ttft, arrival + e2e, out, 0.0)
    got.pop("finished", None)
    return got


def predicted(result, trace, stage_of: np.ndarray, path_s, client_output_means: dict) -> dict:
    """{stage: metrics} of a kvsim run (stage -1 the whole run), per the client's definitions;
    `path_s` the client path per request (seconds); `client_output_means` {stage: the client's mean
    output count} where it re-counts tokens."""
    cols = result.request_columns
    done = np.array(cols["finished_s"], dtype=float)
    finished = np.array([s == "finished" for s in cols["status"]])
    done[~finished] = np.nan
    first = np.array(cols["first_token_s"], dtype=float)
    arrival = np.asarray(trace.arrival_s, dtype=float)
    out = np.asarray(cols["output_tokens"])
    stats = {-1: summarize(arrival, first, done, out, path_s, client_output_means.get(-1))}
    stages = np.unique(stage_of)
    for k in stages if len(stages) > 1 else ():
        m = stage_of == k
        stats[int(k)] = summarize(arrival[m], first[m], done[m], out[m],
                                  np.broadcast_to(path_s, arrival.shape)[m], client_output_means.get(int(k)))
    return stats
