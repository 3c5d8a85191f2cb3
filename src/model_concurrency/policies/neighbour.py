"""Adaptive-neighbour: the default policy, made a good neighbour to the engine's other tenants.

A batch job rarely owns the engine it calls: a chat UI or agents share it, and when the batch fills the engine
they pay first, in time to first token (docs/neighbour.md). ``adaptive`` fills whatever the engine has; this
wrapper keeps its every decision while nobody else shows up, and adds three rules, all read from the
Observation (a policy never does I/O):

* **onset**: on an engine loaded to its fill line at least (``1 − headroom`` of its capacity: the most it has
  run since it first queued ``queue_share`` of its running requests), the others' load (``running + waiting −
  inflight``: everything on the engine that is not ours) rose by at least ``rise`` requests since the previous
  poll, beyond any growth of our own in-flight ("rising while our in-flight is flat": our own calls may reach the
  engine's gauges late). Somebody else's arrivals are taking the engine's last slots: cut at once to
  ``burst_fraction`` × the target (0, the default, is the floor), and hold there. Below the fill line a rise finds
  free slots: no cut. A rise that our own growth makes uncertain (or one during our first ramp, with
  ``cut_in_ramp`` False) still switches the headroom on;
* **refill**: after ``min_active_s`` of holding, whichever comes first: the others' load halved since the
  previous poll (``exit_drop``; the tenant went idle), or rose by another ``rise`` (a fellow batch client saw
  the tenant leave first and refilled, which hides the fall from us), or the engine is back at the fill line
  without us (whoever fills it takes what we leave, so the cut buys the neighbour nothing); or ``max_active_s``
  passed (the safety net for an onset misread). The target goes back to where the cut found it (under the
  fill line), and the wrapped policy takes over again. For ``settle_s`` after a refill no onset is read: the
  batch clients refilling together raise each other's "others";
* **headroom**: for ``memory_s`` after an onset (or an uncertain rise), even between bursts, the engine is kept
  at most ``1 − headroom`` full. The wrapped policy sees the load above that line as capacity-waiting (its own
  cut and equal steps keep the clients fair under it), and no answer exceeds our in-flight plus our share of
  the room under it: the next burst's first requests then find free slots instead of a queue behind ours. The
  lab's static 64 per client (three quarters of the engine's sequences) served the idle windows as fast as the
  ungated batch (docs/neighbour.md): the line costs little.

Why the other tenants' load and not their TTFT: vLLM's waiting and running gauges are on every page at every
poll, instantaneous, and our own share of them is known (``inflight``); a TTFT histogram mixes our calls with
theirs. The price: other batch clients are "others" too. They move only at their own polls and by our own rules,
which is what the fill line, ``settle_s``, ``min_active_s`` and the refill's two peer rules are for;
docs/neighbour.md gives the figures, the scenarios without a neighbour included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from model_concurrency.observation import Observation
from model_concurrency.policies._common import own_share
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.base import Target

__all__ = ["AdaptiveNeighbour"]


def _others(obs: Observation) -> float:
    """Everything on the engine that is not ours: its running and waiting requests less our calls in flight."""
    return max(0.0, obs.running + obs.waiting - obs.inflight)


def _scaled(answer: float, requests: float) -> float:
    """``requests`` with the answer's token budget scaled in proportion (a plain float stays plain)."""
    tokens = getattr(answer, "tokens", None)
    if tokens is None:
        return requests
    return Target(requests, tokens * requests / float(answer) if float(answer) > 0 else tokens)


@dataclass(slots=True)
class AdaptiveNeighbour:
    """``adaptive`` (its every rule, unchanged) plus onset cut, refill and headroom for the engine's other tenants.

    Parameters (docs/neighbour.md, "The neighbour mode"):
        rise: the others' load rising by this many requests between two polls (our own growth discounted) is a
            burst's onset (default 16, > 0). The lab's tenant adds 15 to 80 requests within a poll of a burst's
            start; one client's +1-a-poll steps, or another's 10 % cut, do not come near.
        burst_fraction: at onset the target is cut to this × itself (default 0: the controller's floor), in [0, 1].
        exit_drop: the burst is over when the others' load falls to this × its level at the previous poll, by at
            least ``rise / 2`` requests (default 0.5, in (0, 1]): the tenant's requests finishing with nothing
            after them.
        min_active_s: the cut holds at least this long (default 20 s): other clients that saw the onset too cut a
            poll later, and their calls finishing then must not read as the tenant leaving.
        max_active_s: a cut never holds longer than this (default 150 s): an onset misread (a fellow batch
            client's growth) costs at most this much.
        settle_s: after a refill, no onset is read for this long (default 30 s): the batch clients refilling
            together raise each other's "others".
        headroom: while a neighbour was seen in the last ``memory_s``, the engine is kept at most ``1 −
            headroom`` of its capacity full (default 0.25, in [0, 1); 0 switches it off).
        memory_s: how long after an onset the headroom is kept (default 600 s).
        cut_in_ramp: cut for an onset during our own first ramp too (default True): a burst that meets the
            batch's first ramp is protected (``interactive-bursts-2x``'s first burst). False would spare fellow
            clients that start with us, whose doublings on an engine that has just queued read as onsets, but
            splits ``multi-client`` less evenly (Jain 0.61 against 0.84: ``model-concurrency compare multi-client
            --policies adaptive-neighbour,P``, ``P`` a preset of this policy with ``cut_in_ramp = false``).
        queue_share: the engine's capacity (the fill line's base) is known from its first queue of at least this
            share of its running requests (default 0.02, >= 0): one request caught between two steps queues
            for a moment on an engine far from full, and a fill line drawn there has fellow clients' ramps read
            as onsets. 0 splits ``multi-client`` less evenly (Jain 0.70 against 0.84) at more goodput (0.984
            against 0.968 of the oracle's), measured as for ``cut_in_ramp`` with ``queue_share = 0``.
        adaptive: parameters of the wrapped ``adaptive`` policy (a preset's ``[adaptive]`` table); None: its
            defaults.
    """

    rise: float = 16.0
    burst_fraction: float = 0.0
    exit_drop: float = 0.5
    min_active_s: float = 20.0
    max_active_s: float = 150.0
    settle_s: float = 30.0
    headroom: float = 0.25
    memory_s: float = 600.0
    cut_in_ramp: bool = True
    queue_share: float = 0.02
    adaptive: Mapping[str, Any] | None = None
    inner: Adaptive = field(init=False, repr=False)
    previous: tuple[float, float] | None = field(default=None, init=False)  # (others, inflight) at the last poll
    active_since: float | None = field(default=None, init=False)  # the onset's time while a cut holds
    onset_rise: float = field(default=0.0, init=False)
    resume_to: float = field(default=0.0, init=False)  # the target the cut found
    seen_at: float | None = field(default=None, init=False)  # the last onset
    refilled_at: float | None = field(default=None, init=False)
    capacity: float | None = field(default=None, init=False)  # the most the engine has run since its first queue

    def __post_init__(self) -> None:
        if not self.rise > 0:
            raise ValueError(f"rise must be > 0, got {self.rise}")
        if not 0 <= self.burst_fraction <= 1:
            raise ValueError(f"burst_fraction must be in [0, 1], got {self.burst_fraction}")
        if not 0 < self.exit_drop <= 1:
            raise ValueError(f"exit_drop must be in (0, 1], got {self.exit_drop}")
        if not 0 <= self.min_active_s <= self.max_active_s:
            raise ValueError("min_active_s must be >= 0 and <= max_active_s")
        if not (self.settle_s >= 0 and self.memory_s >= 0):
            raise ValueError("settle_s and memory_s must be >= 0")
        if not self.queue_share >= 0:
            raise ValueError(f"queue_share must be >= 0, got {self.queue_share}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom}")
        self.inner = Adaptive(**dict(self.adaptive or {}))

    @property
    def active(self) -> bool:
        """A cut for a neighbour's burst holds now."""
        return self.active_since is not None

    @property
    def wants_fast_polls(self) -> bool:
        """The wrapped policy's first-ramp polls, never while a cut holds (nothing ramps then)."""
        return not self.active and self.inner.wants_fast_polls

    def next_target(self, target: float, obs: Observation) -> float:
        others = _others(obs)
        previous, self.previous = self.previous, (others, float(obs.inflight))
        queued = obs.waiting_capacity > 0 and obs.waiting_capacity >= self.queue_share * obs.running
        if (queued or self.capacity is not None) and obs.running > (self.capacity or 0.0):
            # Known from the first real queue on, and never below what the engine has run since.
            self.capacity = obs.running
        if self.active_since is not None:
            return self._hold(target, obs, others, previous)
        ramping = self.inner.ramping  # before this poll: the poll that ends our ramp may be a fellow's doubling
        answer = self.inner.next_target(target, self._view(obs))
        rise = self._rise(obs, others, previous, ramping)
        if rise is not None:
            self.active_since, self.seen_at, self.onset_rise = obs.time, obs.time, rise
            self.resume_to = max(float(target), float(answer))
            # A plain number: the token budget goes unenforced while the cut holds, so the controller's floor holds
            # too (a budget scaled down with the requests let one weighted call through at a time).
            return self.burst_fraction * min(float(target), float(answer))
        return self._room(answer, obs)

    def _rise(
        self, obs: Observation, others: float, previous: tuple[float, float] | None, ramping: bool
    ) -> float | None:
        """The others' rise since the previous poll, if it marks an onset (rule "onset"), else None.

        Only on an engine loaded to the fill line at least (its capacity known: it has queued once): below it,
        whoever grows beside us finds free slots, and the rises there are mostly fellow clients ramping."""
        if previous is None or self.capacity is None or self.inner.one_step:
            # A one-step (pooling) engine has no first token to protect, and its clients poll about once a
            # step, far faster than the seconds these rules hold for (``embed-shared`` loses most of its goodput).
            return None
        if obs.running + obs.waiting < (1 - self.headroom) * self.capacity:
            return None
        if self.refilled_at is not None and obs.time - self.refilled_at < self.settle_s:
            return None
        before, inflight_before = previous
        if others - before >= self.rise:
            # Somebody else grew on a loaded engine: keep the headroom from now on, even if our own growth at the
            # same time makes the rise too uncertain to cut for (below).
            self.seen_at = obs.time
        rise = others - before - max(0.0, obs.inflight - inflight_before)
        if rise < self.rise or (ramping and not self.cut_in_ramp):
            return None
        return rise

    def _hold(self, target: float, obs: Observation, others: float, previous: tuple[float, float] | None) -> float:
        """While a cut holds: the cut's target, until the others' load falls (or the safety net): then refill."""
        since = self.active_since
        assert since is not None
        held = obs.time - since
        before = previous[0] if previous is not None else others
        fell = before - others >= 0.5 * self.rise and others <= self.exit_drop * before
        # A rise as large as an onset's, once our fellow clients' cuts have landed: one of them refilled (it saw
        # the tenant leave first), and its calls now hide the tenant's fall from us.
        peer_refilled = others - before >= self.rise
        # The engine back at the fill line without us: whoever filled it takes whatever we leave (other batch
        # clients, or a tenant that would fill it alone), so holding buys the neighbour nothing.
        line = self._fill_line(obs)
        full = line is not None and obs.running + obs.waiting >= line
        if held >= self.max_active_s or (held >= self.min_active_s and (fell or peer_refilled or full)):
            self.active_since, self.refilled_at = None, obs.time
            answer = self.inner.next_target(max(float(target), self.resume_to), self._view(obs))
            return self._room(answer, obs)
        return target

    def _fill_line(self, obs: Observation) -> float | None:
        """``(1 − headroom) ×`` the engine's capacity while a neighbour was seen in the last ``memory_s``, else
        None (rule "headroom" off: no neighbour lately, no capacity learnt yet, or ``headroom`` 0)."""
        if self.headroom <= 0 or self.seen_at is None or obs.time - self.seen_at > self.memory_s:
            return None
        return None if self.capacity is None else (1 - self.headroom) * self.capacity

    def _view(self, obs: Observation) -> Observation:
        """What the wrapped policy sees: the engine as it is, or (rule "headroom") with the load above the fill
        line shown as capacity-waiting, so that its own cut to the served share and its equal steps keep the
        clients fair below the line, as they keep them below the engine's own limit."""
        line = self._fill_line(obs)
        over = None if line is None else obs.running + obs.waiting - line
        if over is None or over <= obs.waiting_capacity:
            return obs
        return dataclasses.replace(obs, waiting_capacity=over)

    def _room(self, answer: float, obs: Observation) -> float:
        """The answer capped at our in-flight plus our share of the room below the fill line (rule "headroom"):
        a refill or a restore of the wrapped policy lands under the line, not in the next burst's slots."""
        line = self._fill_line(obs)
        if line is None:
            return answer
        share = own_share(obs) if obs.inflight > 0 else 1.0
        cap = max(1.0, obs.inflight + share * (line - obs.running - obs.waiting))
        return answer if float(answer) <= cap else _scaled(answer, cap)
