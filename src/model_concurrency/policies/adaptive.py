"""Adaptive, the default policy: AIMD that remembers where the engine saturated, adds gently below it, probes above.

TCP's answer to the same problem, with the engine's own gauges in place of a lost packet. Per poll, in order:

* **rescale** (``rescale_threshold``): the summed KV block count changed, so engines were added or lost; the
  target and everything learnt scale by the same factor at once.
* **saturated**: requests wait for capacity, or ``running`` is back at the most the engine ran while saturated
  (a capacity sample, ``window_polls`` of them within ``window_s``). The target is cut to ``decrease_factor`` × the
  served share (our in-flight times the share of the engine's load it runs), remembered as the level ``W``. A
  stated sequence limit (``Observation.limits``) makes a queue while ``running`` is below it a wait for tokens, not
  a wall: it is cut only when the interval's requests waited a cut's worth. Without one, a queue of at most
  1 % of ``running`` below the sampled capacity, with room in the KV cache, is a prefill wait (policies/waits.py).
* **application-limited** (``near_full``): our peak in flight did not fill the window; hold.
* **first ramp** (nothing learnt yet, policies/first_ramp.py): grow ``slow_start_factor`` per round trip of our
  calls, at most ``jump_max_factor`` a poll; alone on the engine, jump ``jump_fraction`` of the way to the bound
  the KV cache (and a stated sequence limit) puts on our in-flight. It ends at the first queue, when the engine
  stopped taking our growth, or when a doubling raised our completion rate by less than ``startup_exit``.
* **below the goal** (``slow_start_below``): far under ``W`` (or our share of the sampled capacity), slow start back
  to ``decrease_factor`` × it; beside peers, after our own cuts, the additive step instead.
* **additive increase** (``increase_step``): the same absolute step for every client, so shares converge.
* **probe**: above the goal, steps that double each clean poll alone on the engine (beside peers, who all probe,
  they stay one step).

With a stated sequence limit, growth stops at our share of it (beside peers after the first ramp, only the
additive step goes past). One-step (pooling) engines keep a second batch queued, and their knee is two batches.
``without`` switches rules off by name (:data:`RULES`): how the ablation measures what each one earns
(docs/policies.md, "The default").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from model_concurrency.observation import Observation
from model_concurrency.policies import first_ramp, waits
from model_concurrency.policies._common import (
    CompletionShare,
    app_limited,
    one_step_engine,
    own_share,
    pipelined_share,
    sustainable,
)
from model_concurrency.policies.kv import KvEstimate, kv_estimate
from model_concurrency.policies.token_budget import KV_HIGH, TokenBudget, TokenSide

__all__ = ["RULES", "Adaptive", "KvEstimate"]

#: The rules ``without`` can switch off, each a mechanism with no number of its own to switch it off by.
RULES = frozenset({"capacity-samples", "inferred-saturation", "engine-full-exit", "kv-jump", "turnover-ramp"}) | {
    "admission-hold",
    "one-step",
    "prefill-waits",
    "probe",
    "stated-limits",
    "token-steps",
}
# Beside a peer on a one-step engine, growth toward the knee restores from under this share of it.
KNEE_RESTORE = 0.75


@dataclass(slots=True)
class Adaptive:
    """Slow start, cut to the served share, add a fixed step back up, probe above it (module docstring).

    Parameters (docs/policies.md has each with its range and what removing it costs):
        slow_start_factor: growth per round trip on the first ramp and far below the goal; the probes' growth.
        slow_start_below: slow start while the target is under this share of the goal.
        startup_exit: a doubling must raise our completion rate by this factor, else the first ramp ends.
        decrease_factor: a saturated poll cuts to this share of the served share; slow start returns here.
        increase_step: the additive step per poll, and the first probe.
        near_full: grow only when the interval's peak in flight reached this share of the target.
        rescale_threshold: a relative change of the KV block count taken as engines added or lost.
        window_polls, window_s: the capacity samples kept, by count and by age.
        jump_share: "alone on the engine": our share of its load at least this.
        jump_fraction: how far toward the KV bound the first ramp's jump goes.
        jump_max_factor: one poll multiplies the target by at most this.
        without: rule names (:data:`RULES`) switched off.
    """

    slow_start_factor: float = 2.0
    slow_start_below: float = 0.85
    startup_exit: float = 1.15
    decrease_factor: float = 0.9
    increase_step: float = 1.0
    near_full: float = 0.8
    rescale_threshold: float = 0.1
    window_polls: int = 10
    window_s: float = 600.0
    jump_share: float = 0.9
    jump_fraction: float = 0.5
    jump_max_factor: float = 8.0
    without: tuple[str, ...] = ()
    token_budget: bool = True  # the token side (policies/token_budget.py), a wrapper around the request target
    token_overcommit: float = 1.0
    tokens: TokenSide = field(init=False, repr=False)
    samples: deque[tuple[float, float]] = field(init=False, repr=False)
    off: frozenset[str] = field(init=False, repr=False)
    w_max: float | None = field(default=None, init=False)
    w_max_time: float = field(default=0.0, init=False)
    probes: int = field(default=0, init=False)
    blocks: float | None = field(default=None, init=False)
    running_peak: float = field(default=0.0, init=False)
    last_running: float | None = field(default=None, init=False)
    last_time: float | None = field(default=None, init=False)
    one_step: bool = field(default=False, init=False)
    alone: bool = field(default=True, init=False)
    completions: CompletionShare = field(default_factory=CompletionShare, init=False)
    cut_to: float = field(default=0.0, init=False)
    cut_goal: float = field(default=0.0, init=False)
    jump_to: float | None = field(default=None, init=False)
    held: bool = field(default=False, init=False)
    ramp_sample: bool = field(default=False, init=False)
    ramp_grown_at: float | None = field(default=None, init=False)
    startup_rate: float | None = field(default=None, init=False)
    startup_load: tuple[float, float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        checks = (
            ("slow_start_factor", self.slow_start_factor > 1, "> 1"),
            ("slow_start_below", 0 <= self.slow_start_below <= 1, "in [0, 1]"),
            ("startup_exit", self.startup_exit >= 1, ">= 1"),
            ("decrease_factor", 0 < self.decrease_factor < 1, "in (0, 1)"),
            ("increase_step", self.increase_step > 0 and math.isfinite(self.increase_step), "> 0"),
            ("near_full", 0 <= self.near_full <= 1, "in [0, 1]"),
            ("rescale_threshold", self.rescale_threshold > 0, "> 0"),
            ("window_s", self.window_s > 0, "> 0"),
            ("jump_share", 0 <= self.jump_share <= 1, "in [0, 1]"),
            ("jump_fraction", 0 < self.jump_fraction <= 1, "in (0, 1]"),
            ("jump_max_factor", self.jump_max_factor >= self.slow_start_factor, ">= slow_start_factor"),
        )
        for name, ok, bound in checks:
            if not ok:
                raise ValueError(f"{name} must be {bound}, got {getattr(self, name)!r}")
        if not (isinstance(self.window_polls, int) and self.window_polls >= 1):
            raise ValueError(f"window_polls must be an int >= 1, got {self.window_polls!r}")
        if isinstance(self.without, str) or not all(isinstance(r, str) for r in self.without):
            raise ValueError(f"without must be a list of rule names, got {self.without!r}")
        unknown = sorted(set(self.without) - RULES)
        if unknown:
            raise ValueError(f"without names unknown rules {unknown}; the rules: {', '.join(sorted(RULES))}")
        self.without = tuple(self.without)
        self.off = frozenset(self.without)
        self.samples = deque(maxlen=self.window_polls)
        rule = TokenBudget(
            overcommit=self.token_overcommit,
            decrease=self.decrease_factor,
            steps=self.on("token-steps"),
            alone_share=self.jump_share,
        )
        self.tokens = TokenSide(rule, self.near_full)

    def on(self, rule: str) -> bool:
        return rule not in self.off

    # -- what has been learnt ---------------------------------------------------------------------------------
    def capacity(self, now: float) -> float | None:
        """The engine's concurrency capacity: the most ``running`` of a saturated poll within ``window_s``."""
        while len(self.samples) > 1 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        return max(r for _, r in self.samples) if self.samples else None

    def goal(self, obs: Observation) -> float | None:
        """Where the engine last ran out for us: ``W_max``, or our share of its capacity if larger."""
        capacity = self.capacity(obs.time)
        share = self._share(obs) * self._batches() * capacity if capacity is not None else None
        known = [v for v in (self.w_max, share) if v is not None and v > 0]
        return max(known) if known else None

    @property
    def ramping(self) -> bool:
        """The first ramp: nothing learnt yet about where the engine runs out."""
        return self.w_max is None and not self.samples

    @property
    def wants_fast_polls(self) -> bool:
        """The jump's path (ramping alone, with the KV block count seen) asks the controller for faster polls:
        clients that share an engine stay equal only while they grow at the same cadence."""
        return self.ramping and self.on("kv-jump") and self.alone and self.blocks is not None

    @property
    def pipelining(self) -> bool:
        """A one-step (pooling) engine: requests complete in the step that reads them, so a second batch queued
        behind the running one is the aim, and the share is read from completions."""
        return self.on("one-step") and self.one_step

    def _share(self, obs: Observation) -> float:
        completed = self.completions.share
        return completed if self.one_step and completed is not None else own_share(obs)

    def _batches(self) -> float:
        return 2.0 if self.pipelining else 1.0

    @staticmethod
    def _batch(obs: Observation, capacity: float | None) -> float:
        return max(obs.running, capacity or 0.0)

    def _sequence_limit(self, obs: Observation) -> int | None:
        """The engines' stated sequence slots (``--max-num-seqs`` × engines), when stated and trusted."""
        limits = obs.limits
        return limits.max_num_seqs if limits is not None and self.on("stated-limits") else None

    def stated_bound(self, obs: Observation) -> float:
        """The most our in-flight may grow to under a stated sequence limit: our share of the engine's slots (two
        batches of them on a one-step engine). Alone that is the limit itself: more of our calls can only queue."""
        limit = self._sequence_limit(obs)
        if limit is None:
            return math.inf
        share = self._share(obs) if obs.inflight > 0 else 1.0
        return share * self._batches() * limit

    # -- the poll -----------------------------------------------------------------------------------------------
    def next_target(self, target: float, obs: Observation) -> float:
        """The request target, with the token budget riding along (weighted calls obey it)."""
        if not self.token_budget:
            return self._requests(target, obs)
        return self.tokens.answer(self._requests(target, self.tokens.view(obs)), obs)

    def _requests(self, target: float, obs: Observation) -> float:
        one_step = one_step_engine(obs)
        if one_step is not None:
            self.one_step = one_step
        completed = self.completions.update(obs, self._batch(obs, self.capacity(obs.time)))
        if self.one_step and completed is not None:
            self.alone = completed >= self.jump_share
        elif obs.inflight > 0:
            self.alone = own_share(obs) >= self.jump_share
        ramp_sample, self.ramp_sample = self.ramp_sample, False
        rate = self._rate(obs)
        before, self.last_running = self.last_running, obs.running
        risen = obs.running - before if before is not None else None
        factor = self._rescale(obs)
        if factor is not None:
            if self.w_max is not None:
                self.w_max *= factor
            self.samples = deque(((t, r * factor) for t, r in self.samples), maxlen=self.window_polls)
            self.running_peak *= factor
            self.probes = 0
            if factor < 1 or not app_limited(obs, target, self.near_full):
                return target * factor
        capacity = self._fresh_capacity(obs, target, ramp_sample)
        self.running_peak = max(self.running_peak, obs.running)
        why = self._saturated(obs, capacity)
        if why is not None:
            return self._on_queue(target, obs, capacity, risen, why)
        if app_limited(obs, target, self.near_full):
            self.startup_rate = self.startup_load = None  # an application-limited poll says nothing
            return target
        grown, bound = self._grow(target, obs, rate), self.stated_bound(obs)
        if grown > bound and not self.ramping and not self.alone:
            # Beside peers the bound is our share of the slots, which keeps whatever split the first ramp left; the
            # additive step goes on past it, so equal steps and proportional cuts even the shares out (Chiu & Jain).
            return max(target, min(grown, target + self.increase_step))
        return min(grown, max(target, bound))

    def _fresh_capacity(self, obs: Observation, target: float, ramp_sample: bool) -> float | None:
        """The capacity estimate, cleared when the engine runs more than it ever did while saturated: its limit
        rose without a KV-block change, or a sample caught it mid-admission; either way the samples are stale."""
        capacity = self.capacity(obs.time)
        if capacity is None or obs.running <= capacity + 0.5:
            return capacity
        self.samples.clear()
        if ramp_sample and obs.running > 2 * capacity:
            # The cut that ended our first ramp beside peers read the engine while it still admitted a burst (it
            # now runs twice that): the served share read with it is as wrong, so the ramp goes on.
            self.w_max, self.probes = None, 0
        if self.pipelining and self.w_max is not None and self.w_max > target:
            self.w_max, self.w_max_time, self.probes = target, obs.time, 0  # probe up from here to the new limit
        return None

    def _saturated(self, obs: Observation, capacity: float | None) -> str | None:
        """Why this poll is saturated, or None: ``"engine"``, a queue for capacity (below a stated sequence limit
        only when the interval's requests waited a cut's worth, and without one not a prefill wait: a wait for
        prefill tokens or blocks is no wall);
        ``"inferred"``, ``running`` back at the most the engine ran while saturated, within a half sequence, from a
        sample of the window: the engine is full though nothing waits at this instant, so every client sharing it
        cuts together (not on a one-step engine, whose aim is a full batch)."""
        if obs.waiting_capacity > 0:
            limit = self._sequence_limit(obs)
            unlimited = limit is None and not self.pipelining
            if unlimited and self.on("prefill-waits") and waits.prefill_wait(obs, capacity, KV_HIGH):
                return None
            if limit is None or self.pipelining or obs.running >= limit - 0.5 or self.waited(obs):
                return "engine"
            return None
        if self.pipelining or not self.on("inferred-saturation") or capacity is None or obs.running <= 0:
            return None
        fresh = obs.time - self.samples[-1][0] <= self.window_s
        return "inferred" if fresh and abs(obs.running - capacity) <= 0.5 else None

    def _on_queue(
        self, target: float, obs: Observation, capacity: float | None, risen: float | None, why: str
    ) -> float:
        if first_ramp.admitting(self, obs):
            # The jump's step is still being admitted: hold it one poll; a clean next poll makes it W_max.
            self.jump_to = target
            return target
        if first_ramp.absorbing(self, obs, risen):
            if self.ramping:  # not a wall, but no room to double into: the ramp ends here, without a cut
                self.w_max, self.w_max_time, self.probes = target, obs.time, 0
                self.startup_rate = self.startup_load = None
            return target
        served = pipelined_share(obs, self._batch(obs, capacity)) if self.pipelining else sustainable(obs)
        ramping = self.ramping
        if why == "engine" and obs.running >= self.running_peak - 0.5 and self.on("capacity-samples"):
            # The engine's own word, and only at the most it has run: a queue below that waits for tokens or
            # blocks, not a slot; an inferred cut must not re-record the sample it was inferred from.
            self.samples.append((obs.time, obs.running))
        self.probes, self.startup_rate, self.startup_load = 0, None, None
        if served is None:  # none of the queue is ours
            return target
        self.w_max, self.w_max_time = served, obs.time
        self.ramp_sample = ramping and why == "engine" and not self.alone
        self.cut_to = min(target, self.decrease_factor * served)
        self.cut_goal = self.goal(obs) or 0.0
        return self.cut_to

    def _rescale(self, obs: Observation) -> float | None:
        """The factor by which the summed KV block count changed since the last poll that reported it."""
        blocks = obs.kv_num_blocks
        if not blocks or blocks <= 0:
            return None
        before, self.blocks = self.blocks, float(blocks)
        if before is None:
            return None
        factor = blocks / before
        return factor if abs(math.log(factor)) > math.log1p(self.rescale_threshold) else None

    def waited(self, obs: Observation) -> bool | None:
        """The interval's requests waited a queue worth a cut (policies/waits.py)."""
        return waits.waited(obs, self.decrease_factor)

    # -- growth -------------------------------------------------------------------------------------------------
    def _rate(self, obs: Observation) -> float | None:
        """Our completions per second since the previous poll (the first ramp's exit test), None on the first."""
        before, self.last_time = self.last_time, obs.time
        if before is None or obs.time <= before:
            return None
        return obs.client_calls / (obs.time - before)

    def _grow(self, target: float, obs: Observation, rate: float | None) -> float:
        goal = self.goal(obs)
        if goal is None:
            return first_ramp.grow(self, target, obs, rate)
        knee = self._one_step_knee(obs)
        if knee is not None and target >= max(self.cut_to, KNEE_RESTORE * knee):
            # Beside a peer on a one-step engine whose knee is known: the additive step (never a probe), and a cut
            # once at our share of it, before a queue shows. Each client's share of the knee is in proportion to
            # what it runs, so every client reaches its own when the total passes the knee and the cuts come
            # together; the step is not capped at the knee, which would hold every client at the split it has.
            self.probes = 0
            if target >= knee:
                self.cut_to = self.decrease_factor * target
                return self.cut_to
            return target + self.increase_step
        if target < self.slow_start_below * goal and not self._own_band(target, goal):
            self.probes = 0
            grown = max(target * self.slow_start_factor, target + self.increase_step)
            return min(grown, max(self.decrease_factor * goal, target + self.increase_step))
        if target + self.increase_step <= goal:
            self.probes = 0
            return target + self.increase_step
        # A probe: the step doubles each clean poll alone on the engine; beside peers, who all probe, it does not.
        accelerate = self.on("probe") and (self.pipelining or self._share(obs) >= self.jump_share)
        growth = self.slow_start_factor if accelerate else 1.0
        step = min(self.increase_step * growth**self.probes, target)
        self.probes += 1
        return target + step

    def _own_band(self, target: float, goal: float) -> bool:
        """Beside peers, our own cut put us under the slow-start band and no room appeared since: climb by the
        additive step. A jump back in proportion to each client's own goal would keep whatever split the first
        ramp made (Chiu & Jain: only equal absolute steps converge)."""
        if self.cut_to <= 0 or self.alone or self.pipelining:
            return False
        return target >= self.cut_to - 0.5 and goal * self.slow_start_below <= self.cut_goal

    def _one_step_knee(self, obs: Observation) -> float | None:
        """Beside a peer on a one-step engine, our share of its knee (two batches of its capacity), once known."""
        capacity = self.capacity(obs.time)
        share = self._share(obs)
        if not self.pipelining or capacity is None or share >= self.jump_share:
            return None
        return share * 2.0 * capacity

    # -- the first ramp -----------------------------------------------------------------------------------------
    def kv_estimate(self, obs: Observation) -> KvEstimate | None:
        """What the KV cache says about the engine's room; None without the figures (then the ramp doubles)."""
        return kv_estimate(obs)
