"""`kvsim run --prefill-replicas P --decode-replicas D`: the run command's disaggregated mode (options and
the handler; `kvsim.cli.app.run` hands over when either flag is given). Each instance gets the run's
memory flags (`--kv-gib`, `--num-blocks`, `--gpu-mem-util` describe one instance) and its side's TP.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from kvsim.files import check_output_file, write_json_atomic

PrefillReplicasOpt = typer.Option(None, "--prefill-replicas", help="Prefill/decode disaggregation: "
                                  "prefill instances (with --decode-replicas; DistServe).")
DecodeReplicasOpt = typer.Option(None, "--decode-replicas", help="Decode instances (with --prefill-replicas).")
PrefillTpOpt = typer.Option(None, "--prefill-tp", help="TP of each prefill instance (default: --tp).")
DecodeTpOpt = typer.Option(None, "--decode-tp", help="TP of each decode instance (default: --tp).")
KvLinkOpt = typer.Option("nvlink", "--kv-link", help="Link the KV cache crosses from prefill to decode: "
                         "nvlink, ib-400, roce-100, pcie, pcie5 (kvsim/fleet/disagg/kv_link.py cites each).")
TtftSloOpt = typer.Option(0.2, "--ttft-slo", help="TTFT SLO for the attainment, seconds.")
TpotSloOpt = typer.Option(0.1, "--tpot-slo", help="TPOT SLO for the attainment, seconds.")


def run_disaggregated(cfg, trace_path: Path, load, max_requests: Optional[int], prefill_replicas,
                      decode_replicas, prefill_tp, decode_tp, kv_link: str, ttft_slo: float, tpot_slo: float,
                      json_out: Optional[Path], quiet: bool, out: Optional[Path] = None) -> None:
    """Run the trace (`load()` reads it; its first `max_requests`) disaggregated; print the summary,
    write it with --json, and with --out write requests.csv, config.json and summary.json there. Exit 2
    on bad input."""
    from kvsim.cli.output import error
    from kvsim.fleet.disagg.plan import disagg_config
    from kvsim.fleet.disagg.slo import disagg_summary, run_disagg

    try:
        if json_out is not None:
            check_output_file(json_out, "--json")
        for flag, v in (("--ttft-slo", ttft_slo), ("--tpot-slo", tpot_slo)):
            if not v > 0:
                raise ValueError(f"{flag} must be > 0 seconds, got {v}")
        if cfg.scheduler.batching != "continuous":
            raise ValueError("--batching static: disaggregated instances batch continuously")
        dcfg = disagg_config(cfg, prefill_replicas, decode_replicas, prefill_tp, decode_tp, kv_link)
        dcfg.prefill.resolved(), dcfg.decode.resolved()
        tr = load()
        sim = run_disagg(tr if max_requests is None else tr.head(min(max_requests, len(tr))), dcfg)
    except ValueError as exc:
        error(str(exc))
    summary = disagg_summary(sim, ttft_slo, tpot_slo)
    if json_out is not None:
        write_json_atomic(json_out, summary, "--json")
    if out is not None:
        _write_folder(out, sim, dcfg, summary)
    if not quiet:
        typer.echo(_text(summary, trace_path.name, cfg.deployment.model.name, cfg.deployment.gpu.name))


def _write_folder(out: Path, sim, dcfg, summary: dict) -> None:
    """requests.csv (one row per request, `DisaggSim.request_columns`), config.json (both sides), then
    summary.json, each whole (`kvsim.cli.run_files.write_disagg_outputs`)."""
    import pandas as pd

    from kvsim.cli.run_files import write_disagg_outputs

    config = {"prefill": dcfg.prefill.to_dict(), "decode": dcfg.decode.to_dict(), "kv_link": dcfg.link.name,
              "prefill_replicas": dcfg.prefill_replicas, "decode_replicas": dcfg.decode_replicas}
    write_disagg_outputs(out, pd.DataFrame(sim.request_columns()), config, summary)


def _ms(stats: dict) -> str:
    if stats["p50"] is None:
        return "-"
    return f"p50 {stats['p50'] * 1e3:.1f} / p90 {stats['p90'] * 1e3:.1f} / p99 {stats['p99'] * 1e3:.1f} ms"


def _text(s: dict, trace: str, model: str, gpu: str) -> str:
    d = s["disaggregation"]
    return "\n".join([
        f"{trace}: {model} on {gpu}, {d['prefill_replicas']} prefill (TP {d['prefill_tp']}) : "
        f"{d['decode_replicas']} decode (TP {d['decode_tp']}) = {d['gpus']} GPUs, KV over {d['kv_link']}",
        f"requests      {s['finished']} finished / {s['requests']} ({s['rejected']} rejected)",
        f"TTFT          {_ms(s['ttft_s'])}",
        f"TPOT          {_ms(s['tpot_s'])}",
        f"KV transfers  {d['transfers']} ({d['transfer_bytes'] / 1e9:.2f} GB), {_ms(d['transfer_s'])}",
        f"held at prefill waiting for decode memory: {_ms(d['held_at_prefill_s'])}",
        f"SLO attainment {s['slo']['attainment']:.1%} (TTFT <= {s['slo']['ttft_s'] * 1e3:.0f} ms and "
        f"TPOT <= {s['slo']['tpot_s'] * 1e3:.0f} ms)"])


DisaggSearchOpt = typer.Option(False, "--disagg", help="With --gpus-for: search prefill/decode splits "
                               "(P + D instances per TP degree, fewest GPUs first, up to --max-gpus) beside "
                               "colocated replicas, against --ttft-slo/--tpot-slo at --slo-attainment; each "
                               "layout judged at steady state (queue trend, batch means of the attainment; a "
                               "--preset trace doubled up to --max-span while undecided).")
AttainmentOpt = typer.Option(0.9, "--slo-attainment", help="--disagg: fraction of requests that must meet "
                             "both SLOs (DistServe: 0.9).")
MaxGpusOpt = typer.Option(16, "--max-gpus", min=2, help="--disagg: most GPUs tried per TP degree.")


def capacity_disagg(trace: Optional[Path], preset: Optional[str], rate: Optional[float], tp_options: str,
                    duration: float, seed: int, flags: dict, kv_link: str, ttft_slo: float, tpot_slo: float,
                    target: float, max_gpus: int, json_out: Optional[Path], max_span: float = 3600.0,
                    rel_tol: float = 0.05) -> None:
    """`kvsim capacity --gpus-for R --disagg`: the P:D split search (`kvsim.fleet.disagg.plan`), each
    layout judged at steady state (a --preset trace doubled up to --max-span while undecided), printed
    as a table and written with --json. Raises ValueError on bad input (the caller exits 2)."""
    from functools import partial

    from kvsim.fleet.disagg.plan import split_search
    from kvsim.planning.rate.fleet_steady import judge_attainment
    from kvsim.planning.runs import make_config

    if rate is None:
        raise ValueError("--disagg needs --gpus-for RATE")
    if json_out is not None:
        check_output_file(json_out, "--json")
    longer = None
    if trace is not None:
        from kvsim.trace.formats import load_trace
        tr = load_trace(trace)
    else:
        from kvsim.trace.synthetic import generate
        tr = generate(preset or "sharegpt", rate_rps=rate, duration_s=duration, seed=seed)

        def longer(span_s: float):                   # a layout not decided yet: the workload over span_s s
            return generate(preset or "sharegpt", rate_rps=rate, duration_s=span_s, seed=seed)
    options = [int(x) for x in tp_options.split(",") if x.strip()]
    long = _too_long(tr, make_config(**flags), target)
    if long.endswith("target"):
        raise ValueError(f"{long}: lower --slo-attainment, or raise --max-model-len where the model allows")
    dropped: list[str] = [long] if long else []
    for line in dropped:
        print(f"note: {line}", file=sys.stderr, flush=True)

    def say(message: str) -> None:                   # progress on stderr; what was dropped, kept
        print(message, file=sys.stderr, flush=True)
        if " dropped" in message:
            dropped.append(message.removeprefix("disagg: "))
    steady = partial(judge_attainment, duration_s=None if trace is not None else duration, rate_rps=rate,
                     max_excess=rel_tol / 2, max_span_s=max_span)
    rows = split_search(tr, make_config(**flags), rate, tp_options=options, max_gpus=max_gpus,
                        kv_link=kv_link, ttft_slo=ttft_slo, tpot_slo=tpot_slo, target=target, progress=say,
                        steady=steady, longer=longer)
    typer.echo(_table(rows, rate, target, ttft_slo, tpot_slo, kv_link))
    for line in dropped:
        typer.echo(f"  {line}")
    if json_out is not None:
        write_json_atomic(json_out, {"gpus_disagg": rows, "dropped": dropped})


def _too_long(tr, cfg, target: float) -> str:
    """'' or the requests of `tr` longer than the model's maximum (every layout rejects them, and the
    attainment counts them as misses): how many, and the highest attainment any layout can reach."""
    max_len = cfg.deployment.model.max_seq_len
    long = int((tr.prompt_tokens + tr.output_tokens > max_len).sum())
    if not long:
        return ""
    ceiling = 1 - long / len(tr)
    return (f"{long:,} of {len(tr):,} requests are longer than {cfg.deployment.model.name}'s maximum ({max_len:,} "
            f"tokens, prompt + output): every layout rejects them, so no layout attains more than {ceiling:.1%}"
            + (f", below the {target:.0%} target" if ceiling < target else f" (the target is {target:.0%})"))


def _table(rows: list[dict], rate: float, target: float, ttft_slo: float, tpot_slo: float, kv_link: str) -> str:
    """The split search's rows: attainment over the whole trace, its steady-state lower bound (95 %,
    one-sided, over the second half; '-' when a window held too few requests to judge), the span
    judged on, the verdict; then the answer in a sentence with its uncertainty."""
    lines = [f"GPUs for {rate} req/s with {target:.0%} of requests within TTFT {ttft_slo * 1e3:.0f} ms and "
             f"TPOT {tpot_slo * 1e3:.0f} ms (KV over {kv_link}), each layout judged at steady state:",
             f"{'tp':>3} {'gpus':>5} {'split':>12} {'attainment':>11} {'95% low':>8} {'judged on s':>12}  verdict"]
    for r in rows:
        split = "colocated" if r["prefill"] == 0 else f"{r['prefill']}P:{r['decode']}D"
        low = "-" if r.get("attainment_low") is None else f"{r['attainment_low']:.1%}"
        verdict = ("meets" if r["meets"] else "misses") + (f" ({r['note'].split(':')[0]})" if r["note"] else "")
        lines.append(f"{r['tp']:>3} {r['gpus']:>5} {split:>12} {r['attainment']:>10.1%} {low:>8} "
                     f"{r['span_s']:>12.0f}  {verdict}{'  <- best' if r['best'] else ''}")
    best = next(r for r in rows if r["best"])
    split = "colocated" if best["prefill"] == 0 else f"{best['prefill']}P:{best['decode']}D"
    if best.get("attainment_low") is not None:
        how = f"at steady state at least {best['attainment_low']:.1%} (95 % one-sided)"
    elif "window_requests" in best:
        need = best["window_requests_needed"]
        how = (f"{best['note'] or 'not judged at steady state'}; the fewest requests in a window of its second "
               f"half: {best['window_requests']:,}, where batch means need "
               + (f"{need:,.0f}" if need < float("inf") else "an unbounded number (a 100% target)"))
    else:
        how = "on the trace as given"
    lines.append(f"answer: TP {best['tp']}, {best['gpus']} GPUs, {split}: attainment {best['attainment']:.1%} "
                 f"over {best['span_s']:.0f} s of arrivals; {how}")
    return "\n".join(lines)
