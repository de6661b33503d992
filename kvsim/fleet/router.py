"""The router: picks a replica for each arriving request (`Router.choose`) and counts its decisions.

How the production routers score (read, not copied):
- SGLang's cache-aware router (sgl-project/sglang, sgl-router `src/policies/cache_aware.rs`): when the
  loads are out of balance ((max - min) > balance_abs_threshold and max > balance_rel_threshold x min)
  it takes the shortest queue; otherwise the worker whose approximate radix tree matches the most of
  the prompt, if that match is over cache_threshold of it, else the worker with the smallest tree.
- NVIDIA Dynamo's KV router (docs.nvidia.com/dynamo, "Router Design"): lowest cost = overlap weight x
  new prefill blocks (prompt blocks not cached there) + active decode blocks, from a global index of
  the blocks workers report.
- llm-d's inference scheduler (llm-d-inference-scheduler; Red Hat's default profile): a weighted sum
  of scorers, prefix-cache hit fraction (weight 3) plus queue depth (weight 2), highest score wins.
kvsim's `prefix-aware` is SGLang's rule on block-hash prefixes (a request's prompt block ids from the
trace, `Trace.prompt_block_ids`), loads counted in outstanding requests (waiting + running + swapped),
and when no replica holds enough of the prompt it takes the least loaded replica (SGLang: the smallest
tree). Ties go to the lower load, then the lower replica index: every decision is deterministic.

The router keeps its own approximate view of the caches (`PrefixIndex`, as SGLang's router does), not
the replicas' prefix caches: it learns a replica's blocks by routing requests there and forgets them
least recently routed first once it would exceed the replica's KV blocks. It does not see a replica
evict sooner under memory pressure, so it may send a request where its prefix has gone; the hits that
count are the replica's own (`prefix_cache_hit_rate` in each replica's summary).
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from kvsim.fleet.config import FleetConfig


def prefix_keys(block_ids: list[int]) -> list[int]:
    """Chained keys of a prompt's leading blocks: equal keys at position k mean equal blocks 0..k
    (Python's tuple hash of ints is not salted, so the keys are the same in every run)."""
    keys, h = [], 0
    for block_id in block_ids:
        h = hash((h, block_id))
        keys.append(h)
    return keys


class PrefixIndex:
    """Which replicas the router believes hold each prefix key, each replica's keys in LRU order and
    bounded by `capacity_blocks` (its KV blocks)."""

    def __init__(self, replicas: int, capacity_blocks: int):
        self.holders: dict[int, set[int]] = {}
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self.capacity_blocks = capacity_blocks

    def matched(self, keys: list[int]) -> dict[int, int]:
        """Replica -> how many leading blocks of `keys` it holds (replicas holding none left out)."""
        counts: dict[int, int] = {}
        alive: set[int] | None = None
        holders = self.holders
        for depth, key in enumerate(keys, 1):
            held = holders.get(key)
            if not held:
                break
            alive = held if alive is None else alive & held
            if not alive:
                break
            for r in alive:
                counts[r] = depth
        return counts

    def record(self, replica: int, keys: list[int]) -> None:
        """Note that `replica` now holds `keys` (most recently used), forgetting its oldest beyond
        its capacity."""
        lru, holders = self.lru[replica], self.holders
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                holders.setdefault(key, set()).add(replica)
        while len(lru) > self.capacity_blocks:
            key, _ = lru.popitem(last=False)
            held = holders[key]
            held.discard(replica)
            if not held:
                del holders[key]


class Router:
    """Chooses a replica per request. `replicas` answer `outstanding()` (requests queued, running or
    swapped out) and `kv_used()` (KV slots in use); `block_ids(i)` gives request i's shareable prompt
    block ids (prefix-aware only). `decisions` counts the prefix-aware rule that decided
    (`balance`: out of balance, least loaded; `prefix`: longest cached prefix; `least-loaded`: no
    replica holds enough of the prompt)."""

    def __init__(self, cfg: FleetConfig, replicas, block_ids=None, capacity_blocks: int = 0):
        self.cfg, self.replicas, self.block_ids = cfg, replicas, block_ids
        self.routed = [0] * len(replicas)
        self.decisions: Counter[str] = Counter()
        # per request, in routing order (`routing_columns`): trace index, replica, and for prefix-aware
        # the rule that decided, the prompt's shareable blocks and how many the chosen replica held
        self._trail: list[tuple] = []
        self._next = 0
        self._scheds = [rep.sched for rep in replicas]
        self.index = PrefixIndex(len(replicas), capacity_blocks) if cfg.router == "prefix-aware" else None
        self.choose = {"round-robin": self._round_robin, "least-requests": self._least_requests,
                       "least-kv": self._least_kv, "prefix-aware": self._prefix_aware}[cfg.router]

    def route(self, i: int) -> int:
        """The replica request `i` goes to (counted)."""
        r = self.choose(i)
        self.routed[r] += 1
        if self.index is None:
            s = self._scheds[r]
            self._trail.append((i, r, len(s.waiting) + len(s.running) + len(s.swapped)))
        return r

    def routing_columns(self) -> dict[str, list]:
        """One entry per request routed so far, in routing order: `request` (trace index), `replica`,
        `outstanding` (requests the replica held before this one) and, prefix-aware, `rule` (prefix,
        balance or least-loaded), `prompt_blocks` (shareable blocks of the prompt) and `cached_blocks`
        (how many leading ones the router believed the chosen replica held)."""
        names = ("request", "replica", "outstanding") + (("rule", "prompt_blocks", "cached_blocks")
                                                         if self.index is not None else ())
        return {name: list(col) for name, col in zip(names, zip(*self._trail))} if self._trail else \
            {name: [] for name in names}

    def _round_robin(self, i: int) -> int:
        r = self._next
        self._next = (r + 1) % len(self.replicas)
        return r

    def loads(self) -> list[int]:
        """Each replica's outstanding requests (`outstanding()`, inlined: read once per request)."""
        return [len(s.waiting) + len(s.running) + len(s.swapped) for s in self._scheds]

    def _least_requests(self, i: int) -> int:
        loads = self.loads()
        return loads.index(min(loads))

    def _least_kv(self, i: int) -> int:
        used = [(rep.kv_used(), rep.outstanding()) for rep in self.replicas]
        return used.index(min(used))

    def _prefix_aware(self, i: int) -> int:
        cfg = self.cfg
        loads = self.loads()
        lo, hi = min(loads), max(loads)
        keys = prefix_keys(self.block_ids(i))
        matched = self.index.matched(keys)
        if hi - lo > cfg.balance_abs and hi > cfg.balance_rel * lo:
            r, why = loads.index(lo), "balance"
        else:
            best = min(matched, key=lambda r: (-matched[r], loads[r], r)) if matched else None
            if best is not None and matched[best] >= cfg.cache_threshold * len(keys):
                r, why = best, "prefix"
            else:
                r, why = loads.index(lo), "least-loaded"
        self.decisions[why] += 1
        self._trail.append((i, r, loads[r], why, len(keys), matched.get(r, 0)))
        self.index.record(r, keys)
        return r
