"""The client-side growth guard: runs beside every policy and only ever holds or lowers the target.

An engine-signal policy grows while the engine shows room (nothing waiting, KV free). When the bottleneck sits in
front of the engine (an API server tokenising on one CPU, a gateway, the network) the engine never queues, so
such a policy grows to the ceiling and latency balloons while completions per second stay flat. Only the client
sees that: its own completion rate stops rising with its concurrency while its latency rises (Little's law with
the queue moved out of the engine's sight). The guard watches exactly that, from the same ``client_*`` fields a
hosted endpoint gives, so it works whatever signal source feeds the policy:

* polls at one load make a sample once they hold ``min_calls`` completions over half a call's latency or more
  (:class:`_Span`): concurrency (the span's mean in flight), completion rate and mean latency, provided they agree
  with Little's law (concurrency ≈ rate × latency within ``steady``; otherwise the load changed within a call's
  latency and the rate describes an older load). The last ``window`` samples are kept;
* the knee is the lowest concurrency among the samples within ``rate_tolerance`` of the best rate;
* when the current sample runs ``over_knee`` × the knee's concurrency or more, with latency ``latency_rise`` ×
  the knee's or more, growth bought nothing: the guard caps the target at the knee. The cap then rises by
  ``probe`` a poll while the policy presses against it (so a capacity that grew is found again), stays while the
  policy sits at it (dropped there, a policy that took the cap as its target would double past it on its next
  probe), and is dropped once the policy is below it on its own;
* a ramp that jumps (the first ramp multiplies the target by up to eight a poll) can leave no sample between a
  concurrency that was too low and one far past the knee, and then the lowest sample on the plateau is the current
  one. So, when most of our calls sit in front of the engine (its ``running`` + ``waiting`` under
  :data:`FRONT_END_SHARE` of our concurrency: a front end, gateway or network holds the rest) and latency rose
  ``latency_rise`` × the lowest sampled, the cap is also set at ``front_end_gain`` × the best rate × that lowest
  latency: the concurrency the best rate needs at an unloaded call's latency (the bandwidth-delay product, twice
  it as TCP BBR's window), once the current sample runs ``over_knee`` × that or more. The knee rule then has
  samples on the plateau to judge by.

Throttled calls (429/503) are a harder signal, handled here so every policy gets the same rule. A rate limit is a
limit in calls per second, not in concurrency: by Little's law the concurrency that just fits is the allowed
rate × the call latency. So on a poll with throttled calls the **throttle cap** is set to ``throttle_margin`` ×
(calls served per second × their mean latency), and no higher than the target the 429s already drove it to
(:meth:`~model_concurrency.controller.ControllerCore.note_throttled`: the interval's rate may include a burst
the server's bucket allowed before it ran dry). It is kept while the policy sits below it, and rises only while
the policy presses against it: by ``throttle_recover`` a poll back to that estimate, then by ``throttle_probe``
a poll past it, so the target settles just under the limit and finds a raised limit again instead of sawing into
it.

It also judges an outage of ``/metrics`` (:meth:`GrowthGuard.trouble`): the controller hands the target over to
it after the grace instead of dropping to the floor, and falls to the floor when the guard sees trouble. The
guard's rules are in docs/operations.md; it does no I/O and reads time only from ``obs.time``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from model_concurrency.observation import Observation

__all__ = ["FRONT_END_SHARE", "GrowthGuard", "Sample"]

# "Most of our calls wait in front of the engine": fewer than this share of them in its ``running`` + ``waiting``.
# A quarter, not a half: a one-step (pooling) engine's second batch is on the wire between steps, so half our calls
# can be outside its gauges with nothing in front of it (``embed-batch``: 57 of 117 while the engine pipelines).
FRONT_END_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Sample:
    """One poll interval as the client saw it."""

    concurrency: float
    rate: float
    latency: float
    running: float = 0.0  # the engine's (or fleet's) server-wide running at the poll; 0 without engine signals
    waiting: float = 0.0  # the engine's (or fleet's) server-wide waiting at the poll


@dataclass(slots=True)
class _Span:
    """Consecutive polls at about one load, gathered into one sample.

    A rate measured over much less than a call's latency is noise (the first ramp polls every few round trips; 50
    completions in 0.1 s came in bursts of a batch) and describes the load the calls started at. Polls at
    concurrencies within ``over_knee`` of the span's mean add up until it holds ``min_calls`` completions and lasts
    half a mean latency or more (against a whole one, ``model-concurrency fuzz --n 80 --scale 0.25`` at seeds 41 and
    43: goodput p10 0.872 / 0.842 against 0.862 / 0.842).
    """

    calls: int = 0
    latency_sum: float = 0.0
    inflight_time: float = 0.0
    duration: float = 0.0

    @property
    def latency(self) -> float:
        return self.latency_sum / self.calls if self.calls else math.inf

    def holds(self, concurrency: float, factor: float) -> bool:
        """Whether a poll at ``concurrency`` belongs to this span's load (within ``factor`` of its mean)."""
        mean = self.inflight_time / self.duration
        return mean / factor <= concurrency <= mean * factor

    def add(self, dt: float, concurrency: float, calls: int, latency: float) -> None:
        self.calls += calls
        self.latency_sum += calls * latency
        self.inflight_time += concurrency * dt
        self.duration += dt


@dataclass(slots=True)
class GrowthGuard:
    """Caps the target at the knee of completions per second against concurrency when growth buys nothing.

    Parameters:
        enabled: apply the growth cap (``MODEL_CONCURRENCY_GROWTH_GUARD``); samples are kept either way.
        window: samples remembered (polls).
        min_calls: completions a poll needs to count as a sample (fewer are noise).
        rate_tolerance: rates within this fraction of the best count as the plateau.
        over_knee: concurrency this many times the knee's, or more, is growth to judge.
        latency_rise: latency this many times the knee's, or more, says the growth only queued.
        probe: the cap rises by this fraction a poll once set.
        outage_latency: during an outage, mean latency past this many times the baseline is trouble.
        baseline_window: polls in the latency baseline's EWMA (good polls only).
        throttle_margin: the throttle cap's share of the concurrency that fits the allowed rate.
        throttle_recover: the throttle cap's growth a poll, while pressed, up to that estimate.
        throttle_probe: its growth a poll, while pressed, past the estimate.
        alone_share: "alone on the engine" (default 0.9): our concurrency at least this share of its ``running``.
        reached_share: alone, growth of which the engine's ``running`` took at least this share (default 0.5, as the
            policies' full-pipe tests) reached the engine, and the cap does not judge it (``_engine_absorbed``).
        front_end_gain: with most of our calls in front of the engine, the cap's multiple of the best rate × the
            lowest sampled latency (``math.inf``: off).
        steady: a poll counts as a sample only while in flight is within this factor of rate × latency (Little's
            law). Completions lag concurrency by a call's latency, so right after a step (a ramp's fast polls,
            calls of several seconds) the rate still reflects the old load and would read as growth that
            bought nothing.
    """

    enabled: bool = True
    window: int = 10
    min_calls: int = 20
    rate_tolerance: float = 0.05
    over_knee: float = 1.25
    latency_rise: float = 1.2
    probe: float = 0.1
    outage_latency: float = 1.5
    baseline_window: float = 20.0
    steady: float = 1.5
    throttle_margin: float = 0.95
    throttle_probe: float = 0.01
    throttle_recover: float = 0.1
    alone_share: float = 0.9
    reached_share: float = 0.5
    front_end_gain: float = 2.0
    samples: deque[Sample] = field(init=False)
    cap: float | None = field(default=None, init=False)
    throttle_cap: float | None = field(default=None, init=False)
    throttle_fit: float | None = field(default=None, init=False)
    throttle_fired: int = field(default=0, init=False)
    baseline_latency: float | None = field(default=None, init=False)
    last_time: float | None = field(default=None, init=False)
    span: _Span | None = field(default=None, init=False)
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.window < 2 or self.min_calls < 1:
            raise ValueError("window must be >= 2 and min_calls >= 1")
        if not (self.over_knee > 1 and self.latency_rise > 1 and self.outage_latency > 1):
            raise ValueError("over_knee, latency_rise and outage_latency must be > 1")
        if not self.front_end_gain > 1:
            raise ValueError("front_end_gain must be > 1")
        if not self.steady > 1:
            raise ValueError("steady must be > 1")
        if not (0 <= self.rate_tolerance < 1 and self.probe >= 0):
            raise ValueError("rate_tolerance must be in [0, 1) and probe >= 0")
        if not (0 < self.throttle_margin <= 1 and self.throttle_probe >= 0 and self.throttle_recover >= 0):
            raise ValueError("throttle_margin must be in (0, 1], throttle_probe and throttle_recover >= 0")
        self.samples = deque(maxlen=self.window)

    def _sample(self, obs: Observation) -> Sample | None:
        """The span of polls that ends with ``obs``, once it is a sample (see :class:`_Span`), else None."""
        before, self.last_time = self.last_time, obs.time
        latency = obs.client_latency_mean_s
        concurrency = obs.inflight_mean if obs.inflight_mean is not None else float(obs.inflight_peak)
        if before is None or obs.time <= before or obs.client_errors or obs.client_throttled or concurrency <= 0:
            self.span = None  # failures are fast or slow for other reasons; a gap or idle breaks the span
            return None
        if obs.client_calls and (latency is None or not (math.isfinite(latency) and latency > 0)):
            self.span = None
            return None
        span = self.span
        if span is None or not span.holds(concurrency, self.over_knee):  # another load: a new span
            span = _Span()
        span.add(obs.time - before, concurrency, obs.client_calls, latency or 0.0)
        self.span = span
        if span.calls < self.min_calls or span.duration < 0.5 * span.latency:
            return None  # too short: the calls that ended in it started at another load
        self.span = None
        concurrency, rate, latency = span.inflight_time / span.duration, span.calls / span.duration, span.latency
        # Little's law, multiplied out (rate × latency can underflow to 0 on absurd inputs; no division).
        expected = rate * latency
        if not (expected / self.steady <= concurrency <= expected * self.steady and expected > 0):
            return None  # Little's law does not hold: the load moved within a call's latency (a ramp, a cut)
        return Sample(concurrency, rate, latency, obs.running, obs.waiting)

    def _knee(self) -> Sample | None:
        if len(self.samples) < 2:
            return None
        best = max(s.rate for s in self.samples)
        plateau = [s for s in self.samples if s.rate >= (1 - self.rate_tolerance) * best]
        return min(plateau, key=lambda s: s.concurrency)

    def _throttle_bound(self, target: float, proposed: float, obs: Observation, before: float | None) -> None:
        """Set or raise the throttle cap (see the module docstring)."""
        if obs.client_throttled > 0:
            served = obs.client_calls - obs.client_errors
            latency = obs.client_ok_latency_mean_s
            fit = None
            if before is not None and obs.time > before and served > 0 and latency is not None:
                fit = served / (obs.time - before) * latency  # Little's law at the rate the server allowed
            if fit is None or not math.isfinite(fit):  # nothing served: the limit is far below; halve
                fit = min(target, self.throttle_fit if self.throttle_fit is not None else math.inf) / 2
            self.throttle_fit = max(1.0, self.throttle_margin * fit)
            # Not above the target the 429s already drove it to (ControllerCore.note_throttled): the interval's
            # rate may still include a burst the server's bucket allowed before it ran dry.
            self.throttle_cap = max(1.0, min(self.throttle_fit, target))
            self.throttle_fired += 1
        elif self.throttle_cap is not None and self.throttle_fit is not None and proposed > self.throttle_cap:
            # Kept while the policy sits below it (the limit did not move because we stopped pressing on it);
            # it rises only while growth presses against it: quickly back to the estimate, slowly past it.
            if self.throttle_cap < self.throttle_fit:
                self.throttle_cap = min(self.throttle_fit, self.throttle_cap * (1 + self.throttle_recover))
            else:
                self.throttle_cap *= 1 + self.throttle_probe

    def bound(self, target: float, proposed: float, obs: Observation, *, good: bool = True) -> float:
        """The proposal, or less when growth bought nothing or the server throttled; records ``obs`` first."""
        before = self.last_time
        sample = self._sample(obs)
        if sample is not None:
            self.samples.append(sample)
            if good:
                a = 2 / (self.baseline_window + 1)
                base = self.baseline_latency
                self.baseline_latency = sample.latency if base is None else base + a * (sample.latency - base)
        if not self.enabled:
            return proposed
        self._throttle_bound(target, proposed, obs, before)
        if self.throttle_cap is not None:
            proposed = min(proposed, self.throttle_cap)
        knee = self._knee()
        if (
            sample is not None
            and knee is not None
            and sample.concurrency >= self.over_knee * knee.concurrency
            and sample.latency >= self.latency_rise * knee.latency
            and not self._engine_absorbed(knee, sample)
        ):
            self.cap = max(1.0, knee.concurrency)
            self.fired += 1
        elif sample is not None and (fit := self._front_end_fit(sample)) is not None:
            self.cap = fit
            self.fired += 1
        elif self.cap is not None:
            if max(target, proposed) < self.cap:  # no longer binds: the policy is below it on its own
                self.cap = None
            elif proposed > self.cap:  # pressed: rise, so a capacity that grew is found again
                self.cap *= 1 + self.probe
        return proposed if self.cap is None else min(proposed, self.cap)

    def _front_end_fit(self, sample: Sample) -> float | None:
        """The cap when most of our calls wait in front of the engine and growth only raised their latency (see the
        module docstring), else None. Without engine signals (``running`` and ``waiting`` read 0) it never fires:
        a hosted endpoint's calls may all be in its engine, and nothing here could tell."""
        at_engine = sample.running + sample.waiting
        if not 0 < at_engine < FRONT_END_SHARE * sample.concurrency or len(self.samples) < 2:
            return None
        base = min(s.latency for s in self.samples)
        if sample.latency < self.latency_rise * base:
            return None
        fit = self.front_end_gain * max(s.rate for s in self.samples) * base
        return max(1.0, fit) if sample.concurrency >= self.over_knee * fit else None

    def _engine_absorbed(self, knee: Sample, sample: Sample) -> bool:
        """The engine's ``running`` rose by ten times our growth or more since the knee: our growth was a small part
        of the engine's change, so our latency says nothing about what it bought.

        A fleet filling up slows every step (bigger batches) whoever grows, and the policy reads that from the
        engine's gauges; the guard is for a bottleneck in front of the engine, where ``running`` stays flat while
        our concurrency grows. On ``fleet-1000`` the cap fired on clients whose first doublings met the
        filling fleet's slower steps (``running`` up by thousands), and their policies then kept the cap as their
        share. Not any rise: where our growth is a fair part of the engine's (``multi-client``, 4 clients on one
        engine), the cap is also what stops a ramp's overshoot (at "half our growth" its Jain and its p99 queue
        both worsen there). Without engine signals ``running`` reads 0 and this is never true.

        Alone on the engine (our concurrency at least ``alone_share`` of its ``running`` at both polls) the question
        the guard asks can be answered directly: did our growth reach the engine? If ``running`` rose by at least
        ``reached_share`` of it, the bottleneck is the engine, whose queue and KV cache the policy reads; a rate
        that stopped rising there is the engine's own curve flattening, or the noise of a few dozen calls a poll
        (a rate's sampling error at 50 calls is ~14 %, the plateau's tolerance 5 %). Judged as growth that bought
        nothing, it cut single clients of long prompts far below the knee at a KV usage far from full (``fuzz-41-0135``,
        ``model-concurrency fuzz --seed 41``). Beside others our rate is theirs to move too, and the cap keeps its
        part in a shared ramp."""
        grew = sample.concurrency - knee.concurrency
        if grew <= 0:
            return False
        rose = sample.running - knee.running
        if rose >= 10 * grew:
            return True
        alone = all(s.running > 0 and s.concurrency >= self.alone_share * s.running for s in (knee, sample))
        return alone and rose >= self.reached_share * grew

    def trouble(self, obs: Observation) -> str | None:
        """Why an outage's hold is unsafe (None: the client's own calls look as they did while signals were good).

        No positive evidence is trouble too: no completed call, or no baseline to compare with.
        """
        if obs.client_errors:
            return f"{obs.client_errors} failed calls"
        if obs.client_throttled:
            return f"{obs.client_throttled} throttled calls"
        latency = obs.client_latency_mean_s
        if obs.client_calls == 0 or latency is None:
            return "no completed calls to judge by"
        if self.baseline_latency is None:
            return "no latency baseline"
        if not math.isfinite(latency) or latency > self.outage_latency * self.baseline_latency:
            return f"latency {latency:.3g} s past {self.outage_latency:g} x the baseline {self.baseline_latency:.3g} s"
        return None
