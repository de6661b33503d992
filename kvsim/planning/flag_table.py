"""Which run flags apply where, and the values each takes: one table that `kvsim run`, `kvsim report`,
`kvsim sweep` (`--set`, `--grid`) and the Python API (`kvsim.planning.runs.make_config`) all read.

A run is one engine, a fleet of replicas behind a router, or a prefill/decode (P/D) split (`Setup`).
Each `FlagRow` says what values its flag takes (names, or a lowest value) and when it applies; a flag
given where it cannot apply is refused naming it and why (`check_flags`), except where vLLM itself accepts
and ignores it, which is kept with a one-line note (`note_only`). Adding a flag is one row in `ROWS`.

>>> check_flags({"router": "least-kv"}, Setup("single"))
Traceback (most recent call last):
ValueError: --router: one engine has nothing to route (give --replicas N > 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvsim.fleet.config import MAX_UNITS, ROUTERS
from kvsim.fleet.disagg.kv_link import LINKS


@dataclass(frozen=True, slots=True)
class Setup:
    """The kind of run a set of flags describes: `mode` 'single', 'replicas' or 'pd'; the allocator and
    router; `hybrid`: whether the model has layers other than full attention (None: not known yet)."""

    mode: str = "single"
    allocator: str = "paged"
    router: str = "round-robin"
    hybrid: bool | None = None


def _always(s: Setup) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class FlagRow:
    """One run flag (`_` spelling): `values` the names it takes (empty: any); `low` its lowest value
    (`low_open`: excluded) and `high` its highest; `applies(setup)` whether it can change the run, `why` said when it cannot;
    `note_only`: vLLM accepts and ignores it there, so kvsim keeps it with a note instead of refusing."""

    flag: str
    values: tuple[str, ...] = ()
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    applies: Callable[[Setup], bool] = _always
    why: str = ""
    note_only: bool = False

    @property
    def option(self) -> str:
        return "--" + self.flag.replace("_", "-")


def _contiguous(s: Setup) -> bool:
    return s.allocator == "contiguous"


def _pd(s: Setup) -> bool:
    return s.mode == "pd"


def _fleet(s: Setup) -> bool:
    return s.mode == "replicas"


def _prefix_router(s: Setup) -> bool:
    return s.mode == "replicas" and s.router == "prefix-aware"


_PD_ONLY = "applies only to a P/D run (--prefill-replicas and --decode-replicas)"
_PREFIX = "only the prefix-aware router has this threshold (give --replicas N > 1 --router prefix-aware)"

#: The table. Order: the engine's flags, then the fleet's, then P/D's.
ROWS: tuple[FlagRow, ...] = (
    FlagRow("allocator", values=("paged", "contiguous", "jenga")),
    FlagRow("reserve", values=("max", "pow2", "oracle"), applies=_contiguous,
            why="only the contiguous allocator reserves ahead (give --allocator contiguous)"),
    FlagRow("placement", values=("buddy", "first-fit"), applies=_contiguous,
            why="only the contiguous allocator places extents (give --allocator contiguous)"),
    FlagRow("hybrid_kv_cache", applies=lambda s: s.allocator == "paged",
            why="only the paged allocator has vLLM's hybrid KV cache manager (contiguous reserves every "
                "layer as full attention; jenga is its own allocator)"),
    FlagRow("batching", values=("continuous", "static"), applies=lambda s: s.mode != "pd",
            why="disaggregated instances batch continuously"),
    FlagRow("preemption", values=("recompute", "swap")),
    FlagRow("sample_lengths", values=("equal", "uniform")),
    FlagRow("cpu_kv_gib", low=0.0),
    FlagRow("cpu_kv_policy", values=("evicted", "store-all")),
    FlagRow("dp", low=1, high=MAX_UNITS),           # data-parallel engines: one engine each, capped as replicas
    FlagRow("replicas", low=1, high=MAX_UNITS, applies=lambda s: s.mode != "pd",
            why="a P/D run is sized by --prefill-replicas and --decode-replicas"),
    FlagRow("router", values=ROUTERS, applies=_fleet, why="one engine has nothing to route (give --replicas N > 1)"),
    FlagRow("router_balance_abs", low=0, applies=_prefix_router, why=_PREFIX),
    FlagRow("router_balance_rel", low=1, applies=_prefix_router, why=_PREFIX),
    FlagRow("router_cache_threshold", low=0, applies=_prefix_router, why=_PREFIX),
    FlagRow("prefill_replicas", low=1, high=MAX_UNITS),
    FlagRow("decode_replicas", low=1, high=MAX_UNITS),
    FlagRow("kv_link", values=tuple(LINKS), applies=_pd, why=_PD_ONLY),
    FlagRow("prefill_tp", low=1, applies=_pd, why=_PD_ONLY),
    FlagRow("decode_tp", low=1, applies=_pd, why=_PD_ONLY),
    FlagRow("ttft_slo", low=0, low_open=True, applies=_pd, why=_PD_ONLY + "; only it reports SLO attainment"),
    FlagRow("tpot_slo", low=0, low_open=True, applies=_pd, why=_PD_ONLY + "; only it reports SLO attainment"),
)
TABLE: dict[str, FlagRow] = {row.flag: row for row in ROWS}


def setup_of(flags: Mapping[str, Any], hybrid: bool | None = None) -> Setup:
    """The `Setup` flat run flags describe (P/D when either side's replicas are given, a fleet when
    `replicas` > 1)."""
    if flags.get("prefill_replicas") is not None or flags.get("decode_replicas") is not None:
        mode = "pd"
    else:
        replicas = flags.get("replicas")
        mode = "replicas" if replicas is not None and _number(replicas) > 1 else "single"
    return Setup(mode, str(flags.get("allocator") or "paged"), str(flags.get("router") or "round-robin"), hybrid)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def check_value(flag: str, value: Any) -> None:
    """ValueError naming the flag when `value` is not one its row takes (None: not given, accepted)."""
    row = TABLE.get(flag)
    if row is None or value is None:
        return
    if row.values and str(value) not in row.values:
        raise ValueError(f"unknown {row.option} {value!r}; known: {', '.join(row.values)}")
    if row.low is not None:
        x = _number(value)
        ok = math.isfinite(x) and (x > row.low if row.low_open else x >= row.low)
        if not ok:
            raise ValueError(f"{row.option} {value}: must be a finite number {'>' if row.low_open else '>='} "
                             f"{row.low:g}")
    if row.high is not None and _number(value) > row.high:
        raise ValueError(f"{row.option} {value}: must be a whole number from 1 to {row.high:,} (the cap on "
                         "replicas and every other per-unit count; each is simulated in this process)")


def check_flags(given: Mapping[str, Any], setup: Setup) -> list[str]:
    """Check every flag in `given` (those the user gave, `_` spelling) against its row under `setup`:
    ValueError naming the first wrong value or the first flag that cannot apply, and why; the notes for
    flags kept although they change nothing (one line each)."""
    notes = []
    for flag, value in given.items():
        row = TABLE.get(flag)
        if row is None:
            continue
        check_value(flag, value)
        if not row.applies(setup):
            if row.note_only:
                notes.append(f"note: {row.option} has no effect here: {row.why}")
            else:
                raise ValueError(f"{row.option} {value}: {row.why}")
    if "hybrid_kv_cache" in given and setup.hybrid is False and setup.allocator == "paged":
        notes.append("note: --no-hybrid-kv-cache has no effect: every layer of the model is full attention "
                     "(vLLM accepts and ignores --disable-hybrid-kv-cache-manager there too)")
    return notes
