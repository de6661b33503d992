"""Prefill/decode disaggregation in one SimPy environment (DistServe, Splitwise): P prefill instances
run prompts only, D decode instances run the rest, and each request's KV cache crosses a link between.

A request arrives and goes to the prefill instance with the fewest requests queued or in the batch
(ties: the lowest index; DistServe's global scheduler picks the least loaded too). Its prefill emits the first
token: TTFT ends there (DistServe's definition). It then queues, FIFO, at the decode instance with the
fewest requests (running, queued, in flight or waiting to be taken) and holds its prefill blocks until
that instance can reserve its prompt's slots (`DecodeScheduler.reserve`: KV memory and `max_num_seqs`
allow); the transfer (`KVLink.transfer_seconds` of its prompt tokens) then starts, and when it ends the
prefill blocks are freed and the request decodes from the decode instance's next step. A request with
one output token finishes at its prefill. Each instance is today's engine (`Stepper` over a scheduler
from `build_run`), stepping one step at a time (no fast-forward windows: arrivals come from the other
side). Deterministic: SimPy runs simultaneous events in the order they were scheduled.

Times in seconds from the trace start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from kvsim.engine.build import build_run
from kvsim.engine.config import SimConfig
from kvsim.engine.step import Stepper
from kvsim.fleet.disagg.schedulers import DecodeScheduler, PrefillScheduler
from kvsim.fleet.disagg.kv_link import KVLink
from kvsim.trace.table import Trace


@dataclass(frozen=True)
class DisaggConfig:
    """P prefill instances of `prefill.deployment` (its TP) and D decode instances of `decode`'s,
    joined by `link`. Each `SimConfig` describes one instance (its KV memory, scheduler limits)."""

    prefill: SimConfig
    decode: SimConfig
    prefill_replicas: int
    decode_replicas: int
    link: KVLink

    def __post_init__(self) -> None:
        from kvsim.fleet.config import check_units
        check_units(self.prefill_replicas, "--prefill-replicas")
        check_units(self.decode_replicas, "--decode-replicas")

    @property
    def gpus(self) -> int:
        return (self.prefill_replicas * self.prefill.deployment.tp
                + self.decode_replicas * self.decode.deployment.tp)


class _Instance:
    """One engine as a SimPy process: steps while it has work, sleeps on `wake` when it has none."""

    def __init__(self, env: simpy.Environment, parts, cost, on_step):
        self.env, self.sched, self.on_step = env, parts.scheduler, on_step
        profile = parts.profile
        cpu = profile.cpu_seconds if profile is not None and (profile.cpu_step_s or profile.cpu_seq_s) else None
        self.stepper = Stepper(parts.scheduler, cost or parts.cost, (), cpu)
        self.capacity_tokens = parts.capacity_tokens
        self.wake: simpy.Event | None = None
        self.busy_s = 0.0
        self.steps = 0
        self.in_step = 0                # requests the step under way prefills (they left `running`)
        env.process(self._run())

    def poke(self) -> None:
        """Wake the instance if it sleeps (new work or freed memory)."""
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _run(self):
        env, stepper = self.env, self.stepper
        while True:
            plan = stepper.step(env.now)
            if plan is None:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            self.in_step = len(plan.prefills)
            yield env.timeout(plan.durations[0])
            self.in_step = 0
            self.busy_s += plan.durations[0]
            self.steps += 1
            self.on_step(self, plan)


class DisaggSim:
    """One run of `trace` on `cfg` (`cost` replaces both sides' cost models: golden tests)."""

    def __init__(self, trace: Trace, cfg: DisaggConfig, cost=None):
        from kvsim.trace.locate import first_multi_sequence, where
        if (i := first_multi_sequence(trace)) is not None:
            raise ValueError(f"{where(trace, i)}: n = {int(trace.n[i])}, beam_width = {int(trace.beam_width[i])}: "
                             "disaggregated runs take single-sequence requests only (n = 1, no beams); a "
                             "colocated run (without --prefill-replicas/--decode-replicas) serves it")
        self.trace, self.cfg = trace, cfg
        self.env = env = simpy.Environment()
        self.prefill = [_Instance(env, build_run(trace, cfg.prefill, PrefillScheduler), cost, self._prefilled)
                        for _ in range(cfg.prefill_replicas)]
        self.decode = [_Instance(env, build_run(trace, cfg.decode, DecodeScheduler), cost, self._decoded)
                       for _ in range(cfg.decode_replicas)]
        self.kv_bytes_per_token = cfg.decode.deployment.kv_bytes_per_token()
        num = len(trace)
        self.output = trace.output_tokens.tolist()
        self.prompt = trace.prompt_tokens.tolist()
        nan = float("nan")
        self.first_token_s, self.finished_s = [nan] * num, [nan] * num
        self.transfer_start_s, self.transfer_end_s = [nan] * num, [nan] * num
        self.prefill_of, self.decode_of = [-1] * num, [-1] * num
        self.status, self.reason = ["unfinished"] * num, [""] * num
        self.pending: list[list[int]] = [[] for _ in self.decode]   # per decode instance, FIFO
        env.process(self._arrivals())

    def run(self) -> float:
        """Simulate until every request is done; returns the end time (s)."""
        self.env.run()
        return self.env.now

    # -- arrivals -> prefill -----------------------------------------------------------------------
    def _arrivals(self):
        env = self.env
        for i, t in enumerate(self.trace.arrival_s.tolist()):
            if t > env.now:
                yield env.timeout(t - env.now)
            reason = self.decode[0].sched.never_served(i) or self.prefill[0].sched.never_served(i)
            if reason:
                self.status[i], self.reason[i], self.finished_s[i] = "rejected", reason, env.now
                continue
            k = min(range(len(self.prefill)), key=lambda j: _prefill_load(self.prefill[j]))
            self.prefill_of[i] = k
            self.prefill[k].sched.add(i, env.now)
            self.prefill[k].poke()

    # -- prefill done -> decode side -------------------------------------------------------------
    def _prefilled(self, inst: _Instance, plan) -> None:
        now = self.env.now
        for i in plan.finished:
            self.first_token_s[i] = now
            if self.output[i] == 1:
                inst.sched.release(i)
                self.status[i], self.finished_s[i] = "finished", now
                continue
            k = min(range(len(self.decode)), key=lambda j: self.decode[j].sched.load() + len(self.pending[j]))
            self.decode_of[i] = k
            self.pending[k].append(i)
            self._pull(k)
        if plan.finished:
            inst.poke()

    def _pull(self, k: int) -> None:
        """Start the transfers decode instance `k` can take now, in arrival order at it."""
        pending, sched = self.pending[k], self.decode[k].sched
        taken = 0
        while taken < len(pending) and sched.reserve(pending[taken]):
            i = pending[taken]
            taken += 1
            self.transfer_start_s[i] = self.env.now
            self.env.process(self._transfer(i, k))
        del pending[:taken]

    def _transfer(self, i: int, k: int):
        yield self.env.timeout(self.cfg.link.transfer_seconds(self.prompt[i], self.kv_bytes_per_token))
        now = self.env.now
        self.transfer_end_s[i] = now
        src = self.prefill[self.prefill_of[i]]
        src.sched.release(i)
        src.poke()
        self.decode[k].sched.join(i, now)
        self.decode[k].poke()

    # -- decode done --------------------------------------------------------------------------------
    def _decoded(self, inst: _Instance, plan) -> None:
        for i in plan.finished:
            self.status[i], self.finished_s[i] = "finished", self.env.now
        k = self.decode.index(inst)
        if self.pending[k]:             # (memory freed, or a preempted request went back in)
            self._pull(k)

    # -- records -------------------------------------------------------------------------------------
    def request_columns(self) -> dict[str, np.ndarray]:
        """Per-request records (seconds from trace start; `ttft_s` and `tpot_s` as DistServe defines
        them: arrival to first token, and (finish - first token) / (outputs - 1), NaN for one output)."""
        arrival = np.asarray(self.trace.arrival_s, dtype=float)
        first, fin = np.array(self.first_token_s), np.array(self.finished_s)
        out = np.asarray(self.trace.output_tokens, dtype=np.int64)
        done = np.array(self.status, dtype=object) == "finished"
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(done & (out > 1), (fin - first) / np.maximum(out - 1, 1), np.nan)
        return {"arrival_s": arrival, "prompt_tokens": np.asarray(self.trace.prompt_tokens, dtype=np.int64),
                "output_tokens": out, "prefill_instance": np.array(self.prefill_of),
                "decode_instance": np.array(self.decode_of), "first_token_s": first,
                "transfer_start_s": np.array(self.transfer_start_s),
                "transfer_end_s": np.array(self.transfer_end_s), "finished_s": fin,
                "ttft_s": first - arrival, "tpot_s": tpot,
                "status": np.array(self.status, dtype=object), "reason": np.array(self.reason, dtype=object)}


def _prefill_load(inst: _Instance) -> int:
    """Requests queued or running at a prefill instance, those of the step under way included (the
    scheduler retires a step's finished prefills when it plans the step)."""
    return len(inst.sched.waiting) + len(inst.sched.running) + inst.in_step
