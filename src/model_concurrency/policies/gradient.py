"""Gradient: find where completions per second stop rising with concurrency, then hold the latency there.

For endpoints with no ``/metrics`` (hosted APIs, gateways, a closed metrics port) the only signals are the
client's own: how many calls finished, how long they took, and whether the server pushed back (429/503).

Why not Gradient2 or Vegas as published: both compare latency with a no-load baseline (Gradient2 a long EWMA,
Vegas and Envoy's adaptive-concurrency filter the minimum RTT, re-sampled by periodically dropping concurrency,
as BBR's probe-RTT does). On a batching engine latency rises with the batch long before anything queues (an
H100 decode step at 256 sequences is about 3 × the single-stream one), so a minimum-RTT rule with a 25 % buffer
stops far below the knee, and a long EWMA follows the rise and never cuts. What does mark the turning point is
BBR's full-pipe signal: a doubling of concurrency that no longer buys completions. So:

* **startup**: double per poll while a doubling raised this process's completions per second by at least
  ``startup_exit`` (BBR's full-pipe test, on client counts only) and latency by less than
  ``startup_latency_exit``; with calls long against the poll, judged on the second interval after a doubling.
  The first doubling that did not went past the **turning point**: go back to the level before it (BBR's drain)
  and take that level's mean latency × ``tolerance`` as the **setpoint**, the latency the engine shows there. It is a
  property of the engine and the workload, not of how many engines serve it, so it survives replicas added or
  lost and other tenants' load;
* **steady state**: ``next = target × clamp(setpoint / latency, min_gradient, max_growth)``, with ``latency``
  the mean of the calls that finished since the previous poll. Past the knee latency grows in proportion to
  concurrency, so one step lands on it; below it latency grows more slowly, so steps shrink as it is approached.
  Every client sees the same latency, so many clients converge together (Vegas-like), where a per-client
  throughput gradient would not (each client's own rate keeps rising with its window by taking others' share);
* **queue estimate** (:meth:`Gradient._queue`): from each poll's fastest call, the seconds every call waited.
  A clear queue ends startup and, in steady state, lowers the setpoint to the service time (a setpoint learned
  past the knee, as when several clients ramp at once);
* **throttled** (any 429/503) or failed calls: ``next = throttle_factor × target`` (multiplicative decrease),
  startup ends and that poll's latency is not used (fast rejections would look like room). A throttled call never
  counts as a completion (the gate records it as an error);
* application-limited (peak in flight ``< app_limited × target``): no growth, since a window not used says
  nothing about the server; cuts still apply;
* no call finished this poll: hold.

Engine gauges are never read (``uses_engine_signals = False``), so the controller gives it no ``/metrics``
scrape; the growth guard (:mod:`model_concurrency.guard`) runs beside it as beside every policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from model_concurrency.observation import Observation
from model_concurrency.policies._common import app_limited
from model_concurrency.policies.base import PolicyBase, require_fractions

__all__ = ["Gradient"]


@dataclass(frozen=True, slots=True)
class _Sample:
    target: float
    concurrency: float
    rate: float
    latency: float
    queue: float = 0.0  # estimated seconds every call of the interval waited (see Gradient._queue)


@dataclass(slots=True)
class Gradient(PolicyBase):
    """Double to the turning point of completions per second, then hold the latency it had.

    Parameters:
        tolerance: the setpoint as a multiple of the turning point's latency (default 1.1: near it completions
            per second rise slowly with concurrency, so a little above the last level that paid is still goodput;
            1.0 loses goodput on noisy-neighbor and replica-lost; 1.2 and 1.5 queue more).
        min_gradient: the largest cut per poll (default 0.5, in (0, 1]).
        max_growth: the largest growth per poll (default 2.0, >= 1).
        app_limited: no growth while peak in flight ``< app_limited × target`` (default 0.5, as Gradient2).
        throttle_factor: multiplicative cut on a poll with 429/503 or failed calls (default 0.8, in (0, 1)).
        slow_start_factor: growth per poll during startup (default 2.0, >= 1; 1 skips startup, and the first
            poll's latency becomes the setpoint).
        startup_exit: a doubling must raise completions per second by this factor to continue (default 1.1:
            on ``ramp`` the doubling 128 → 256 buys little, 256 being the first doubling past the knee).
        startup_latency_exit: a doubling that raised the mean latency by this factor or more went past the
            turning point, whatever the completions said (default 1.7; latency is shared by every client of the engine,
            so this is what ends startup when several clients ramp at once).
        queue_tolerance: an estimated queue of this fraction of the service time or more means the level is past
            the turning point: startup ends, and in steady state the setpoint drops to the service time (default
            0.5; the estimate, from the fastest call of each poll, is noisy, so only a clear queue counts).
        settle: during startup, when the mean latency exceeds this fraction of the poll interval, a doubling is
            judged on the second interval after it, not the first (default 0.25; 0 never waits).
        min_calls: completions a poll needs before its rate and latency are trusted (default 10).
    """

    #: Works from this process's own latencies and 429/503s: a hosted endpoint has no /metrics page to scrape.
    uses_engine_signals: ClassVar[bool] = False

    tolerance: float = 1.1
    min_gradient: float = 0.5
    max_growth: float = 2.0
    app_limited: float = 0.5
    throttle_factor: float = 0.8
    slow_start_factor: float = 2.0
    startup_exit: float = 1.1
    startup_latency_exit: float = 1.7
    queue_tolerance: float = 0.5
    settle: float = 0.25
    min_calls: int = 10
    setpoint: float | None = field(default=None, init=False)
    ramping: bool = field(default=True, init=False)
    last: _Sample | None = field(default=None, init=False)
    fastest_ratio: float | None = field(default=None, init=False)
    settled: bool = field(default=False, init=False)
    polled_at: float | None = field(default=None, init=False)
    last_time: float | None = field(default=None, init=False)
    base_latency: float | None = field(default=None, init=False)
    carried_calls: int = field(default=0, init=False)
    carried_latency_s: float = field(default=0.0, init=False)
    carried_fastest_s: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not self.tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {self.tolerance}")
        if not 0 < self.min_gradient <= 1:
            raise ValueError(f"min_gradient must be in (0, 1], got {self.min_gradient}")
        if not self.max_growth >= 1:
            raise ValueError(f"max_growth must be >= 1, got {self.max_growth}")
        if not 0 <= self.app_limited <= 1:
            raise ValueError(f"app_limited must be in [0, 1], got {self.app_limited}")
        require_fractions(self, "throttle_factor")
        if not self.slow_start_factor >= 1:
            raise ValueError(f"slow_start_factor must be >= 1, got {self.slow_start_factor}")
        if not self.startup_exit >= 1:
            raise ValueError(f"startup_exit must be >= 1, got {self.startup_exit}")
        if not self.startup_latency_exit > 1:
            raise ValueError(f"startup_latency_exit must be > 1, got {self.startup_latency_exit}")
        if not self.settle >= 0:
            raise ValueError(f"settle must be >= 0, got {self.settle}")
        if not self.queue_tolerance > 0:
            raise ValueError(f"queue_tolerance must be > 0, got {self.queue_tolerance}")
        if not self.min_calls >= 1:
            raise ValueError(f"min_calls must be >= 1, got {self.min_calls}")

    def _sample(self, target: float, obs: Observation) -> _Sample | None:
        """This poll's interval, or None when too few calls have finished yet to trust (or on the first poll).

        A poll with fewer than ``min_calls`` completions is carried into the next one (calls, latencies and the
        interval's start add up) instead of being dropped: at a small target with fast polls every single poll
        can be short of ``min_calls`` (live, against a rate-limited emulator: floor 1, 2 s polls, 7-8 calls a
        poll), and dropping them held the target at the floor for good.
        """
        if self.last_time is None:
            self.last_time = obs.time
        latency = obs.client_latency_mean_s
        if latency is None or not (math.isfinite(latency) and latency > 0) or obs.client_calls <= 0:
            if not self.carried_calls:
                self.last_time = obs.time  # nothing carried: the next interval starts here, as before
            return None
        self.carried_calls += obs.client_calls
        self.carried_latency_s += latency * obs.client_calls
        fastest = obs.client_latency_min_s
        if fastest is not None and math.isfinite(fastest):
            carried = self.carried_fastest_s
            self.carried_fastest_s = fastest if carried is None else min(carried, fastest)
        if self.carried_calls < self.min_calls:
            return None
        before, self.last_time = self.last_time, obs.time
        calls, latency = self.carried_calls, self.carried_latency_s / self.carried_calls
        fastest = self.carried_fastest_s
        self.carried_calls, self.carried_latency_s, self.carried_fastest_s = 0, 0.0, None
        rate = calls / (obs.time - before) if obs.time > before else math.nan
        concurrency = obs.inflight_mean if obs.inflight_mean is not None else float(obs.inflight_peak)
        return _Sample(target, concurrency, rate, latency, self._queue(latency, fastest))

    def _queue(self, mean: float, fastest: float | None) -> float:
        """Seconds of waiting shared by every call of the interval: ``(min − r0 × mean) / (1 − r0)``.

        A FIFO queue delays every call by about the same time, the fastest included, while batching slows calls
        in proportion to their length. So with ``r0`` the lowest ``min / mean`` ever seen (an interval with no
        queue), ``min = Q + r0 × S`` and ``mean = Q + S`` give the queue ``Q``. With identical calls ``r0`` is near
        1 and the estimate stays near 0: the latency setpoint alone then decides.
        """
        if fastest is None or not (math.isfinite(fastest) and 0 <= fastest <= mean):
            return 0.0
        ratio = fastest / mean
        self.fastest_ratio = ratio if self.fastest_ratio is None else min(self.fastest_ratio, ratio)
        r0 = self.fastest_ratio
        return 0.0 if r0 >= 1 else max(0.0, (fastest - r0 * mean) / (1 - r0))

    def _queueing(self, sample: _Sample) -> bool:
        return sample.queue >= self.queue_tolerance * (sample.latency - sample.queue)

    def _end_startup(self, at: _Sample) -> None:
        self.ramping, self.setpoint = False, self.tolerance * at.latency

    def next_target(self, target: float, obs: Observation) -> float:
        if obs.client_throttled > 0 or obs.client_errors > 0:
            self.last = None
            if self.ramping and self.setpoint is None:
                self.ramping = False  # the setpoint is learned from the next clean poll
            return self.throttle_factor * target
        sample, previous = self._sample(target, obs), self.last
        if sample is None:
            return target
        self.last = sample
        self.base_latency = sample.latency if self.base_latency is None else min(self.base_latency, sample.latency)
        limited = app_limited(obs, target, self.app_limited)
        if self.ramping:
            if limited:
                self.last = None  # a poll that did not use its window says nothing about the last doubling
                return target
            dt = obs.time - (self.polled_at if self.polled_at is not None else obs.time)
            self.polled_at = obs.time
            if previous is not None and not self.settled and sample.latency > self.settle * dt:
                # Calls last long against the poll: this interval's completions mostly started before the
                # doubling. Judge the doubling on the next interval, against the same level before it.
                self.settled, self.last = True, previous
                return target
            self.settled = False
            if previous is not None and self._past_knee(previous, sample):
                self._end_startup(previous)
                return previous.target  # drain: back to the level before the doubling that bought nothing
            if self.slow_start_factor > 1:
                return target * self.slow_start_factor
            self._end_startup(sample)
        if self.setpoint is None:
            self._end_startup(sample)
        assert self.setpoint is not None
        if self._queueing(sample):  # the setpoint let a queue build: it sits past the knee, so lower it
            service = sample.latency - sample.queue
            # Never below the unloaded latency (the lowest poll mean seen, Vegas's base RTT) x tolerance: a
            # setpoint under it cuts to the floor for good. The estimate misfires exactly there: with calls of one
            # size, one at a time, min / mean is near 1, far above a ratio learned from varied batches (live: the
            # setpoint fell from 0.07 s to 0.0006 s against calls of 0.27 s).
            base = self.tolerance * self.base_latency if self.base_latency is not None else 0.0
            self.setpoint = max(min(self.setpoint, service), min(self.setpoint, base))
        gradient = min(self.max_growth, max(self.min_gradient, self.setpoint / sample.latency))
        if limited:
            gradient = min(1.0, gradient)
        return target * gradient

    def _past_knee(self, before: _Sample, after: _Sample) -> bool:
        """Whether the doubling from ``before`` to ``after`` bought too few completions or only latency."""
        if after.latency >= self.startup_latency_exit * before.latency or self._queueing(after):
            return True
        if not (math.isfinite(after.rate) and math.isfinite(before.rate) and before.rate > 0):
            return False
        return after.rate < self.startup_exit * before.rate
