"""One engine step as a plan, shared by the SimPy engine and the GPU harness replay. SimPy-free.

`Stepper.step(now)` asks the scheduler for the next step (which does its memory bookkeeping), times
it, and finishes it (emits tokens, retires finished requests), returning a `StepPlan`: who runs with
how many prefill and decode tokens, every allocator call (sequences given memory, forks, copy-on-write
block pairs, sequences freed), swaps out and in, preemptions, finishes, the queue length, the memory
while the step runs, its start and duration; the engine turns it into a timeout and a log row, the
harness into kernel inputs (`gpu_harness.layout`), like vLLM's scheduler output with `blocks_to_copy`.

`Stepper.window(last, now, next_arrival)` is the exact fast-forward: after a step that admitted,
preempted, swapped and retired nothing, the batch is in a steady decode phase and the next steps are
predictable until a request reaches its last token, the free blocks run out, or (with an empty queue)
a request arrives. It returns those steps as one plan (one entry per step in `starts`, `durations`,
`waiting`, `memory`). Step boundaries within `TIE` of an arrival end the window, so the order of
arrivals and steps is the same as stepping one at a time (tests compare the two).

Timing lives in one place, `Stepper.step_seconds` / `Stepper.decode_seconds`: the cost model's kernel
time plus PCIe time for swaps (the hook for an engine profile's CPU time per step). Seconds throughout.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Sequence

from kvsim.alloc.base import MemoryStats

TIE = 1e-9      # seconds, relative to the time: a step boundary this close to an arrival is a tie


@dataclass(slots=True)
class StepPlan:
    """One engine step (or a window of decode steps of the same batch: its token counts are its first
    step's; each later step reads `decode_seqs` more context tokens). Requests are trace indices;
    sequences and blocks are ids as the allocator knows them; memory in token slots."""

    # what runs
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (request, tokens computed)
    prefill_tokens: int = 0
    prefill_attn_tokens: int = 0      # sum of chunk x context-after-chunk
    decodes: list[int] = field(default_factory=list)                # requests decoding one token
    decode_seqs: int = 0
    decode_context_tokens: int = 0    # KV tokens the decodes read, the new ones included
    swap_tokens: int = 0              # KV slots moved over PCIe this step (either way)
    batch_requests: int = 0           # running requests
    # allocator calls, in order (made while scheduling, before the step's K/V writes)
    allocated: list[tuple[int, int]] = field(default_factory=list)  # (seq, prefix-cache hit tokens)
    forked: list[tuple[int, int]] = field(default_factory=list)     # (parent seq, child seq)
    copies: list[tuple[int, int]] = field(default_factory=list)     # copy-on-write (src, dst) blocks
    freed: list[int] = field(default_factory=list)                  # seqs freed by preemption
    preempted: list[int] = field(default_factory=list)              # requests
    swapped_out: list[int] = field(default_factory=list)            # requests (of `preempted`)
    swapped_in: list[int] = field(default_factory=list)             # requests (also in `decodes`)
    finished: list[int] = field(default_factory=list)               # retired after the step, seqs freed
    # time and memory: one entry per step (a window has several)
    starts: list[float] = field(default_factory=list)               # s
    durations: list[float] = field(default_factory=list)            # s
    waiting: list[int] = field(default_factory=list)                # queued requests at each start
    memory: list[MemoryStats] = field(default_factory=list)         # while the step runs
    tables: dict[int, list[int]] | None = None   # live seq -> block ids during the step (on request)

    @property
    def num_steps(self) -> int:
        return len(self.starts)

    @property
    def end_s(self) -> float:
        """When the (last) step ends, s."""
        return self.starts[-1] + self.durations[-1]


class Stepper:
    """Advances `scheduler` one step (or one fast-forward window) at a time, timed with `cost`
    (`step_time(prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens)` and
    `swap_time(tokens)`, seconds). `arrival_s` (sorted) is needed only for windows."""

    def __init__(self, scheduler, cost, arrival_s: Sequence[float] = ()):
        self.sched, self.cost = scheduler, cost
        self.arrivals = list(arrival_s)

    # -- timing: the one place a step's duration is computed -------------------------------------
    def step_seconds(self, plan: StepPlan) -> float:
        """Duration of the step `plan` describes: kernels, plus PCIe time for its swap traffic."""
        duration = self.cost.step_time(plan.prefill_tokens, plan.prefill_attn_tokens,
                                       plan.decode_seqs, plan.decode_context_tokens)
        if plan.swap_tokens:
            duration += self.cost.swap_time(plan.swap_tokens)
        return duration

    def decode_seconds(self, num_seqs: int, context_tokens: int) -> float:
        """Duration of a decode-only step (windows): the same as `step_seconds` of such a plan."""
        return self.cost.step_time(0, 0, num_seqs, context_tokens)

    # -- one step -----------------------------------------------------------------------------
    def step(self, now: float, tables: bool = False) -> StepPlan | None:
        """Schedule, time and finish the step that starts at `now`; None when nothing can run.
        `tables`: also copy every live sequence's block table into the plan (paged; the harness)."""
        sched = self.sched
        plan = sched.schedule(now)
        if plan is None:
            return None
        plan.waiting.append(len(sched.waiting))
        plan.memory.append(sched.memory())
        if tables:
            plan.tables = sched.block_tables()
        duration = self.step_seconds(plan)
        plan.starts.append(now)
        plan.durations.append(duration)
        sched.finish(plan, now + duration)
        return plan

    # -- many steps at once -------------------------------------------------------------------
    def window(self, last: StepPlan, now: float, next_arrival: int) -> StepPlan | None:
        """After step `last` ended at `now`, with arrivals before index `next_arrival` queued: the
        next steady decode steps as one plan (at least two), or None."""
        if last.prefills or last.swap_tokens or last.preempted or last.finished:
            return None
        sched, times = self.sched, self.arrivals
        if not last.waiting[-1] and (sched.waiting or (next_arrival < len(times)
                                                       and times[next_arrival] <= now + last.durations[-1])):
            return None      # something arrived (or arrives within a step) and would be admitted
        steady = sched.steady_decodes()
        if steady is None:
            return None
        ids, steps, context = steady
        if steps < 2:
            return None
        nxt, queued, num_seqs = next_arrival, len(sched.waiting), len(ids)
        starts, durations, waiting = [], [], []
        t = now
        for j in range(steps):
            nxt, queued = self._queue_before(t, nxt, queued)
            if nxt < 0:
                break
            starts.append(t)
            waiting.append(queued)
            durations.append(self.decode_seconds(num_seqs, context + (j + 1) * num_seqs))
            t = t + durations[-1]
        # the window's end is the next step's start: no tie with an arrival, and exactly reachable
        while starts and (now + (t - now) != t or _ties(times, next_arrival, t)):
            t = starts.pop()
            durations.pop()
            waiting.pop()
        if len(starts) < 2:
            return None
        memory = sched.advance(ids, len(starts))
        return StepPlan(decodes=list(sched.running), decode_seqs=num_seqs,
                        decode_context_tokens=context + num_seqs, batch_requests=len(sched.running),
                        starts=starts, durations=durations, waiting=waiting, memory=memory)

    def _queue_before(self, t: float, nxt: int, queued: int) -> tuple[int, int]:
        """Take the arrivals from index `nxt` that come before a step starting at `t` into the count of
        `queued` requests; returns (next index, queued), or (-1, queued) when the step cannot be in a
        window: an arrival ties with `t`, or would be admitted at `t` (the queue was empty)."""
        times, tie = self.arrivals, TIE * (1 + t)
        while nxt < len(times) and times[nxt] < t + tie:
            if times[nxt] > t - tie:
                return -1, queued                  # a tie: which comes first is SimPy's to say
            if not self.sched.never_served(nxt):
                if not queued:
                    return -1, queued              # it would be admitted at this step
                queued += 1                        # it queues behind a blocked head
            nxt += 1
        return nxt, queued


def _ties(times: list[float], start: int, t: float) -> bool:
    """Whether an arrival at or after index `start` is within `TIE` of time `t`."""
    i = bisect_left(times, t - TIE * (1 + t), start)
    return i < len(times) and times[i] <= t + TIE * (1 + t)
