"""Runs shared by the commands that would repeat them, within one process: `kvsim paper` (a block-size
sweep's point at block 16 is a latency curve's paged point), `kvsim report` (the tuner's run at block
16 is the report's paged run at the trace's own arrivals) and any two sweeps of one process.

A run is identified by everything that decides its result and nothing else (`point_key`):
- the resolved configuration (`SimConfig`, pickled whole: deployment, cache and scheduler fields, the
  engine profile, a calibration's numbers), so `block_size=16` and the default of 16 are one run;
- the workload: a preset's generator arguments (preset, rate, duration or request count, seed, time
  scale: the generator is deterministic), or a trace's content (every column, `source` excepted) with
  the point's cut and rescaling (`max_requests`, `rate`, `time_scale`, `duration_s`), and where the
  run may stop (`stop_above_s_per_token`: a run stopped early is not the whole run);
- the fleet and disaggregation keys of the point;
- the engine-profile fingerprint (`kvsim.planning.reports.provenance.profile_fingerprint`).
What a hit returns is the pair of column sets `kvsim.planning.sweep.runner.run_point` merges into a row (the
configuration's and the summary's), so the row built from it is the row the run would have made
(its `wall_s` and `sim_wall_s` are the original run's). Failed runs are not kept.

Kept in memory only: a result on disk would have to be tied to the exact code that made it (any change
to kvsim's sources moves results), and the commands that repeat runs repeat them inside one process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from kvsim.trace.table import Trace

#: Most runs kept (least recently used dropped first); a run's two column sets are a few kB.
MAX_RUNS = 4096

_RUNS: "OrderedDict[str, tuple[dict, dict]]" = OrderedDict()
_TRACE_DIGESTS: dict[int, tuple[Trace, str]] = {}     # id(trace) -> (trace, digest): kept alive with it
_ENABLED = [True]


def trace_digest(trace: Trace) -> str:
    """sha256 of a trace's requests: every column and attribute but `source` (a label)."""
    known = _TRACE_DIGESTS.get(id(trace))
    if known is not None and known[0] is trace:
        return known[1]
    digest = hashlib.sha256()
    for f in dataclasses.fields(trace):
        if f.name == "source":
            continue
        value = getattr(trace, f.name)
        digest.update(f.name.encode())
        if isinstance(value, np.ndarray):
            digest.update(f"{value.dtype}{value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        else:
            digest.update(repr(value).encode())
    text = digest.hexdigest()
    if len(_TRACE_DIGESTS) >= 8:                     # (each keeps its trace alive)
        _TRACE_DIGESTS.clear()
    _TRACE_DIGESTS[id(trace)] = (trace, text)
    return text


def _workload_id(point: Mapping[str, Any], trace: Trace | None) -> tuple:
    """What decides the trace `kvsim.planning.sweep.runner.workload` builds for `point` (as it reads it)."""
    def num(key: str) -> float | None:
        v = point.get(key)
        return None if v is None else float(v)

    if point.get("preset") is not None:
        count = point.get("num_requests")
        duration = None if count is not None else float(point.get("duration_s", 3600.0))
        return ("preset", str(point["preset"]), float(point.get("rate", 2.0)), duration,
                None if count is None else int(count), int(point.get("seed", 0)), num("time_scale"),
                num("stop_above_s_per_token"))
    if trace is None:
        raise ValueError("a trace point needs its trace")
    cut = point.get("max_requests")
    return ("trace", trace_digest(trace), None if cut is None else int(cut), num("rate"), num("time_scale"),
            num("duration_s"), num("stop_above_s_per_token"))


def point_key(point: Mapping[str, Any], trace: Trace | None) -> str | None:
    """The key of `point`'s run (`trace`: the trace it replays, None for a preset); None when the point
    cannot be keyed (its flags are refused: it runs and fails as a row of its own) or sharing is off."""
    from kvsim.planning.reports.provenance import profile_fingerprint
    from kvsim.planning.runs import make_config
    from kvsim.planning.sweep.grid import DISAGG_KEYS, WORKLOAD_KEYS
    from kvsim.fleet.config import FLEET_FLAGS

    if not _ENABLED[0]:
        return None
    try:
        flags = {k: v for k, v in point.items() if k not in WORKLOAD_KEYS and k not in DISAGG_KEYS
                 and k not in FLEET_FLAGS}
        config = make_config(None, **flags)
        extra = sorted((k, repr(v)) for k, v in point.items() if k in DISAGG_KEYS or k in FLEET_FLAGS)
        what = (pickle.dumps(config, protocol=5), _workload_id(point, trace), tuple(extra),
                profile_fingerprint())
    except Exception:  # noqa: BLE001 - an unkeyable point runs as usual (and reports its own error)
        return None
    return hashlib.sha256(pickle.dumps(what, protocol=5)).hexdigest()


def lookup(key: str | None) -> tuple[dict, dict] | None:
    """The (configuration columns, result columns) of the run `key` names, if kept."""
    if key is None or not _ENABLED[0]:
        return None
    parts = _RUNS.get(key)
    if parts is not None:
        _RUNS.move_to_end(key)
    return parts


def store(key: str | None, parts: tuple[dict, dict] | None) -> None:
    """Keep a successful run's column sets under `key`."""
    if key is None or parts is None or not _ENABLED[0]:
        return
    _RUNS[key] = parts
    _RUNS.move_to_end(key)
    while len(_RUNS) > MAX_RUNS:
        _RUNS.popitem(last=False)


def keep_run(flags: Mapping[str, Any], trace: Trace, summary: dict) -> None:
    """Keep a run made outside a sweep (`kvsim.simulate` of `trace` under run `flags`, its `summary`) as
    the sweep point of those flags on that trace would have made it: the configuration's columns are
    those of the point's flags as a grid reads them (`grid_points`)."""
    from kvsim.planning.runs import config_row, make_config, summary_row
    from kvsim.planning.sweep.grid import grid_points

    if not _ENABLED[0]:
        return
    try:
        point = grid_points({"seed": [flags.get("seed", 0)]}, {k: v for k, v in flags.items() if v is not None})[0]
        config = make_config(None, **point)
        if pickle.dumps(config, protocol=5) != pickle.dumps(make_config(None, **flags), protocol=5):
            return                                  # the grid reads a flag otherwise: not the same run
        key = point_key(point, trace)
        parts = (config_row(config), summary_row(summary))
    except Exception:  # noqa: BLE001 - a run that cannot be keyed is simply not shared
        return
    parts[1]["wall_s"] = summary.get("sim_wall_s", 0.0)
    store(key, parts)


def clear() -> None:
    """Forget every kept run."""
    _RUNS.clear()
    _TRACE_DIGESTS.clear()


def set_enabled(on: bool) -> bool:
    """Turn sharing on or off (off: every run is made again, nothing kept); returns the old setting."""
    old, _ENABLED[0] = _ENABLED[0], bool(on)
    return old


def kept() -> int:
    """How many runs are kept now."""
    return len(_RUNS)
