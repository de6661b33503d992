"""The engine queues arrivals itself, in the order a SimPy process of their own would: every step row
and request record equals the engine written that way (`TwoProcessEngine` below, the engine before
the arrivals moved into it), across ties between arrivals and step ends (integer arrival times with a
constant step cost), arrival times that a SimPy timeout reaches only after an ulp's correction, idle
gaps, rejections on arrival, preemption, samples, windows and single steps."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import kvsim.engine.sim
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.loop import Engine, _delay
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


class TwoProcessEngine(Engine):
    """An arrivals process that queues requests at their arrival and wakes the engine process."""

    def run(self) -> float:
        self.wakeup, self.arrivals_done, self.next_arrival = self.env.event(), False, 0
        self.env.process(self._arrival_process())
        self.env.process(self._engine_process())
        self.env.run()
        return self.env.now

    def _arrival_process(self):
        env, times, i = self.env, self.arrivals, 0
        while i < len(times):
            if times[i] > env.now:
                yield env.timeout(times[i] - env.now)
            while i < len(times) and times[i] <= env.now:
                self.sched.add(i, env.now)
                i += 1
            self.next_arrival = i
            if not self.wakeup.triggered:
                self.wakeup.succeed()
        self.arrivals_done = True
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def _engine_process(self):
        env, stepper = self.env, self.stepper
        while True:
            plan = stepper.step(env.now)
            if plan is None:
                if self.arrivals_done and self.sched.done():
                    return
                self.wakeup = env.event()
                yield self.wakeup
                continue
            self.log.record(plan)
            yield env.timeout(plan.durations[0])
            window = stepper.window(plan, env.now, self.next_arrival) if self.fast_forward else None
            if window is not None:
                self.log.record(window)
                yield env.timeout(window.end_s - env.now)


def _same_as_two_processes(trace, cfg, cost, fast_forward):
    a = simulate(trace, cfg, cost=cost, fast_forward=fast_forward)
    patch = pytest.MonkeyPatch()
    patch.setattr(kvsim.engine.sim, "Engine", TwoProcessEngine)
    try:
        b = simulate(trace, cfg, cost=cost, fast_forward=fast_forward)
    finally:
        patch.undo()
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    return a


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), times=st.sampled_from(["integer", "tenths", "uniform"]),
       config=st.sampled_from(["paged", "swap", "samples", "contiguous"]), fast_forward=st.booleans())
def test_arrivals_queue_as_a_process_of_their_own_would(seed, times, config, fast_forward):
    rng = np.random.default_rng(seed)
    num = 40
    if times == "integer":       # with a 0.25 s step: arrivals tie with step ends
        arrivals = np.sort(rng.integers(0, 15, num)).astype(float)
    elif times == "tenths":      # a + (t - a) != t for some of these (e.g. 0.3 + (0.9 - 0.3))
        arrivals = np.sort(rng.integers(0, 60, num)) / 10
    else:
        arrivals = np.sort(rng.uniform(0, 6, num))
    prompts = rng.integers(1, 200, num)
    prompts[rng.integers(0, num)] = 3000                       # too long for the model: rejected
    trace = Trace.from_arrays(arrivals, prompts, rng.integers(1, 60, num),
                              n=rng.choice([1, 2], num) if config == "samples" else 1)
    cache = CacheConfig(allocator="contiguous", reserve="max", num_blocks=300) if config == "contiguous" \
        else CacheConfig(block_size=8, num_blocks=int(rng.integers(30, 120)), swap_gib=0.05)
    cfg = SimConfig(DEP, cache, SchedulerConfig(preemption="swap" if config == "swap" else "recompute"),
                    engine_profile="ideal")
    res = _same_as_two_processes(trace, cfg, ConstantCost(0.25) if times != "uniform" else None, fast_forward)
    assert res.summary["requests_rejected"] >= 1


def test_an_arrival_tying_with_a_step_end_waits_for_the_next_step_when_it_came_during_the_step():
    # steps of 0.5 s from 0: ends at 0.5, 1.0, ... Request 1 arrives at 0.25 (during step 1, which ends
    # at 0.5) and request 2 at 0.5: the arrivals process scheduled its wake-up for 0.5 at 0.25, after
    # the engine scheduled the step end at 0, so the step at 0.5 runs before request 2 is queued.
    trace = Trace.from_arrays(np.array([0.0, 0.25, 0.5]), np.array([4, 4, 4]), np.array([3, 3, 3]))
    cfg = SimConfig(DEP, CacheConfig(block_size=4, num_blocks=100), SchedulerConfig(), engine_profile="ideal")
    res = _same_as_two_processes(trace, cfg, ConstantCost(0.5), False)
    assert res.requests.admitted_s.tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("first, second, wake", [
    (0.01, 2.27, 2.27),                   # 0.26 + (2.27 - 0.26) falls short: two timeouts
    (0.3, 0.9, 0.3 + (0.9 - 0.3))])       # the arrivals process woke an ulp after 0.9
def test_an_idle_engine_wakes_when_the_arrivals_process_would_have(first, second, wake):
    # one-token requests: the first runs from its arrival for 0.25 s, then the engine is idle
    trace = Trace.from_arrays(np.array([first, second]), np.array([4, 4]), np.array([1, 1]))
    cfg = SimConfig(DEP, CacheConfig(block_size=4, num_blocks=100), SchedulerConfig(), engine_profile="ideal")
    res = _same_as_two_processes(trace, cfg, ConstantCost(0.25), True)
    assert res.requests.admitted_s.tolist() == [first, wake]
    assert res.requests.finished_s.tolist() == [first + 0.25, wake + 0.25]


def test_the_engine_wakes_at_exactly_the_arrival_in_at_most_two_timeouts():
    # 0.3 + (0.9 - 0.3) rounds past 0.9 and 0.2 + (0.9 - 0.2) falls short of it; no delay at all takes
    # 0.3 to exactly 0.9, so the engine stops just before it and takes a second timeout from there
    assert 0.3 + (0.9 - 0.3) > 0.9 and 0.2 + (0.9 - 0.2) < 0.9
    for now, at in [(0.3, 0.9), (0.2, 0.9), (0.0, 3.0), (1e-300, 0.3), (123.456, 123.457), (0.3, 1e9 + 0.1)]:
        hops = 0
        while now != at:
            delay = _delay(now, at)
            assert delay > 0 and now + delay <= at
            now += delay
            hops += 1
        assert hops <= 2
