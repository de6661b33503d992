"""The keys a sweep grid may vary, each with its type, and the grid's points, checked before any run.

A grid key is a run flag (`kvsim.planning.runs`; its type read from the config dataclasses) or a
workload key (`WORKLOAD_KEYS`, listed here with its type and range). Every value is converted to its
key's type up front: `block_size="abc"` or `rate=-1` stops the sweep with one ValueError naming the key
and the value, before anything runs or is written. A key given twice (`block-size` and `block_size`,
`tp` and `tensor_parallel_size`) and a value listed twice are errors. A value a config refuses
(`block_size=0`) is still a failed row of its own, not a stopped grid.

To add a key that is not a run flag (e.g. a fleet's `replicas`), add one `GridKey` line to
`WORKLOAD_KEYS`, and read it where the point runs (`kvsim.planning.sweep.runner.run_point`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from kvsim.planning.runs import flag_types, normalize_flag
from kvsim.planning.vllm_flags import IGNORED

#: Most requests one grid point may simulate (`num_requests`, or `rate` x `duration_s` arrivals): a
#: sanity ceiling, about a day of a 12 req/s service, that stops a typo from running out of memory.
MAX_POINT_REQUESTS = 1_000_000


@dataclass(frozen=True)
class GridKey:
    """A grid key's type: kind is 'int', 'float', 'bool', 'str' or 'path' (an existing trace file);
    `positive` refuses values <= 0; `optional` accepts none/null."""

    kind: str
    positive: bool = False
    optional: bool = False


#: Grid keys that shape the workload rather than the configuration (trace and preset exclude each other).
WORKLOAD_KEYS: dict[str, GridKey] = {
    "trace": GridKey("path"),                       # a trace file, any format `kvsim run` reads
    "preset": GridKey("str"),                       # Poisson arrivals of a length preset
    "rate": GridKey("float", positive=True),        # req/s (a trace is rescaled to it)
    "time_scale": GridKey("float", positive=True),  # arrival times multiplied by it
    "duration_s": GridKey("float", positive=True),  # s of arrivals (a trace is cut there)
    "num_requests": GridKey("int", positive=True),  # requests of a preset
    "max_requests": GridKey("int", positive=True),  # first requests of a trace
    # not the workload but how far to run it: stop once normalized latency is surely above this (s/token;
    # kvsim.planning.sweep.latency_ceiling), the row then says so instead of holding the run's metrics
    "stop_above_s_per_token": GridKey("float", positive=True, optional=True),
}

#: Grid keys of a disaggregated run (`kvsim.fleet.disagg.plan`; a point with `prefill_replicas` or
#: `decode_replicas` runs one): replicas and TP per side, the KV link's name, the SLOs (s).
DISAGG_KEYS: dict[str, GridKey] = {
    "prefill_replicas": GridKey("int", positive=True, optional=True),
    "decode_replicas": GridKey("int", positive=True, optional=True),
    "prefill_tp": GridKey("int", positive=True, optional=True),
    "decode_tp": GridKey("int", positive=True, optional=True),
    "kv_link": GridKey("str"),
    "ttft_slo": GridKey("float", positive=True, optional=True),
    "tpot_slo": GridKey("float", positive=True, optional=True),
}


#: Grid keys of a fleet (`kvsim.fleet.config.FLEET_FLAGS`; a point with any of them runs replicas
#: behind a router); `cpu_kv_gib` is a run flag.
FLEET_KEYS: dict[str, GridKey] = {
    "replicas": GridKey("int", positive=True),
    "router": GridKey("str"),
    "router_balance_abs": GridKey("int"),
    "router_balance_rel": GridKey("float", positive=True),
    "router_cache_threshold": GridKey("float"),
}


def grid_keys() -> dict[str, GridKey]:
    """Every key a grid (or `base`) may hold, with its type: the run flags, then the workload keys."""
    keys = {}
    for flag, annotation in flag_types().items():
        kind = next((k for k in ("bool", "int", "float") if k in annotation), "str")
        keys[flag] = GridKey("path" if flag in ("model_config", "calibration") else kind,
                             optional="None" in annotation)
    ignored = {name: GridKey("str", optional=True) for name in IGNORED}   # vLLM flags kvsim ignores: accepted
    return {**ignored, **keys, **WORKLOAD_KEYS, **DISAGG_KEYS, **FLEET_KEYS}


def coerce(key: str, value: Any, spec: GridKey) -> Any:
    """`value` as `spec`'s type (strings from the command line parsed); ValueError naming `key`."""
    text = value.strip() if isinstance(value, str) else value
    if spec.optional and (text is None or (isinstance(text, str) and text.lower() in ("none", "null"))):
        return None
    what = f"grid key {key}: {value!r}"
    if spec.kind == "bool":
        if isinstance(text, bool) or text in (0, 1):
            return bool(text)
        if isinstance(text, str) and text.lower() in ("true", "yes", "on", "false", "no", "off"):
            return text.lower() in ("true", "yes", "on")
        raise ValueError(f"{what} is not true/false")
    if spec.kind in ("int", "float"):
        number = _number(text, what, spec.kind)
        if spec.positive and number <= 0:
            raise ValueError(f"{what} must be > 0")
        return number
    if text is None or isinstance(text, (bool, list, dict)) or str(text) == "":
        raise ValueError(f"{what} is not a {'file name' if spec.kind == 'path' else 'name'}")
    if isinstance(text, (str, int, float)) or spec.kind == "path":
        return str(text)
    return text                   # an object from the Python API (an EngineProfile): make_config's to judge


def _number(text: Any, what: str, kind: str) -> int | float:
    if isinstance(text, bool) or not isinstance(text, (numbers.Real, str)):
        raise ValueError(f"{what} is not a number")
    if isinstance(text, numbers.Real) and not isinstance(text, (int, float)):     # numpy scalars
        text = int(text) if isinstance(text, numbers.Integral) else float(text)
    try:
        number = float(text) if isinstance(text, str) else text
    except ValueError:
        raise ValueError(f"{what} is not a{'' if kind == 'float' else ' whole'} number") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} is not a finite number")
    if kind == "int":
        if float(number) != int(number):
            raise ValueError(f"{what} is not a whole number")
        return int(number)
    if isinstance(text, str) and float(number).is_integer() and "." not in text and "e" not in text.lower():
        return int(number)                    # "12" -> 12, as the command line always gave it
    return number


def _normalized(flags: Mapping[str, Any], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in flags.items():
        key = normalize_flag(name)
        if key in out:
            raise ValueError(f"{what} names {key!r} twice; give all its values once")
        out[key] = value
    return out


def grid_points(grid: Mapping[str, Sequence], base: Mapping[str, Any] | None = None) -> list[dict]:
    """The cross product of `grid` (in key order, last key fastest), each point merged over `base`,
    every value converted to its key's type.

    >>> grid_points({"block_size": [8, "16"], "allocator": ["paged"]}, {"kv_gib": 12})
    [{'kv_gib': 12, 'block_size': 8, 'allocator': 'paged'}, {'kv_gib': 12, 'block_size': 16, 'allocator': 'paged'}]
    """
    known = grid_keys()
    grid, base = _normalized(grid, "the grid"), _normalized(base or {}, "the fixed flags")
    if not grid:
        raise ValueError("empty grid: give at least one --grid flag=v1,v2")
    for key in [*grid, *base]:
        if key not in known:
            raise ValueError(f"unknown flag {key!r} in the grid; known: {', '.join(sorted(known))}")
    base = {k: coerce(k, v, known[k]) for k, v in base.items()}
    values: dict[str, list] = {}
    for key, vals in grid.items():
        if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence):
            vals = [vals]
        values[key] = [coerce(key, v, known[key]) for v in vals]
        if not values[key]:
            raise ValueError(f"empty grid: flag {key!r} has no values")
        seen = [json.dumps(v) for v in values[key]]
        if len(set(seen)) < len(seen):
            twice = next(v for v in seen if seen.count(v) > 1)
            raise ValueError(f"grid key {key} lists {twice} twice")
    points = [{**base, **dict(zip(values, combo))} for combo in itertools.product(*values.values())]
    for point in points:
        check_workload(point)
    check_applies(points, {**{k: [v] for k, v in base.items()}, **values})
    return points


def check_applies(points: list[dict], values: Mapping[str, list]) -> None:
    """The flag table's checks (`kvsim.planning.flag_table`, as `kvsim run` applies them) before any
    run: every value one its key takes (`allocator=bogus`, `router=bogus`, `cpu_kv_gib=-1` stop the grid),
    and every key applies to at least one point (`router` with one replica everywhere does not)."""
    from kvsim.planning.flag_table import TABLE, check_value, setup_of
    for key, vals in values.items():
        for v in vals:
            try:
                check_value(key, v)
            except ValueError as exc:
                raise ValueError(f"grid key {key}: {exc}") from None
        row = TABLE.get(key)
        if row is not None and not any(row.applies(setup_of(p)) for p in points):
            raise ValueError(f"grid key {key}: {row.why}")


def check_workload(point: Mapping[str, Any], have_trace: bool = False) -> None:
    """ValueError unless `point` names one workload its keys apply to (`have_trace`: a Trace is given)."""
    trace = have_trace or point.get("trace") is not None
    if point.get("preset") is not None:
        if trace:
            raise ValueError("give a trace or a preset, not both (grid keys trace and preset)")
        from kvsim.trace.synthetic import PRESETS
        if point["preset"] not in PRESETS:
            raise ValueError(f"grid key preset: unknown preset {point['preset']!r}; known: {', '.join(PRESETS)}")
        if point.get("max_requests") is not None:
            raise ValueError("grid key max_requests cuts a trace; a preset takes num_requests")
        num = point.get("num_requests")
        if num is None:
            num = point.get("rate", 2.0) * point.get("duration_s", 3600.0)
        if num > MAX_POINT_REQUESTS:
            raise ValueError(f"a grid point would simulate {num:,.0f} requests, more than the ceiling of "
                             f"{MAX_POINT_REQUESTS:,}; lower num_requests, rate or duration_s")
    elif trace and point.get("num_requests") is not None:
        raise ValueError("grid key num_requests sizes a preset; a trace takes max_requests")


def run_id(point: Mapping[str, Any]) -> str:
    """A stable 12-hex-digit id of a grid point (the same point gives the same id in every sweep)."""
    text = json.dumps({k: point[k] for k in sorted(point)}, default=str, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]
