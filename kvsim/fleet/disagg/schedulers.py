"""The two schedulers of a disaggregated deployment, each today's continuous-batching `Scheduler`
with one change at the hand-off. Plain Python, no SimPy (`kvsim.fleet.disagg.sim` drives them).

- `PrefillScheduler` runs prompts only: every request's output is capped to its first token, which
  its prefill emits (DistServe's prefill instance). A request whose prefill is done leaves the batch
  but keeps its KV blocks (`held`) until `release(i)`: its KV cache waits there until a decode
  instance has room for it and the transfer is over.
- `DecodeScheduler` decodes requests whose prompt KV comes from a prefill instance: `reserve(i)` takes
  the prompt's P slots when memory and `max_num_seqs` allow (the transfer then starts), `join(i, now)`
  puts it in the batch with its first token out and no prefill to compute. A request preempted here is
  recomputed here (prompt + outputs), as vLLM's engine would.

Requests must be single-sequence (n = 1, no beams). Units: tokens (KV slots) and seconds.
"""

from __future__ import annotations

from kvsim.engine.batching.scheduler import Scheduler


class PrefillScheduler(Scheduler):
    """Prompts only; finished prefills hold their blocks until `release`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keep_contexts_exact()          # every request steps itself: the retirement below is used
        self.output[:] = [1] * len(self.output)   # (the same list as the request state's)
        self.held: dict[int, None] = {}     # requests done here whose KV blocks wait for the decode side

    def schedule(self, now: float):
        """`Scheduler.schedule`, except that a head that does not fit beside the held blocks waits for
        them (the base scheduler would reject it as not fitting the empty cache)."""
        if self.held and self.waiting and not (self.running or self.swapped) and not self._head_fits():
            return None
        return super().schedule(now)

    def _head_fits(self) -> bool:
        i = self.waiting[0]
        need, final = self.prompt[i] + self.generated[i], self.prompt[i] + self.output[i] - 1
        ids = self.block_ids(i) if self.block_ids else ()
        return self.alloc.can_allocate(need, final, ids, self.seq_ids(i)[0])

    def _finished_blocks(self, i: int) -> None:
        """Prefill done: finished here, its blocks kept (`held`) until the decode side takes them."""
        self.held[i] = None

    def release(self, i: int) -> None:
        """Free request `i`'s blocks (its KV cache has reached the decode side, or it needs none)."""
        del self.held[i]
        for s in self.seq_ids(i):
            self.alloc.free(s)


class DecodeScheduler(Scheduler):
    """Decodes transferred requests; `reserve` then `join` instead of prefill admission."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keep_contexts_exact()
        self.in_flight = 0                  # requests whose slots are reserved, KV still on the link

    def reserve(self, i: int) -> bool:
        """Take request `i`'s prompt slots if they fit now, nothing preempted waits ahead of it and
        the batch has a sequence left; False (nothing taken) otherwise."""
        if self.waiting or self.swapped or self.running_seqs + self.in_flight + 1 > self.cfg.max_num_seqs:
            return False
        p, seq = self.prompt[i], self.seq_ids(i)[0]
        final = p + self.output[i] - 1
        if not self.alloc.can_allocate(p, final, (), seq):
            return False
        self.alloc.allocate(seq, p, final, (), p)
        self.in_flight += 1
        return True

    def join(self, i: int, now: float) -> None:
        """Request `i`'s KV has arrived: it decodes from the next step on (its first token is out)."""
        self.in_flight -= 1
        self.kv_len[i], self.generated[i], self.prefill_left[i] = self.prompt[i], 1, 0
        self.admitted_s[i] = now
        self.running.append(i)
        self.running_seqs += 1

    def schedule(self, now: float):
        """`Scheduler.schedule`, except that a preempted request waits for in-flight transfers
        rather than being rejected as too large for an empty cache."""
        if self.in_flight and self.waiting and not (self.running or self.swapped):
            return None
        return super().schedule(now)

    def load(self) -> int:
        """Requests here or on their way: running, queued (preempted), swapped out, in flight."""
        return len(self.running) + len(self.waiting) + len(self.swapped) + self.in_flight
