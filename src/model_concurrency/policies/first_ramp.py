"""The default policy's first ramp: how ``Adaptive`` climbs from its floor before it has met the engine's limit.

Functions of the policy they steer (they read and set its learnt state), kept apart so that each module reads in
one sitting. TCP's slow start doubles once per round trip, clocked by its acknowledgements; a poll is not a round
trip, so the ramp grows ``slow_start_factor`` per round trip of our calls that the poll's interval held, at most
``jump_max_factor`` a poll, and only alone on the engine (beside peers whoever polled first would take it). Alone
and with the KV figures, it jumps ``jump_fraction`` of the way to the bound the cache (and a stated sequence
limit) puts on our in-flight; the next clean poll makes the jump the remembered level, from which the probes go
on. It ends when a growth bought too little completion rate, when the engine stopped taking our growth, or at the
first queue (the policy's cut). On a one-step engine it grows only once our calls came back since the last growth.
"""

from __future__ import annotations

import math
from typing import Protocol

from model_concurrency.observation import Observation
from model_concurrency.policies._common import own_share
from model_concurrency.policies.kv import KvEstimate

__all__ = ["Ramping", "absorbing", "admitting", "grow"]


class Ramping(Protocol):
    """What the first ramp reads and sets of the policy it steers (``Adaptive``): its parameters, what it has
    learnt, and the ramp's own state."""

    slow_start_factor: float
    startup_exit: float
    increase_step: float
    jump_share: float
    jump_fraction: float
    jump_max_factor: float
    one_step: bool
    w_max: float | None
    w_max_time: float
    probes: int
    jump_to: float | None
    held: bool
    ramp_grown_at: float | None
    startup_rate: float | None
    startup_load: tuple[float, float] | None

    @property
    def ramping(self) -> bool: ...

    @property
    def pipelining(self) -> bool: ...

    @property
    def wants_fast_polls(self) -> bool: ...

    def on(self, rule: str) -> bool: ...

    def kv_estimate(self, obs: Observation) -> KvEstimate | None: ...

    def stated_bound(self, obs: Observation) -> float: ...

    def waited(self, obs: Observation) -> bool | None: ...


def absorbing(p: Ramping, obs: Observation, risen: float | None) -> bool:
    """On the first ramp, a queue no larger than what ``running`` took in since our previous poll: a burst
    being admitted over several steps (most often another client's ramp), held rather than cut."""
    if not p.on("admission-hold") or not p.ramping or risen is None or p.pipelining:
        return False
    if obs.preemptions > 0 or (obs.kv_cache_usage or 0.0) >= 1.0:
        return False
    return 0 < obs.waiting_capacity <= risen


def admitting(p: Ramping, obs: Observation) -> bool:
    """The jump's step found the engine still taking it in (``running`` rose by at least half of our growth):
    hold one poll, once per first ramp, so the cut does not record a capacity the engine does not have."""
    load = p.startup_load
    if not p.wants_fast_polls or load is None or p.held:
        return False
    p.held = True
    p.startup_load = (float(obs.inflight), obs.running)
    grew = obs.inflight - load[0]
    return grew > 0 and obs.running - load[1] >= 0.5 * grew


def grow(p: Ramping, target: float, obs: Observation, rate: float | None) -> float:
    """The first ramp's answer for this poll (the module docstring's rules)."""
    if _blind(p, obs):
        return target
    answer = _ramp_step(p, target, obs, rate)
    if answer > target:
        p.ramp_grown_at = obs.time
    return answer


def _blind(p: Ramping, obs: Observation) -> bool:
    """On a one-step engine our last growth shows only once our calls came back since it: grow again only then
    (clients polling milliseconds apart would otherwise double blind)."""
    grown_at = p.ramp_grown_at
    if grown_at is None or not p.on("one-step") or not (p.one_step or obs.generation_tokens == 0):
        return False
    latency = obs.client_latency_mean_s
    return obs.client_calls <= 0 or (latency is not None and obs.time - grown_at < latency)


def _ramp_step(p: Ramping, target: float, obs: Observation, rate: float | None) -> float:
    grown = _startup(p, target, obs, rate)
    estimate, (jumped, p.jump_to) = p.kv_estimate(obs), (p.jump_to, None)
    if estimate is None:
        return grown
    bound = min(estimate.bound, p.stated_bound(obs))
    if p.ramping and jumped is not None and target >= jumped - 1:
        # The jump ran a poll without saturating: a floor under the capacity. Probe above it from here.
        p.w_max, p.w_max_time, p.probes = target, obs.time, 0
        p.startup_rate = p.startup_load = None
        return min(target + p.increase_step, max(target, bound))
    if p.ramping and p.on("kv-jump") and own_share(obs) >= p.jump_share and not p.one_step:
        # Not on a one-step engine: a pooling sequence holds one block, and the KV bound says nothing there.
        jump = target + p.jump_fraction * (bound - target)
        step = min(jump, p.jump_max_factor * target)
        if step > grown:
            grown = step
            if step >= jump:  # landed where the bound said: the next poll judges the jump
                p.jump_to = min(grown, max(target, bound))
    return min(grown, max(target, bound))


def _startup(p: Ramping, target: float, obs: Observation, rate: float | None) -> float:
    """Grow, unless the last growth bought too little: our completion rate rose by less than ``startup_exit``,
    or the engine's ``running`` rose by less than half of our own increase (full; we only displace others)."""
    previous, p.startup_rate = p.startup_rate, rate
    load, p.startup_load = p.startup_load, (float(obs.inflight), obs.running)
    if previous and rate is not None and rate < p.startup_exit * previous and _turned_over(p, obs, load):
        p.w_max, p.w_max_time, p.probes = target, obs.time, 0
        p.startup_rate = p.startup_load = None
        return target + p.increase_step
    if p.on("engine-full-exit") and load is not None and not p.pipelining:
        grew = obs.inflight - load[0]
        risen = obs.running - load[1]
        # A running that fell by more than we added is others leaving, which says nothing of fullness.
        if grew > 0 and risen < 0.5 * grew and not (p.on("turnover-ramp") and risen < -grew):
            before = max(target / p.slow_start_factor, target - grew + max(0.0, risen))
            p.w_max, p.w_max_time, p.probes = before, obs.time, 0
            p.startup_rate = p.startup_load = None
            return before + p.increase_step
    return max(target * _ramp_factor(p, obs), target + p.increase_step)


def _turned_over(p: Ramping, obs: Observation, load: tuple[float, float] | None) -> bool:
    """The interval's completions add up to the window we held: one round trip of it, so its rate says what
    the window buys (a poll shorter than a call compares a handful of completions)."""
    return not p.on("turnover-ramp") or load is None or obs.client_calls >= load[0]


def _ramp_factor(p: Ramping, obs: Observation) -> float:
    """Alone, ``slow_start_factor`` per round trip the interval held (``calls / inflight_mean``), as TCP's slow
    start doubles per round trip, at most ``jump_max_factor``; only over an interval without a queue worth a
    cut. Beside peers one factor a poll: whoever polled first would take the engine."""
    if not p.on("turnover-ramp") or own_share(obs) < p.jump_share:
        return p.slow_start_factor
    window = obs.inflight_mean if obs.inflight_mean is not None else float(obs.inflight)
    if window <= 0 or obs.client_calls <= 0 or p.waited(obs):
        return p.slow_start_factor
    rounds = min(obs.client_calls / window, math.log(p.jump_max_factor, p.slow_start_factor))
    return max(p.slow_start_factor, math.pow(p.slow_start_factor, rounds))
