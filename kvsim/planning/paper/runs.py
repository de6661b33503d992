"""The runs of `kvsim paper` (kvsim/planning/paper/experiments.py) as one pool in which a latency curve's points
learn from the points below them.

Every sweep of the paper runs in one pool of worker processes (`kvsim.planning.sweep.pool.run_fed`); a run
that two sweeps share is made once (`kvsim.planning.run_cache`). A curve point past a system's knee may
stop once its normalized latency is surely above the plots' ceiling (its point's `STOP` key,
kvsim/planning/sweep/latency_ceiling.py), unless a capacity needs its value: the first point of a curve above
a knee threshold (`KneeRule`: `factor` x the lowest normalized latency any system of its (setup,
preset) group reaches at the grid's lowest rate, over every system and over `subset`).

So each curve's points run in order of rate, a point once the group's lowest-rate points and the
curve's lower points have run: it runs to its end (its `STOP` dropped) when every lower point is at or
below a threshold that applies to it (it may be the first above; if it is not above, it would not
have stopped either: the ceiling is higher), else it may stop. Those are the points the plain way (every
point may stop, then the first stopped point above each threshold runs again) runs whole, without
making their stopped runs first or waiting for every run to end before making them. Where a threshold is
not below the ceiling (a stopped point might be under it), or a lowest-rate point stopped, the
curve's points keep their stop and `knees` finds what to run again, as the plain way does.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass

import pandas as pd

from kvsim.planning import run_cache
from kvsim.planning.sweep import runner as sweep
from kvsim.planning.sweep.latency_ceiling import ABOVE
from kvsim.planning.sweep.pool import run_fed
from kvsim.planning.sweep.grid import check_workload, grid_points, run_id
from kvsim.planning.sweep.point import point_row, shared_row

#: A curve point's key for where its run may stop (s/token; `kvsim.planning.sweep.grid`'s grid key).
STOP = "stop_above_s_per_token"
#: Mean prompt + output tokens of the presets (DESIGN.md): with the rate, a point's expected cost.
_TOKENS = {"sharegpt": 161.31 + 337.99, "alpaca": 19.31 + 58.45}


@dataclass(frozen=True)
class KneeRule:
    """How the paper reads capacities off its curves: knee thresholds `factor` x the lowest normalized
    latency (s/token) a (setup, preset) group's systems reach at its lowest rate, over every system and
    over the systems of `subset`; curve points may stop once surely above `ceiling_s_per_token`."""

    factor: float
    ceiling_s_per_token: float
    subset: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.factor > 0 or not self.ceiling_s_per_token > 0:
            raise ValueError(f"knee factor and ceiling must be > 0, got {self.factor} and {self.ceiling_s_per_token}")


def _cost(point: dict) -> float:
    """A point's relative run time, to start the longest first: tokens per second of its workload,
    static batching first (one decode step per token of its longest request)."""
    work = float(point.get("rate", 1.0)) * _TOKENS.get(point.get("preset"), 100.0)
    return work * (10.0 if point.get("batching") == "static" else 1.0)


def _value(row: dict) -> float:
    """A curve row's normalized latency (s/token); inf for a run stopped above the ceiling."""
    above = row.get(ABOVE)
    return float("inf") if above is not None and above == above else float(
        row.get("normalized_latency_s_per_token") or 0.0)


class Runs:
    """Every sweep of a study, run as one pool (see the module's docstring)."""

    def __init__(self) -> None:
        self.sweeps: list[list[dict]] = []
        self.rows: list[list[dict]] = []

    def add(self, grid: dict, base: dict) -> int:
        """Queue `grid` over `base` (as `run_sweep`); its index for `frame`."""
        self.sweeps.append(grid_points(grid, base))
        return len(self.sweeps) - 1

    def run(self, workers: int | None, curves: list[list[tuple[int, dict]]] = (), rule: KneeRule | None = None) -> None:
        """Make every sweep's rows. `curves`: lists of (sweep index, tags with `setup` and `system`) of
        latency curves, each list's groups judged apart (the main curves, each variant's); with `rule`,
        their points that carry `STOP` run as the module's docstring says, and the stopped points a
        capacity still needs (`knees`) run again whole at the end."""
        from kvsim.planning.progress_lines import Lines
        feed = _Feed(self.sweeps, curves, rule)
        lines = Lines("paper", sum(map(len, self.sweeps)), "points")

        def done(made) -> None:
            before = sum(r is not None for rows in feed.rows for r in rows)
            feed.done(made)
            lines.advance(n=sum(r is not None for rows in feed.rows for r in rows) - before,
                          what=f"{made[0].get('model', '')} rate {made[0].get('rate', '-')}")
        run_fed(sweep.run_point_parts, (None, None), workers or os.cpu_count() or 1, feed.take, done)
        self.rows = feed.rows
        if rule is not None:
            again = [k for group in curves for k in knees(self, group, rule)]
            points = [{k: v for k, v in self.sweeps[i][j].items() if k != STOP} for i, j in again]
            for (i, j), row in zip(again, sweep.run_points(points, workers=workers)):
                self.rows[i][j] = row

    def frame(self, index: int, tags: dict | None = None, above: list | None = None) -> pd.DataFrame:
        """The table of sweep `index` (as `run_sweep` returns it) with `tags` as columns; ValueError if a
        run failed. Runs stopped above the ceiling are left out of it, into `above` (rate and tags)."""
        rows = self.rows[index]
        if above is not None:
            above.extend({**(tags or {}), "preset": r["preset"], "rate": r["rate"], ABOVE: r[ABOVE]}
                         for r in rows if r.get(ABOVE) is not None)
            rows = [r for r in rows if r.get(ABOVE) is None]
        df = pd.DataFrame(rows).assign(**(tags or {}))
        bad = df[df.status != "ok"]
        if len(bad):
            raise ValueError(f"paper run failed ({bad.error.iloc[0]}) at {bad.iloc[0].get('run_id')}")
        return df


def _groups(sweeps: list[list[dict]], curves: list[tuple[int, dict]]) -> list[list[tuple[int, dict]]]:
    """`curves` by (setup, preset)."""
    groups: dict[tuple, list[tuple[int, dict]]] = {}
    for i, tags in curves:
        groups.setdefault((tags["setup"], sweeps[i][0]["preset"]), []).append((i, tags))
    return list(groups.values())


def _thresholds(sweeps: list[list[dict]], rows: list[list[dict | None]], members: list[tuple[int, dict]],
                rule: KneeRule) -> dict[str | None, float]:
    """The group's knee thresholds (s/token; its lowest-rate rows must be in): None -> over every system,
    'subset' -> over `rule.subset`."""
    lowest = min(p["rate"] for i, _ in members for p in sweeps[i])
    out = {}
    for name, subset in ((None, None), ("subset", rule.subset)):
        low = [_value(rows[i][j]) for i, t in members if subset is None or t["system"] in subset
               for j, p in enumerate(sweeps[i]) if p["rate"] == lowest]
        if low:
            out[name] = rule.factor * min(low)
    return out


def knees(runs: Runs, curves: list[tuple[int, dict]], rule: KneeRule) -> list[tuple[int, int]]:
    """The stopped points whose value a capacity needs: per (setup, preset), for each threshold a
    capacity is computed against (`_thresholds`), each curve's first point above it, when that point
    stopped; when a threshold is not below the ceiling (a stopped point might be under it), every
    stopped point of the curve up to its first whole point above it."""
    found: set[tuple[int, int]] = set()
    for members in _groups(runs.sweeps, curves):
        levels = _thresholds(runs.sweeps, runs.rows, members, rule)
        for name, threshold in levels.items():
            for i, t in members:
                if name is not None and t["system"] not in rule.subset:
                    continue
                for j in sorted(range(len(runs.rows[i])), key=lambda j: runs.rows[i][j]["rate"]):
                    v = _value(runs.rows[i][j])
                    if v == float("inf"):
                        found.add((i, j))
                        if threshold < rule.ceiling_s_per_token:
                            break               # surely above: the first point past the knee
                    elif v > threshold:
                        break
    return sorted(found)


class _Feed:
    """Hands `run_fed` the points as they become ready (curve points first, the rest the most expensive
    first) and files their rows; a run already made, or under way, is not made again."""

    def __init__(self, sweeps: list[list[dict]], curves: list[list[tuple[int, dict]]], rule: KneeRule | None):
        for points in sweeps:
            for p in points:
                check_workload(p)
        self.sweeps, self.rule = sweeps, rule
        self.rows: list[list[dict | None]] = [[None] * len(points) for points in sweeps]
        self.ready: list[tuple[tuple, int, int, dict]] = []          # (priority, i, j, point to run)
        self.running: dict[str, list[tuple[int, int, dict]]] = {}     # run_id under way -> its points
        self.keys: dict[str, str | None] = {}                       # run_id under way -> its run's key
        self.sharing: dict[str, list[tuple[int, int, dict]]] = {}     # key under way -> points sharing it
        self.chains: dict[int, dict] = {}            # curve sweep -> its points by rate, group, tags
        for group in curves if rule is not None else ():
            for members in _groups(sweeps, group):
                for i, tags in members:
                    order = sorted(range(len(sweeps[i])), key=lambda j: sweeps[i][j]["rate"])
                    self.chains[i] = {"order": order, "at": 0, "queued": 0, "members": members, "tags": tags}
        for i, points in enumerate(sweeps):
            chain = self.chains.get(i)
            for j, p in enumerate(points):
                if chain is None or STOP not in p or j == chain["order"][0]:
                    self._push(i, j, p)           # (the others wait for the points below them)

    def _push(self, i: int, j: int, point: dict) -> None:
        heapq.heappush(self.ready, ((0 if i in self.chains else 1, -_cost(point)), i, j, point))

    def take(self) -> dict | None:
        """The next point to run (None: none is ready); runs already made or under way are filed or joined."""
        while self.ready:
            _, i, j, point = heapq.heappop(self.ready)
            key, rid = run_cache.point_key(point, None), run_id(point)
            parts = run_cache.lookup(key)
            if parts is not None:
                self._file(i, j, point_row(point, parts))
            elif key is not None and key in self.sharing:
                self.sharing[key].append((i, j, point))
            elif rid in self.running:                  # (the same point, a run without a key)
                self.running[rid].append((i, j, point))
            else:
                self.running[rid], self.keys[rid] = [(i, j, point)], key
                if key is not None:
                    self.sharing[key] = []
                return point
        return None

    def done(self, made: tuple[dict, tuple[dict, dict] | None]) -> None:
        """File a run's row, and the rows of the points that shared it."""
        row, parts = made
        key = self.keys.pop(row["run_id"])
        run_cache.store(key, parts)
        for i, j, _ in self.running.pop(row["run_id"]):
            self._file(i, j, row)
        for i, j, point in self.sharing.pop(key, []) if key is not None else ():
            self._file(i, j, shared_row(point, made))

    def _file(self, i: int, j: int, row: dict) -> None:
        self.rows[i][j] = row
        chain = self.chains.get(i)
        if chain is not None:           # a lowest-rate row may make the group's thresholds known
            for k, _ in chain["members"] if j == chain["order"][0] else [(i, None)]:
                self._advance(k)

    def _advance(self, i: int) -> None:
        """Queue curve `i`'s first point not yet run once the points it depends on have run: to its end
        when it may be the first above a threshold, else with its stop."""
        chain, rows = self.chains[i], self.rows[i]
        order, at = chain["order"], chain["at"]
        while at < len(order) and rows[order[at]] is not None:
            at += 1
        chain["at"] = at
        if at == len(order) or at == 0 or chain["queued"] == at or STOP not in self.sweeps[i][order[at]]:
            return                      # (a point without a stop was queued at the start)
        if any(self.rows[k][self.chains[k]["order"][0]] is None for k, _ in chain["members"]):
            return                      # the group's thresholds are not known yet
        chain["queued"] = at
        point = self.sweeps[i][order[at]]
        if self._may_be_first_above(i, at):
            point = {k: v for k, v in point.items() if k != STOP}
        self._push(i, order[at], point)

    def _may_be_first_above(self, i: int, at: int) -> bool:
        """Whether every point below curve `i`'s `at`-th is at or below a threshold that applies to it,
        every threshold of its group being below the ceiling (else the plain way's rules hold)."""
        chain = self.chains[i]
        levels = _thresholds(self.sweeps, self.rows, chain["members"], self.rule)
        if any(t >= self.rule.ceiling_s_per_token for t in levels.values()):
            return False
        below = [_value(self.rows[i][j]) for j in chain["order"][:at]]
        return any(all(v <= t for v in below) for name, t in levels.items()
                   if name is None or chain["tags"]["system"] in self.rule.subset)
