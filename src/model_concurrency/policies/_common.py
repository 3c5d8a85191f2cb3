"""Small helpers shared by the built-in policies: the own-share estimates every engine-aware policy needs.

vLLM's gauges are server-wide: ``running`` and ``waiting`` count every client's requests. A client that wants to
react to them must first estimate which part is its own, or a decrease with ten clients on the engine becomes an
increase to everybody's total (flaw 1 of the original controller, docs/policies.md).
"""

from __future__ import annotations

import math

from model_concurrency.observation import Observation

__all__ = ["finite_or", "own_share", "sustainable"]


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


def finite_or(value: float, fallback: float) -> float:
    """``value`` if finite, else ``fallback``: policies keep their internal state finite whatever they are fed."""
    return value if math.isfinite(value) else fallback
