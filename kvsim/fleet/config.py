"""The fleet's shape and routing policy (`FleetConfig`): how many replicas of the configured engine run
side by side and how the router picks one for each arriving request.

Routers (`ROUTERS`, kvsim/fleet/router.py): `round-robin` (Vidur's and SGLang's plain policy),
`least-requests` (fewest outstanding requests: Vidur's least-outstanding-requests global scheduler),
`least-kv` (least KV memory in use) and `prefix-aware` (the longest cached prefix unless the fleet is out
of balance; the thresholds follow SGLang's cache-aware router: `balance_abs`, `balance_rel`,
`cache_threshold`).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

ROUTERS = ("round-robin", "least-requests", "least-kv", "prefix-aware")

#: The one ceiling on every count that builds something per unit: replicas, prefill and decode replicas,
#: report fleets, GPUs searched, worker processes. Each replica is a whole engine (scheduler, allocator,
#: block tables) simulated in this one process; 1,024 engines of a 10-request trace already take seconds,
#: and a million took over a minute and 2.3 GB (issue 40).
MAX_UNITS = 1024


def check_units(value, flag: str) -> None:
    """ValueError naming `flag` unless `value` is a whole number in [1, MAX_UNITS]."""
    if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= MAX_UNITS:
        raise ValueError(f"{flag} {value}: must be a whole number from 1 to {MAX_UNITS:,} (the cap on "
                         "replicas and every other per-unit count; each is simulated in this process)")

#: SGLang router defaults (sgl-project/sglang, sgl-model-gateway/bindings/python/src/sglang_router/
#: router_args.py: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5; its first
#: release had 0.5, 32 and 1.0001).
BALANCE_ABS = 64
BALANCE_REL = 1.5
CACHE_THRESHOLD = 0.3


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """`replicas` engines (each the run's whole deployment: its TP GPUs, KV cache, scheduler, prefix
    cache) behind a `router`. Prefix-aware routing treats the fleet as out of balance when the most
    loaded replica has more than `balance_abs` outstanding requests above the least loaded AND more than
    `balance_rel` times as many; then the least loaded replica takes the request. Otherwise the replica
    holding the longest cached prefix does, when that prefix is at least `cache_threshold` of the
    prompt's shareable blocks (else the least loaded replica).

    >>> FleetConfig(4, "prefix-aware").balance_abs
    64
    """

    replicas: int = 1
    router: str = "round-robin"
    balance_abs: int = BALANCE_ABS
    balance_rel: float = BALANCE_REL
    cache_threshold: float = CACHE_THRESHOLD

    def __post_init__(self) -> None:
        check_units(self.replicas, "--replicas")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown --router {self.router!r}; known: {', '.join(ROUTERS)}")
        if self.balance_abs < 0:
            raise ValueError(f"--router-balance-abs must be >= 0 requests, got {self.balance_abs}")
        if not 1.0 <= self.balance_rel < float("inf"):
            raise ValueError(f"--router-balance-rel must be a finite ratio >= 1, got {self.balance_rel}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"--router-cache-threshold must be in [0, 1], got {self.cache_threshold}")


#: Run flags (and sweep grid keys) that shape the fleet, not one engine, with their types.
FLEET_FLAGS = {"replicas": int, "router": str, "router_balance_abs": int, "router_balance_rel": float,
               "router_cache_threshold": float}


def fleet_from_flags(flags) -> FleetConfig | None:
    """The `FleetConfig` of the `FLEET_FLAGS` among `flags` (strings, as from a command line, parsed),
    or None when `flags` has none of them. ValueError naming the flag when one is wrong."""
    given = {k: v for k, v in flags.items() if k in FLEET_FLAGS and v is not None}
    if not given:
        return None
    parsed = {}
    for key, value in given.items():
        kind = FLEET_FLAGS[key]
        try:
            parsed[key] = kind(value.strip()) if isinstance(value, str) else value
        except ValueError:
            raise ValueError(f"--{key.replace('_', '-')}: {value!r} is not a {kind.__name__}") from None
    return FleetConfig(parsed.get("replicas", 1), parsed.get("router", "round-robin"),
                       parsed.get("router_balance_abs", BALANCE_ABS), parsed.get("router_balance_rel", BALANCE_REL),
                       parsed.get("router_cache_threshold", CACHE_THRESHOLD))
