"""Before a sweep runs: can its points' configurations be served at all?

Each distinct configuration of the grid (its run flags, as `kvsim.planning.sweep.point.run_point` builds
it: `make_config`, the engine profile's resolution, the KV cache sized as `build_run` sizes it) is built
once, without simulating. When no point can be served (`--grid model=llama-2-70b` on one A100, a
`tp` that splits no head evenly), the sweep stops with that error, exit 2, before anything runs or is
written; when only some cannot, they stay failed rows of their own (a grid over TP degrees may mean to
show which hold the weights) and the caller is warned once, up front.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence


def unservable(points: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(index, error) of the points whose configuration cannot be built or sized."""
    from kvsim.fleet.config import FLEET_FLAGS
    from kvsim.planning.runs import capacity_tokens, make_config
    from kvsim.planning.sweep.grid import DISAGG_KEYS, WORKLOAD_KEYS

    seen: dict[str, str | None] = {}
    bad = []
    for i, point in enumerate(points):
        flags = {k: v for k, v in point.items() if k not in WORKLOAD_KEYS and k not in DISAGG_KEYS
                 and k not in FLEET_FLAGS}
        key = json.dumps(flags, sort_keys=True, default=str)
        if key not in seen:
            try:
                cfg = make_config(**flags).resolved()
                if cfg.cache.allocator != "jenga":          # (Jenga sizes its own pool from the GPU)
                    capacity_tokens(cfg)
                seen[key] = None
            except (ValueError, OSError) as exc:
                seen[key] = str(exc)
        if seen[key] is not None:
            bad.append((i, seen[key]))
    return bad


def check_servable(points: Sequence[Mapping[str, Any]], warn: Callable[[str], None]) -> None:
    """ValueError when no point can be served; `warn` once when some cannot."""
    bad = unservable(points)
    if not bad:
        return
    if len(bad) == len(points):
        raise ValueError(f"no point of the grid can be served: {bad[0][1]}")
    warn(f"{len(bad)} of {len(points)} grid points cannot be served and will be failed rows (first: "
         f"{bad[0][1]})")
