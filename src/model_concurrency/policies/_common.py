"""Small helpers shared by the built-in policies: the own-share estimates every engine-aware policy needs.

vLLM's gauges are server-wide: ``running`` and ``waiting`` count every client's requests. A client that wants to
react to them must first estimate which part is its own, or a decrease with ten clients on the engine becomes an
increase to everybody's total (flaw 1 of the original controller, docs/policies.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from model_concurrency.observation import Observation

__all__ = ["IdleClock", "app_limited", "own_share", "sustainable"]


def app_limited(obs: Observation, target: float, near_full: float) -> bool:
    """True when this process did not use its window during the interval: peak in-flight ``< near_full × target``.

    The peak, not the in-flight count at the poll: a window that was full at any moment since the previous poll
    counts as used. Read at an instant, a poll taken just after a call finished sees ``target - 1`` and, with a
    small target (4 × 0.8 = 3.2), would hold forever.
    """
    return obs.inflight_peak < near_full * target


@dataclass(slots=True)
class IdleClock:
    """How long this process has had nothing in flight (by ``obs.time``), for policies that forget when idle."""

    since: float | None = None

    def idle_for(self, obs: Observation) -> float:
        """Seconds of polls whose whole interval had nothing in flight; 0 once anything ran."""
        if obs.inflight_peak > 0:
            self.since = None
            return 0.0
        if self.since is None or obs.time < self.since:
            self.since = obs.time
        return obs.time - self.since

    def idle_past(self, obs: Observation, seconds: float) -> bool:
        """True when this poll ends an idle spell of at least ``seconds``: what was learnt is stale, forget it."""
        return self.idle_for(obs) >= seconds and self.since is not None


def own_share(obs: Observation) -> float:
    """This process's fraction of the engine's load: ``inflight / (running + waiting)``, 1 when alone, in [0, 1].

    Our calls queue and run like everyone else's, so the fraction of the engine's requests that are ours is the
    fraction of its capacity we are being served. An engine reporting no load while we have calls in flight
    (gauges lag a poll behind) means we are alone: share 1.
    """
    queued = obs.running + obs.waiting
    if obs.inflight <= 0:
        return 0.0
    if queued <= 0:
        return 1.0
    return min(1.0, obs.inflight / queued)


def sustainable(obs: Observation) -> float | None:
    """What the engine is serving us right now: ``inflight × running / (running + waiting)``; None when unknown.

    On a saturated engine this is the level at which our calls would stop queueing if every client did the same.
    """
    queued = obs.running + obs.waiting
    if obs.inflight <= 0 or queued <= 0:
        return None
    return obs.inflight * obs.running / queued
