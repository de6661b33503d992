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

Engine-side metrics (`ENGINE_METRICS`), from vLLM v1's per-request timestamps on the engine clock
(`RequestStateStats`: queued_ts when the engine core queues the request, scheduled_ts when it is first
scheduled, first_token_ts and last_token_ts when the steps that emit those tokens end; the intervals of
`IterationStats.update_from_finished_request`, exported as `vllm:request_*_time_seconds`):
- `queue_ms` = scheduled_ts - queued_ts; `prefill_ms` = first_token_ts - scheduled_ts (a preemption
  before the first token included); `decode_ms` = last_token_ts - first_token_ts;
- `engine_ttft_ms` = first_token_ts - queued_ts (LLMServingSim's TTFT; vLLM's own TTFT histogram starts
  at the front end's arrival_time instead, before tokenization).
kvsim's per-request times are these: arrival_s is queued_ts (kvsim's clock starts when the engine gets
the request), admitted_s is scheduled_ts (the start of the step that first admits it), first_token_s and
finished_s the ends of the steps that emit the first and the last token. Means over finished requests, ms.
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

#: Engine-side metrics (module docstring), in table order, and their definitions.
ENGINE_METRICS = ("queue_ms", "engine_ttft_ms", "prefill_ms", "decode_ms")
ENGINE_FORMULAS = {"queue_ms": "scheduled_ts - queued_ts", "engine_ttft_ms": "first_token_ts - queued_ts",
                   "prefill_ms": "first_token_ts - scheduled_ts", "decode_ms": "last_token_ts - first_token_ts"}
ENGINE_DEFINITIONS = {
    "queue_ms": f"{ENGINE_FORMULAS['queue_ms']}: engine queue to first scheduling (vLLM v1 RequestStateStats, "
                "vllm:request_queue_time_seconds; mean)",
    "engine_ttft_ms": f"{ENGINE_FORMULAS['engine_ttft_ms']}: engine TTFT, no client path (LLMServingSim's "
                      "TTFT; mean)",
    "prefill_ms": f"{ENGINE_FORMULAS['prefill_ms']} (vllm:request_prefill_time_seconds; preemptions before the "
                  "first token included; mean)",
    "decode_ms": f"{ENGINE_FORMULAS['decode_ms']} (vllm:request_decode_time_seconds; mean)",
}
#: vLLM's per-request timestamp names (seconds, any common origin), as a per-request row may carry them.
TIMESTAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


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


def engine_summary(queued_s, scheduled_s, first_s, last_s) -> dict:
    """The engine-side metrics (ms, means) of the requests with all four times finite (seconds)."""
    q, s, f, last = (np.asarray(a, dtype=float) for a in (queued_s, scheduled_s, first_s, last_s))
    ok = np.isfinite(q) & np.isfinite(s) & np.isfinite(f) & np.isfinite(last)
    if not ok.any():
        return {}
    q, s, f, last = q[ok], s[ok], f[ok], last[ok]
    return {"queue_ms": float((s - q).mean() * 1e3), "engine_ttft_ms": float((f - q).mean() * 1e3),
            "prefill_ms": float((f - s).mean() * 1e3), "decode_ms": float((last - f).mean() * 1e3)}


def _column(rows, key: str, where: str) -> np.ndarray:
    values = []
    for k, row in enumerate(rows):
        if key not in row:
            raise ValueError(f"{where}: request {k + 1} has no field {key!r} (other requests carry it)")
        try:
            values.append(float(row[key]))
        except (TypeError, ValueError):
            raise ValueError(f"{where}: request {k + 1}: field {key!r} must be a number, got {row[key]!r}") from None
    return np.array(values)


def _ordered(earlier: np.ndarray, later: np.ndarray, names: tuple[str, str], where: str) -> None:
    bad = np.flatnonzero(later < earlier - 1e-6)        # (a microsecond for rounding)
    if len(bad):
        raise ValueError(f"{where}: request {bad[0] + 1}: field {names[1]!r} ({later[bad[0]]}) is before "
                         f"{names[0]!r} ({earlier[bad[0]]})")


def engine_from_requests(rows, client: str, where: str) -> dict:
    """The engine-side metrics of per-request rows that carry them: vLLM's four timestamps (`TIMESTAMPS`)
    give all four; on the engine clock (`client` vllm-engine: ttft_ms and e2e_ms from queued_ts) the rows
    give engine TTFT and decode, and with `queue_ms` the queue and prefill too; an HTTP client's rows give
    only `queue_ms` where they have it. {} when they carry none. A field some rows lack, or times out of
    order, is a ValueError naming the request and field."""
    if any(key in row for row in rows for key in TIMESTAMPS):
        q, s, f, last = (_column(rows, key, where) for key in TIMESTAMPS)
        for a, b, names in ((q, s, TIMESTAMPS[:2]), (s, f, TIMESTAMPS[1:3]), (f, last, TIMESTAMPS[2:])):
            _ordered(a, b, names, where)
        return engine_summary(q, s, f, last)
    out = {}
    queue = _column(rows, "queue_ms", where) if any("queue_ms" in row for row in rows) else None
    if client == "vllm-engine":
        ttft, e2e = _column(rows, "ttft_ms", where), _column(rows, "e2e_ms", where)
        _ordered(ttft, e2e, ("ttft_ms", "e2e_ms"), where)
        out = {"engine_ttft_ms": float(ttft.mean()), "decode_ms": float((e2e - ttft).mean())}
        if queue is not None:
            _ordered(queue, ttft, ("queue_ms", "ttft_ms"), where)
            out["prefill_ms"] = float((ttft - queue).mean())
    if queue is not None:
        out["queue_ms"] = float(queue.mean())
    return out


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
    admitted = np.asarray(cols.get("admitted_s", np.full(len(arrival), np.nan)), dtype=float)
    stats = {-1: {**summarize(arrival, first, done, out, path_s, client_output_means.get(-1)),
                  **engine_summary(arrival, admitted, first, done)}}
    stages = np.unique(stage_of)
    for k in stages if len(stages) > 1 else ():
        m = stage_of == k
        stats[int(k)] = {**summarize(arrival[m], first[m], done[m], out[m],
                                     np.broadcast_to(path_s, arrival.shape)[m], client_output_means.get(int(k))),
                         **engine_summary(arrival[m], admitted[m], first[m], done[m])}
    return stats
