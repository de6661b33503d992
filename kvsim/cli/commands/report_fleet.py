"""`kvsim report`'s fleet options (`--replicas 4,16 --routers ... --pd 1:3,2:2 --fleet-only`), checked
before any run, and the section they add (kvsim/planning/studies/fleet_report.py)."""

from __future__ import annotations

from typing import Optional

import typer

from kvsim.fleet.config import MAX_UNITS as MAX_REPLICAS   # the one cap on per-unit counts

FleetReplicasOpt = typer.Option(None, "--replicas", help="Add a fleet section: fleets of these many replicas "
                                "(comma-separated, e.g. 4,16), each the whole deployment, behind each of --routers.")
RoutersOpt = typer.Option("round-robin,least-requests,least-kv,prefix-aware", "--routers",
                          help="--replicas: the routers compared (comma-separated; docs/fleet.md).")
PdOpt = typer.Option(None, "--pd", help="--replicas: also prefill/decode splits P:D (comma-separated, e.g. "
                     "1:3,2:2) against colocated fleets of the same GPUs.")
KvLinkOpt = typer.Option("nvlink", "--kv-link", help="--pd: the link the KV caches cross (kvsim/fleet/disagg/kv_link.py).")
TtftSloOpt = typer.Option(0.2, "--ttft-slo", help="--replicas: TTFT SLO of the attainment column, seconds.")
TpotSloOpt = typer.Option(0.1, "--tpot-slo", help="--replicas: TPOT SLO of the attainment column, seconds.")
FleetOnlyOpt = typer.Option(False, "--fleet-only", help="--replicas: leave out the single-engine sections "
                            "(systems, latency against rate, block size).")


def fleet_request(replicas: Optional[str], routers: str, pd: Optional[str], kv_link: str, ttft_slo: float,
                  tpot_slo: float, fleet_only: bool) -> dict | None:
    """The fleet section's arguments (`fleet_section`'s keywords), or None without --replicas;
    ValueError naming the flag when one is wrong."""
    from kvsim.fleet.config import ROUTERS
    from kvsim.fleet.disagg.kv_link import get_link

    from kvsim.cli.run_flags import given_flags
    given = given_flags()             # (what the command line gave; a default changes nothing)
    if replicas is None:
        for flag, name in (("--pd", "pd"), ("--fleet-only", "fleet_only"), ("--routers", "routers"),
                           ("--kv-link", "kv_link"), ("--ttft-slo", "ttft_slo"), ("--tpot-slo", "tpot_slo")):
            if name in given:
                raise ValueError(f"{flag} needs --replicas (the fleet section)")
        return None
    if pd is None and "kv_link" in given:
        raise ValueError("--kv-link needs --pd (only prefill/decode splits move KV between instances)")
    sizes = _whole(replicas, "--replicas")
    names = [r.strip() for r in routers.split(",") if r.strip()]
    bad = [r for r in names if r not in ROUTERS]
    if not names or bad:
        raise ValueError(f"--routers {routers!r}: give routers from {', '.join(ROUTERS)}")
    splits = []
    for part in (pd or "").split(","):
        if part.strip():
            p, _, d = part.partition(":")
            pair = _whole(f"{p},{d}", "--pd") if d else []
            if len(pair) != 2:
                raise ValueError(f"--pd {pd!r}: give P:D pairs of whole numbers >= 1, e.g. 1:3,2:2")
            splits.append((pair[0], pair[1]))
    for flag, v in (("--ttft-slo", ttft_slo), ("--tpot-slo", tpot_slo)):
        if not 0 < v < float("inf"):
            raise ValueError(f"{flag} must be a number of seconds > 0, got {v}")
    get_link(kv_link)
    return {"replicas": sizes, "routers": list(dict.fromkeys(names)), "splits": splits, "kv_link": kv_link,
            "ttft_slo": ttft_slo, "tpot_slo": tpot_slo}


def _whole(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated whole numbers") from None
    if not values or any(not 1 <= v <= MAX_REPLICAS for v in values):
        raise ValueError(f"{flag} {text!r}: every value must be from 1 to {MAX_REPLICAS:,}")
    return values
