"""The engine's loop without SimPy, for tests that look at every step: arrivals are added before each
step, idle time jumps to the next arrival, and a fast-forward window follows a step when one applies."""

from kvsim.engine.build import build_run
from kvsim.engine.step import Stepper


def engine_steps(trace, parts, watched: bool = False):
    """Yield ("step", plan) after each step and ("window", window) after each window until the trace's
    requests are all done; `parts` is `kvsim.engine.build.build_run(trace, cfg)`; `watched`: windows
    as under a stop watch (`Stepper.cut_at_request_ends`)."""
    sched = parts.scheduler
    stepper = Stepper(sched, parts.cost, trace.arrival_s.tolist())
    stepper.cut_at_request_ends = watched
    now, nxt = 0.0, 0
    while True:
        while nxt < len(trace) and trace.arrival_s[nxt] <= now:
            sched.add(nxt, now)
            nxt += 1
        plan = stepper.step(now)
        if plan is None:
            if nxt == len(trace):
                return
            now = float(trace.arrival_s[nxt])
            continue
        now = plan.end_s
        yield "step", plan
        window = stepper.window(plan, now, nxt)
        while window is not None:                   # (windows follow one another, as in the engine)
            now = window.end_s
            yield "window", window
            while nxt < len(trace) and trace.arrival_s[nxt] <= now:
                sched.add(nxt, now)
                nxt += 1
            window = stepper.window(window, now, nxt) if not watched else None


def steps_of(trace, cfg, lazy: bool):
    """Yield (plan, scheduler, allocator) after each step or window of a run of `trace` under `cfg`,
    on the lazy decode path or (`lazy` False) the per-sequence path."""
    parts = build_run(trace, cfg)
    if not lazy:
        parts.scheduler._lazy = False
    for _, plan in engine_steps(trace, parts):
        yield plan, parts.scheduler, parts.allocator


def findable_hashes(sched, cache) -> dict[int, list[int]]:
    """The prefix cache's hash -> blocks map without the own blocks of sequences done for good (their
    request finished or their sample ended): no lookup can ask for those hashes (`prefix.unique_hashes`
    salts them by the sequence id, -1 - (id * 2**32 + index)), and `free_finished` parks the blocks
    nameless where the per-sequence path registers them first."""
    from kvsim.engine.batching.request_state import FINISHED

    def done(h) -> bool:
        h = h[0] if isinstance(h, tuple) else h     # (the hybrid manager's keys: (hash, group))
        if h >= 0:
            return False                         # a chained content hash: shareable
        i, j = divmod((-1 - h) >> 32, sched.stride)
        return sched.status[i] == FINISHED or j >= sched.n[i]

    return {h: [b] if isinstance(b, int) else list(b) for h, b in cache._blocks_of.items() if not done(h)}
