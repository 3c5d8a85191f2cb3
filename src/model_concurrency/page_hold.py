"""Hostile pages: engine readings that are not a capacity signal, where the target must hold.

Every policy reads "requests waiting for capacity" (or preemptions) as "the engine is full: cut". Three failure
pages seen in the wild say that and are lying, and a controller that believes them cuts poll after poll to the
floor while the engine serves everything it is sent:

* **the wedged request** (vLLM #52520): one request near the KV ceiling is never scheduled while the engine serves
  everything else: ``waiting_by_reason{capacity}`` stuck at 1;
* **the livelock page** (vllm-metal #479): ``running 0``, KV 0, capacity-waiting 6, for an hour;
* **the retraction livelock** (SGLang PR #37260): retractions (preemptions) climbing at zero completions.

:class:`PageHold` tells them from a full engine with what the controller already has, the poll's Observation, and
answers "hold at this target" instead of asking the policy. It is not a policy (it wraps every policy the same way,
in :class:`~model_concurrency.controller.ControllerCore`, so a policy rewritten tomorrow keeps it) and does no
I/O. The rules, each a property a full engine cannot have:

* **nothing runs** (livelock): requests wait for capacity while ``running`` is 0 and nothing completed since the
  previous poll. A full engine runs something; an empty one that admits nothing will not admit more for our
  cutting. Held from the first such poll.
* **a waiting count that room does not drain** (wedge): the capacity-waiting count ``w`` has kept exactly the same
  value since it appeared, while (a) the engine completed at least as many requests as it was running then
  (a whole batch turned over: with FCFS admission any request that fits the cache at all would have been admitted
  into the blocks that freed), (b) room appeared: our in-flight count or the engine's ``running`` fell by more
  than ``w`` since, and (c) by Little's law the queue that flowed held at least one request fewer than ``w``:
  the requests admitted meanwhile waited ``Σ queue time`` in all (the queue-time histogram's deltas), an average
  population of ``Σ queue time / seconds``, so the rest of ``w`` never moved. A real queue moves when room
  appears, a queue of ours shrinks when we cut; this one did neither. Without queue-time figures nothing is
  proven and the policy decides. The spell's first polls are the policy's (a wedge and a queue of exactly ``w``
  from a closed loop one over capacity look the same until a cut shows which), so once it is confirmed the target
  goes back to where it was when ``w`` appeared: the cuts made on a reading that proved not to be a signal are
  undone. (Without (c), a queue kept at one length by two clients sharing an engine fired it on
  ``embed-shared`` and ``multi-client-32``; with it, no bundled scenario checked holds a single poll.)
* **retractions at zero goodput** (retraction livelock): preemptions on ``retraction_polls`` consecutive polls
  (3) without a single completion. Held from then, back at the target the spell started from; before that the
  spell's polls may not grow the target (:meth:`PageHold.growth_cap`): an engine retracting what it admitted and
  finishing nothing has no room, whatever its queue says.

A hold ends on the first poll that breaks its rule (the count moves, a completion, ``running`` above 0); the
policy then decides again from the held target. While a hold lasts the poll does not count as saturated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from model_concurrency.observation import Observation

__all__ = ["LIVELOCK", "RETRACTION_LIVELOCK", "WEDGED", "PageHold"]

LIVELOCK = "livelock: requests wait for capacity on an engine that runs nothing"
WEDGED = "wedged: a capacity-waiting count that room does not drain"
RETRACTION_LIVELOCK = "retraction livelock: preemptions at zero completions"

log = logging.getLogger("model_concurrency")


@dataclass(slots=True)
class _Spell:
    """Polls since a reading appeared: its value, the target then, and what changed since."""

    value: float
    target: float
    inflight: int
    running: float
    completed: float = 0.0
    polls: int = 1
    confirmed: bool = False
    # Little's law over the spell: Σ (queue time of the requests admitted) and the seconds it covers; None once a
    # poll had no queue-time figures (the page lacks the histogram, or nothing was admitted).
    queued_s: float | None = 0.0
    elapsed_s: float = 0.0


@dataclass(slots=True)
class PageHold:
    """Pure state over successive good polls: the target to hold at, or None to let the policy decide."""

    enabled: bool = True
    retraction_polls: int = 3
    reason: str | None = None  # why the last good poll was held (None: the policy decided)
    holds: int = 0  # polls held, over the runtime's life
    _queue: _Spell | None = None
    _retraction: _Spell | None = None
    _last_time: float | None = None

    @property
    def active(self) -> bool:
        return self.reason is not None

    def judge(self, target: float, obs: Observation) -> float | None:
        """For a good poll: the target to hold (``target`` or the spell's start), or None (ask the policy).

        One log line when a hold starts or changes reason, one when it ends; none while it lasts."""
        before = self.reason
        held = self._judge(target, obs)
        if self.reason != before:
            if self.reason is not None:
                log.warning("engine page is not a capacity signal (%s): holding the target at %.0f", self.reason, held)
            else:
                log.info("engine page is a capacity signal again: the policy decides")
        return held

    def _judge(self, target: float, obs: Observation) -> float | None:
        self.reason = None
        if not self.enabled or not obs.ok:
            return None
        elapsed = obs.time - self._last_time if self._last_time is not None else 0.0
        self._last_time = obs.time
        queue = self._track_queue(target, obs, elapsed)
        retraction = self._track_retraction(target, obs)
        completed = obs.completed or 0.0
        if obs.waiting_capacity > 0 and obs.running <= 0 and completed <= 0:
            self.reason, held = LIVELOCK, target
        elif queue is not None:
            self.reason, held = WEDGED, max(target, queue)
        elif retraction is not None:
            self.reason, held = RETRACTION_LIVELOCK, retraction
        else:
            return None
        self.holds += 1
        return held

    def growth_cap(self, target: float) -> float | None:
        """The most the policy may answer this poll: ``target`` while a retraction spell is open (not yet held),
        else None (no cap)."""
        return target if self.enabled and self._retraction is not None and self.reason is None else None

    def _track_queue(self, target: float, obs: Observation, elapsed: float) -> float | None:
        """The wedge rule: the spell's start target once confirmed, else None."""
        w = obs.waiting_capacity
        spell = self._queue
        if w <= 0:
            self._queue = None
            return None
        if spell is None or w != spell.value:
            self._queue = _Spell(w, target, obs.inflight, obs.running)
            return None
        spell.polls += 1
        completed = obs.completed or 0.0
        spell.completed += completed
        spell.elapsed_s += elapsed
        mean = obs.queue_time_mean_s
        spell.queued_s = None if spell.queued_s is None or mean is None else spell.queued_s + mean * completed
        if not spell.confirmed:
            turned_over = spell.completed >= max(spell.running, w + 1)
            room = spell.inflight - obs.inflight > w or spell.running - obs.running > w
            spell.confirmed = turned_over and room and _stuck(spell)
        return spell.target if spell.confirmed else None

    def _track_retraction(self, target: float, obs: Observation) -> float | None:
        """The retraction rule: the spell's start target once it lasted ``retraction_polls``, else None."""
        if not (obs.preemptions > 0 and obs.completed is not None and obs.completed <= 0):
            self._retraction = None
            return None
        spell = self._retraction
        if spell is None:
            self._retraction = spell = _Spell(obs.preemptions, target, obs.inflight, obs.running, polls=0)
        spell.polls += 1
        return spell.target if spell.polls >= self.retraction_polls else None


def _stuck(spell: _Spell) -> bool:
    """Little's law: the requests admitted during the spell spent ``Σ queue time`` waiting, i.e. an average of
    ``Σ queue time / seconds`` of them were in the queue at any moment. A queue that flows holds that many; when the
    gauge shows at least one more, that one is not flowing. Without queue-time figures nothing is proven."""
    if spell.queued_s is None or spell.elapsed_s <= 0:
        return False
    return spell.queued_s / spell.elapsed_s < spell.value - 0.5
