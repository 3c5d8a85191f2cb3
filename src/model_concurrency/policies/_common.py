"""Small helpers shared by the built-in policies: the own-share estimates every engine-aware policy needs.

vLLM's gauges are server-wide: ``running`` and ``waiting`` count every client's requests. A client that wants to
react to them must first estimate which part is its own, or a decrease with ten clients on the engine becomes an
increase to everybody's total (flaw 1 of the original controller, docs/policies.md).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from model_concurrency.observation import Observation

__all__ = [
    "CompletionShare",
    "IdleClock",
    "app_limited",
    "fleet_step",
    "one_step_engine",
    "own_share",
    "pipelined_share",
    "sustainable",
]


def app_limited(obs: Observation, target: float, near_full: float) -> bool:
    """True when this process did not use its window during the interval: peak in-flight ``< near_full × window``.

    The window is what the limiter opened, the target's whole part: a target of 2.9 admits 2 calls, and 2 in
    flight fill it, where ``0.8 × 2.9`` would call them short of it and hold the target there for good. The peak,
    not the in-flight count at the poll: a window that was full at any moment since the previous poll counts as
    used. Read at an instant, a poll taken just after a call finished sees ``target - 1`` and, with a small
    target (4 × 0.8 = 3.2), would hold forever.
    """
    return obs.inflight_peak < near_full * max(math.floor(target), 1)


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


@dataclass(slots=True)
class CompletionShare:
    """Our share of the engine's completions over the last ``batches`` engine batches: ``Σ client_calls / Σ completed``.

    On a one-step (embedding) engine the in-flight share misleads: a request spends a step on the engine and
    about as long on the wire (the answer going back, the next request coming in), where no gauge counts it, so
    a client beside a peer holds more calls in flight than the engine shows in all and reads a share of 1
    (``benchmarks/scale_out.py``: both clients on each engine did). Completions do not depend on where a call
    is: every call the engine finished is one a client counts a moment later. One poll is noisy when polls are
    about a step apart (0, 1 or 2 batches land in it, and ours may land in the next poll), so the share is
    summed over the polls that hold at least ``batches`` batches of completions (one poll when it holds that
    many on its own, as 12 s polls do)."""

    batches: float = 4.0
    # At most this many polls (an idle engine completes nothing, and the window must not grow without end).
    window: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=64))

    def update(self, obs: Observation, batch: float) -> float | None:
        """Add this poll's counts (``batch``: one engine step's requests) and return the share, or None."""
        if obs.ok and obs.completed is not None:
            self.window.append((obs.client_calls, obs.completed))
            while len(self.window) > 1 and sum(c for _, c in list(self.window)[1:]) >= self.batches * batch:
                self.window.popleft()
        return self.share

    @property
    def share(self) -> float | None:
        """``Σ client_calls / Σ completed`` over the window, capped at 1; None before the engine finished any."""
        done = sum(c for _, c in self.window)
        if done <= 0:
            return None
        return min(1.0, sum(n for n, _ in self.window) / done)


def sustainable(obs: Observation) -> float | None:
    """What the engine is serving us right now: ``inflight × running / (running + waiting)``; None when unknown.

    On a saturated engine this is the level at which our calls would stop queueing if every client did the same.
    """
    queued = obs.running + obs.waiting
    if obs.inflight <= 0 or queued <= 0:
        return None
    return obs.inflight * obs.running / queued


def one_step_engine(obs: Observation) -> bool | None:
    """True when the engine completed requests without generating a token since the previous poll (a pooling or
    embedding model: each request finishes in the step that reads its prompt); False when it generated tokens (a
    decoder); None when this poll cannot tell (no counter on the page, nothing completed, a failed poll).

    Read from ``vllm:generation_tokens_total`` and ``vllm:request_success_total``, never from the model's name.
    """
    generated, completed = obs.generation_tokens, obs.completed
    if generated is None:
        return None
    if generated > 0:
        return False
    return True if completed is not None and completed > 0 else None


def pipelined_share(obs: Observation, batch: float) -> float | None:
    """:func:`sustainable` for a one-step engine, where one batch queued behind the running one is no overload.

    Such an engine finishes a whole batch in one step, and its clients' next requests reach it over the following
    milliseconds: with only ``running`` in flight the next step starts with the first arrivals and runs part
    empty. A batch waiting keeps every step full, so the level at which our calls stop queueing is our share of
    ``running + batch``: ``inflight × (running + batch) / (running + waiting + batch)``, capped at ``inflight``.
    The batch sits in the denominator too: our in-flight count includes the batch on its way back to the engine,
    which the engine's gauges never show.
    """
    queued = obs.running + obs.waiting
    if obs.inflight <= 0 or queued <= 0:
        return None
    return obs.inflight * min(1.0, (obs.running + batch) / (queued + batch))


def fleet_step(step: float, obs: Observation, full_running: float, exponent: float) -> float:
    """An additive step that shrinks on an engine (or fleet) running more than ``full_running`` sequences.

    N clients that each add ``step`` per poll add ``N × step`` to the engine per poll interval: 1,000 clients
    adding one request every 12 s push a 16,384-sequence fleet by 1,000 a poll, so some engine is always just
    past its limit. A bigger fleet serves more clients, so the step is scaled by
    ``(full_running / running) ** exponent``: at exponent 0.5 and 1,024, 1,000 clients on that fleet add 250 a
    poll interval together (1.5 % of it), and up to 1,024 running nothing changes. Every client sharing the engine
    reads the same ``running``, so their steps stay equal, and equal steps with proportional cuts are what
    converges to equal shares (Chiu & Jain). A step scaled by the client's own share would not: increase and cut
    both proportional keep whatever split there is (``scripts/fleet_figures.py split``).
    """
    running = obs.running
    if exponent == 0 or running <= full_running:
        return step
    return float(step * (full_running / running) ** exponent)
