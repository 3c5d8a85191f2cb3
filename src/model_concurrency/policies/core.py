"""The adaptive core: a graded cut, growth paced by turnover, and an explicit wall.

Four rules, each read from the interval since the previous poll rather than from one instant
(``Observation.started`` / ``queue_waits``, signals/interval.py):

* **How saturated the interval was** (``saturation``): ``F`` in [0, 1], the largest of the share of the requests
  that left the queue after waiting longer than ``wait_s`` (the queue-time histogram's bucket deltas: DCTCP's
  marked fraction), the share of the engine's load waiting at the poll (``waiting_capacity / (running +
  waiting_capacity)``), and preemptions over ``running``. One long prompt waiting a step among 69 running is
  ``F`` = 0.014, not a saturated poll.
* **The cut, graded** (DCTCP): ``T' = min(T × (1 − cut_gain × F), S)`` with ``S`` the served share when a queue
  stands at the poll (``T × running / (running + waiting)``, the part of our load the engine serves). Proportional
  to ``T`` for every client at the same ``F``: with the equal additive steps below, N clients converge to equal
  shares (Chiu & Jain). A cut remembers where it landed as the good level ``W``.
* **Growth paced by turnover**: TCP adds one segment per round trip; here ``step`` per round trip of our calls,
  and a poll holds ``client_calls / inflight_mean`` of them. Short calls polled slowly climb fast, long ones
  slowly, and every client of one engine (same round trip) takes the same absolute step. Below a level that was
  verified (``W``, after the fail-safe's floor; our share of the wall, when a neighbour or a tenant left room)
  the target closes ``restore_gain`` of the gap a poll instead.
  Growth is capped where KV usage would reach ``kv_high``.
* **The engine's limit** (:meth:`AdaptiveCore.knee`), in sequences, two ways: the KV cache's bound (``running ×
  kv_high / kv_usage``: blocks per sequence from usage over running) and the **wall**, the largest ``running``
  seen with a queue standing that made requests wait over ``wait_s`` (the ``max_num_seqs`` or token-budget wall,
  windowed over ``window_s``; a queue nobody waited on yet is an admission in progress); when neither is known,
  the growth guard's plateau point still caps growth that buys nothing. Our share of a limit ``L`` is
  ``inflight + s × (L − running)``, ``s`` our share of the engine's load. While no wall is known the first ramp
  multiplies by ``start_factor`` a poll but never past ``knee_margin ×`` our share of the KV bound; reaching it
  ends the ramp.

Wrappers keep their own parameters: the token budget (``TokenSide``), the growth guard and the outage
hand-over (controller). Changes of the KV block count (engines added or lost) rescale ``T``, ``W`` and the
samples by the ratio (``rescale_threshold``); a long idle (``idle_s``) forgets everything. docs/policies.md has
the rules on one page with their anchors.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from model_concurrency.observation import Observation
from model_concurrency.policies._common import IdleClock, app_limited, own_share
from model_concurrency.policies.base import PolicyBase
from model_concurrency.policies.token_budget import TokenBudget, TokenSide

__all__ = ["AdaptiveCore"]

# A queue nobody has waited on yet, while the engine's ``running`` rose by at least this share of our own growth
# since the previous poll, is the engine still admitting our step (prefills waiting for the token budget), not a
# wall: half, as the guard's and ``adaptive``'s full-pipe tests read it (the engine took at least half of what we
# added; a full engine takes none of it).
ADMITTING_SHARE = 0.5
# "Alone on the engine": our share of its load at least this. Only then does the first ramp ask for the faster
# polls: clients that start together stay equal only while they double at the same cadence, and the jittered fast
# polls let whoever polled first take the engine.
ALONE_SHARE = 0.9

# The tunable parameters, in the order docs/policies.md explains them (test_policies_core counts them: <= 12).
PARAMETERS = (
    "wait_s",
    "cut_gain",
    "start_factor",
    "step",
    "max_step",
    "restore_gain",
    "near_full",
    "kv_high",
    "knee_margin",
    "rescale_threshold",
    "window_s",
    "idle_s",
)


@dataclass(slots=True)
class AdaptiveCore(PolicyBase):
    """Graded cut, turnover-paced growth, an explicit wall (module docstring).

    Parameters:
        wait_s: a request that waited longer than this in the engine's queue marks the interval (default 0.5 s;
            read at the largest vLLM bucket bound not above it).
        cut_gain: the cut at ``F`` = 1 (every request waited): ``T × (1 − cut_gain)`` (default 0.5, DCTCP's
            ``α / 2`` at ``α`` = 1), in (0, 1).
        start_factor: the first ramp's growth per poll (default 2, > 1).
        step: the additive increase per round trip of our calls (default 1, > 0).
        max_step: one poll's additive increase is at most this fraction of the target (default 0.25, > 0): a
            one-step (embedding) engine turns over hundreds of times in a 12 s poll.
        restore_gain: far below our share of the wall, the fraction of the gap closed per poll (default 0.5, in
            (0, 1]).
        near_full: grow only when the interval's peak in flight reached ``near_full × T`` (default 0.8).
        kv_high: the KV usage at which the cache counts as full (default 0.92, in (0, 1]).
        knee_margin: the first ramp goes at most this far past our share of the KV bound (default 1.1, >= 1).
        rescale_threshold: a relative change of the KV block count taken as engines added or lost (default 0.1).
        window_s: seconds a "running while queued" wall sample stays valid (default 600).
        idle_s: seconds of nothing in flight after which everything learnt is forgotten (default 120).
    """

    wait_s: float = 0.5
    cut_gain: float = 0.5
    start_factor: float = 2.0
    step: float = 1.0
    max_step: float = 0.25
    restore_gain: float = 0.5
    near_full: float = 0.8
    kv_high: float = 0.92
    knee_margin: float = 1.1
    rescale_threshold: float = 0.1
    window_s: float = 600.0
    idle_s: float = 120.0
    token_budget: bool = True  # the TokenSide wrapper (policies/token_budget.py); False: requests only
    good: float | None = field(default=None, init=False)  # W: the served share at the last cut, or the ramp's end
    samples: deque[tuple[float, float]] = field(default_factory=deque, init=False, repr=False)
    blocks: float | None = field(default=None, init=False)
    idle: IdleClock = field(default_factory=IdleClock, init=False)
    tokens: TokenSide = field(init=False, repr=False)
    rule: str = field(default="", init=False)  # the rule that decided the last poll, with its figures
    load: tuple[float, float] | None = field(default=None, init=False)  # (inflight, running) at the previous poll
    alone: bool = field(default=True, init=False)  # our share of the engine's load was >= ALONE_SHARE last poll

    def __post_init__(self) -> None:
        checks = {
            "wait_s": self.wait_s >= 0,
            "cut_gain": 0 < self.cut_gain < 1,
            "start_factor": self.start_factor > 1,
            "step": 0 < self.step < math.inf,
            "max_step": self.max_step > 0,
            "restore_gain": 0 < self.restore_gain <= 1,
            "near_full": 0 <= self.near_full <= 1,
            "kv_high": 0 < self.kv_high <= 1,
            "knee_margin": self.knee_margin >= 1,
            "rescale_threshold": self.rescale_threshold > 0,
            "window_s": self.window_s > 0,
            "idle_s": self.idle_s > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"out of range: {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}")
        self.tokens = TokenSide(TokenBudget(self.kv_high), self.near_full)

    # -- what the controller reads ------------------------------------------------------------------------------
    @property
    def ramping(self) -> bool:
        """The first ramp: nothing learnt yet (no good level, no wall)."""
        return self.good is None and not self.samples

    @property
    def wants_fast_polls(self) -> bool:
        """Poll sooner while the first ramp climbs alone on the engine (``MODEL_CONCURRENCY_RAMP_POLL_DIVISOR``)."""
        return self.ramping and self.alone

    # -- the signals -----------------------------------------------------------------------------------------
    def saturation(self, obs: Observation) -> float:
        """``F``: how saturated the interval was, in [0, 1] (module docstring).

        The marked share counts only while a queue stands at the poll: marks with no queue left are a transient
        the engine absorbed, most often the prefill of our own last step (a doubling of 64 long prompts waits
        seconds for the token budget on an engine with room to spare)."""
        load = obs.running + obs.waiting_capacity
        queued = obs.waiting_capacity / load if load > 0 else 0.0
        marked = (obs.waited_over(self.wait_s) or 0.0) if obs.waiting_capacity >= 1 else 0.0
        preempted = min(1.0, obs.preemptions / obs.running) if obs.running > 0 else 0.0
        return max(marked, queued, preempted)

    def wall(self, now: float) -> float | None:
        """The largest ``running`` seen with a queue standing over the last ``window_s`` (the engine's
        ``max_num_seqs`` or token-budget wall, all clients), or None."""
        while self.samples and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        return max(r for _, r in self.samples) if self.samples else None

    def knee(self, obs: Observation) -> tuple[float | None, float | None]:
        """The engine's concurrency limit in sequences, two ways: ``(wall, kv)`` (module docstring). ``kv`` is an
        upper bound (the sequence limit is often lower and is not on the page); ``wall`` is what it ran."""
        kv = obs.kv_cache_usage
        by_kv = obs.running * self.kv_high / kv if kv is not None and kv > 0 and obs.running > 0 else None
        return self.wall(obs.time), by_kv

    @staticmethod
    def share_of(obs: Observation, knee: float | None) -> float:
        """Our share of ``knee``: ``inflight + s × (knee − running)`` (``inf`` while unknown)."""
        if knee is None:
            return math.inf
        return obs.inflight + own_share(obs) * (knee - obs.running)

    def turnover(self, obs: Observation) -> float:
        """Round trips of our calls in the interval: completions over the mean in flight (0 if unmeasured)."""
        mean = obs.inflight_mean if obs.inflight_mean is not None else float(obs.inflight)
        return obs.client_calls / mean if mean > 0 else 0.0

    # -- the rule --------------------------------------------------------------------------------------------
    def next_target(self, target: float, obs: Observation) -> float:
        """The request target, with the token budget riding along (weighted calls obey it)."""
        if not self.token_budget:
            return self._requests(target, obs)
        return self.tokens.answer(self._requests(target, self.tokens.view(obs)), obs)

    def _requests(self, target: float, obs: Observation) -> float:
        if self.idle.idle_past(obs, self.idle_s):
            self.good, self.blocks = None, None
            self.samples.clear()
        factor = self._rescale(obs)
        if factor is not None:
            self.good = self.good * factor if self.good is not None else None
            self.samples = deque((t, r * factor) for t, r in self.samples)
            self.rule = f"rescale x{factor:.3g}"
            return target * factor
        if obs.inflight > 0:
            self.alone = own_share(obs) >= ALONE_SHARE
        fraction = self.saturation(obs)
        marked = (obs.waited_over(self.wait_s) or 0.0) > 0
        load, self.load = self.load, (float(obs.inflight), obs.running)
        if obs.waiting_capacity >= 1 and not marked and self._admitting(obs, load):
            self.rule = "hold: the engine is admitting our step"
            return target
        if obs.waiting_capacity >= 1 and marked:
            # The engine ran this many with a queue that made requests wait: a wall. A queue whose requests all
            # started within ``wait_s`` is an admission in progress (a burst's prompts waiting for the token
            # budget), and ``running`` read then is below the wall.
            self.samples.append((obs.time, obs.running))
        if fraction > 0:
            return self._cut(target, obs, fraction)
        if app_limited(obs, target, self.near_full):
            self.rule = "hold: application-limited"
            return target
        return self._grow(target, obs)

    @staticmethod
    def _admitting(obs: Observation, load: tuple[float, float] | None) -> bool:
        """Our in-flight grew since the previous poll and the engine's ``running`` took at least
        ``ADMITTING_SHARE`` of that growth: a queue standing now is the engine working through our step."""
        if load is None:
            return False
        grew = obs.inflight - load[0]
        return grew > 0 and obs.running - load[1] >= ADMITTING_SHARE * grew

    def _rescale(self, obs: Observation) -> float | None:
        """The KV block count moved by more than ``rescale_threshold``: the ratio (engines added or lost)."""
        blocks, self.blocks = self.blocks, float(obs.kv_num_blocks) if obs.kv_num_blocks else self.blocks
        if blocks is None or self.blocks is None or abs(self.blocks / blocks - 1) <= self.rescale_threshold:
            return None
        return self.blocks / blocks

    def _cut(self, target: float, obs: Observation, fraction: float) -> float:
        """DCTCP's graded cut, and at least the queue's share of the engine's load while a queue stands.

        Both in proportion to the target, not to the calls in flight: in flight is the target rounded down, and a
        cut of 1 % read from it would be mostly rounding, the same request or so for every client, which keeps
        whatever split the clients have instead of converging it (Chiu & Jain need proportional cuts)."""
        load = obs.running + obs.waiting
        served = obs.running / load if obs.waiting_capacity >= 1 and load > 0 else 1.0
        cut = target * min(1 - self.cut_gain * fraction, served)
        self.good = cut
        self.rule = f"cut: saturation {fraction:.3f}, served fraction {served:.3f}"
        return cut

    def _grow(self, target: float, obs: Observation) -> float:
        """Half the gap to a level that was verified (``W``, our share of the wall), multiplicative toward the KV
        bound while no wall is known, and a step per round trip at the wall."""
        wall, by_kv = self.knee(obs)
        at_wall, kv_bound = self.share_of(obs, wall), self.share_of(obs, by_kv)
        goal = max(self.good or 0.0, at_wall if wall is not None else 0.0)
        if target + self.step < goal:
            # Under a level the engine ran (W: the fail-safe's floor), or under our share of the wall with room on
            # the engine (a neighbour gone, a background tenant left): close ``restore_gain`` of the gap a poll.
            self.rule = f"restore toward {goal:.1f}"
            return max(target, min(target + self.restore_gain * (goal - target), kv_bound))
        if wall is None:
            # No wall met yet: the KV cache's bound is the only limit known, an upper one; the first ramp doubles
            # toward it, later probes grow by ``max_step`` a poll (the wall may sit anywhere below it).
            factor = self.start_factor if self.ramping else 1 + self.max_step
            grown = min(target * factor, self.knee_margin * kv_bound)
            if self.ramping and grown < target * factor:
                self.good = grown  # the KV bound is reached: the ramp ends here
            self.rule = f"{'ramp' if self.ramping else 'probe'}: kv bound {kv_bound:.1f}"
            return max(target, grown)
        increase = min(self.step * max(1.0, self.turnover(obs)), self.max_step * target)
        self.rule = f"increase +{increase:.2f} (wall share {at_wall:.1f})"
        # At the wall: TCP's +1 a round trip, the same for every client of the engine, the probe that finds a
        # raised limit; the graded cut answers what it queues.
        return max(target, min(target + increase, kv_bound))
