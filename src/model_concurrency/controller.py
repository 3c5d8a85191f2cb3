"""The controller: bounds, throttle, grace and fail-safe around a policy, one per model.

:class:`ControllerCore` is a pure state machine. It is told "a poll succeeded with this Observation" or "a poll
failed because ..." at a time it is given; it applies the policy, the grace rule and the bounds, and says when
the next poll is due. It never fetches or sleeps, so tests drive it with plain calls and the SimPy lab drives it
on simulated time. :class:`CallRecorder` tallies this process's calls between polls. Both are owned by a model's
:class:`~model_concurrency.runtime.ModelRuntime`, which does the I/O and keeps the schedule.

Fail-safe rules (docs/operations.md): the target starts at the floor; a failed poll holds the last good target
while no more than ``grace_polls`` consecutive polls have failed. After the grace the target is handed over to
the client-side :class:`~model_concurrency.guard.GrowthGuard`, which keeps the last good target (or less) for as
long as this process's own calls look as they did while the signals were good, and drops it to the floor, for
the rest of the outage, on the first poll where they do not (failed or throttled calls, latency past 1.5 x its
baseline, or no completed call to judge by). ``outage_handover=False`` restores the plain drop to the floor.
Observations with non-finite or negative values count as failed polls; a policy that raises or answers NaN
holds. After the policy proposes, the guard may lower (never raise) the proposal when growth bought no
completions, or after throttled calls (429/503) to what the server's allowed rate fits (its throttle cap). A
throttled call also cuts the target at once (:meth:`ControllerCore.note_throttled`), between polls. The target
is always clamped to ``[floor, max(floor, ceiling)]``: the floor (the static configuration) wins over a ceiling
set below it.

The schedule: the next poll is due ``poll_interval_s`` after this one started, except in the policy's first ramp
(``wants_fast_polls``, docs/policies.md): after a good poll that leaves the policy asking for them below the
ceiling it is due after ``poll_interval_s / ramp_poll_divisor``, and once more after the poll that ended the
ramp (that poll's saturation is often the engine still admitting the jump; one more look sees where
``running`` settles). These are extra polls: the regular ones stay on the grid the throttle started at the first
fast poll, so the phase of the regular polls (and what a capacity change costs to see) is what it would have been.
A failed poll always goes back to the regular schedule, so the grace rule keeps its meaning in seconds. The live
runtime and the lab's clients both read ``next_poll_at``, so they make the same decision.

Every wait the schedule draws (the regular interval, and the short one of the ramp) is jittered: ``base × (1 + j ×
u)`` with ``u`` uniform in [-1, 1) from the core's own random stream and ``j = poll_jitter`` (0.1 by default,
``MODEL_CONCURRENCY_POLL_JITTER``). Separate processes drift apart as they run (GC pauses, slow scrapes, restarts);
a fleet of clients on fixed phases keeps the same ones landing in the same part of every saturation cycle. One
draw per poll, so a stream seeded the same (the lab seeds each client from the scenario's seed) gives the same
schedule; a live core draws from a stream seeded by the operating system.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from dataclasses import dataclass, field, fields
from typing import Protocol

from model_concurrency.config import POLL_JITTER, RAMP_POLL_DIVISOR
from model_concurrency.decision import Decision, limited_by_policy, outage_limit
from model_concurrency.guard import GrowthGuard
from model_concurrency.observation import CallStats, EngineSnapshot, Observation
from model_concurrency.page_hold import PageHold
from model_concurrency.policies.base import Policy, Target, declared_grace_polls, wants_fast_polls

__all__ = ["THROTTLED", "CallRecorder", "ControllerCore", "UniformSource", "check_poll_jitter"]

# The HTTP statuses that mean "slow down": counted as throttled (and failed), never as a success.
THROTTLED = (429, 503)

log = logging.getLogger("model_concurrency")


class UniformSource(Protocol):
    """A seeded uniform stream on [0, 1): ``random.Random`` (the live default) or a numpy ``Generator`` (the lab)."""

    def random(self) -> float: ...


def check_poll_jitter(jitter: float) -> float:
    """``jitter`` if it is a share of the interval a wait may move by (0 ≤ jitter < 1), else ``ValueError``."""
    if not (isinstance(jitter, (int, float)) and 0 <= jitter < 1):
        raise ValueError(f"poll_jitter must be >= 0 and < 1 (a share of the poll interval), got {jitter!r}")
    return float(jitter)


def _implausible(obs: Observation) -> str | None:
    for f in fields(obs):
        value = getattr(obs, f.name)
        if isinstance(value, float) and (not math.isfinite(value) or value < 0):
            return f"{f.name}={value!r}"
    if obs.inflight < 0:
        return f"inflight={obs.inflight}"
    return None


@dataclass(slots=True)
class ControllerCore:
    """Pure decision state for one model: no I/O, no clock of its own."""

    policy: Policy
    floor: int = 1
    ceiling: int = 512
    grace_polls: int = 3
    poll_interval_s: float = 12.0
    ramp_poll_divisor: float = RAMP_POLL_DIVISOR[1]
    ramp_tail_polls: int = 1
    # Each wait is base × (1 ± up to this), drawn per poll from jitter_rng (module docstring); 0: the exact grid.
    poll_jitter: float = POLL_JITTER[1]
    jitter_rng: UniformSource = field(default_factory=random.Random, repr=False)
    target_value: float = field(init=False)
    consecutive_failures: int = 0
    polls: int = 0
    next_poll_at: float = -math.inf
    last_poll_time: float | None = None
    last_ok: bool | None = None
    last_error: str | None = None
    last_observation: Observation | None = None
    last_snapshot: EngineSnapshot | None = None
    # Tokens weighted calls may hold at once (a policy answering a Target with tokens); None: not enforced.
    token_budget: int | None = field(default=None, init=False)
    guard: GrowthGuard = field(default_factory=GrowthGuard)
    # Readings that are not a capacity signal (a wedged request, a livelock): hold instead of asking the policy.
    page_hold: PageHold = field(default_factory=PageHold)
    outage_handover: bool = True
    outage_floored: bool = False
    fast_polls: int = 0
    throttle_cut: float = 0.9
    poll_started_at: float | None = None
    # The model this core decides for (log lines only), and the last decision with its reason (decision.py).
    name: str = ""
    last_decision: Decision | None = None
    _tail_left: int = 0
    _regular_due: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.throttle_cut <= 1:
            raise ValueError(f"throttle_cut must be in (0, 1], got {self.throttle_cut}")
        check_poll_jitter(self.poll_jitter)
        self.target_value = float(self.lower)

    @property
    def lower(self) -> int:
        return max(1, int(self.floor))

    @property
    def upper(self) -> int:
        return max(self.lower, int(self.ceiling))

    @property
    def target(self) -> int:
        """The limit callers obey: the clamped target, rounded down."""
        return int(min(max(self.target_value, self.lower), self.upper))

    @property
    def saturated(self) -> bool:
        obs = self.last_observation
        return bool(self.last_ok and obs is not None and obs.waiting_capacity > 0 and not self.page_hold.active)

    def set_bounds(self, floor: int, ceiling: int) -> None:
        self.floor, self.ceiling = floor, ceiling
        self.target_value = self._clamp(self.target_value)

    def _clamp(self, value: float) -> float:
        return float(min(max(value, self.lower), self.upper))

    def poll_due(self, now: float) -> bool:
        return now >= self.next_poll_at

    def begin_poll(self, now: float) -> None:
        """Claim the poll that is due: the next one is due a full interval after this one started.

        ``update`` may bring it forward once the outcome says the policy is still ramping."""
        self.poll_started_at = now
        self.next_poll_at = now + self.poll_interval_s

    @property
    def polling_fast(self) -> bool:
        """The next poll is one of the first ramp's faster ones (``ramp_poll_interval_s``), not the regular grid's."""
        return self._regular_due is not None

    @property
    def ramp_poll_interval_s(self) -> float:
        """The interval between polls while the policy ramps (the full one when the divisor is 1 or less)."""
        return self.poll_interval_s / max(1.0, self.ramp_poll_divisor)

    def _fast_next(self) -> bool:
        """Whether the next poll comes after the short interval (see the module docstring)."""
        if self.ramp_poll_divisor <= 1 or not self.last_ok:
            self._tail_left = 0
            return False
        if wants_fast_polls(self.policy):
            below_ceiling = self.target < self.upper
            self._tail_left = self.ramp_tail_polls if below_ceiling else 0
            return below_ceiling
        if self._tail_left > 0:
            self._tail_left -= 1
            return True
        return False

    def jittered(self, base: float) -> float:
        """One wait of the schedule: ``base × (1 + poll_jitter × u)``, ``u`` uniform in [-1, 1); one draw a call."""
        jitter = check_poll_jitter(self.poll_jitter)
        if jitter == 0:
            return base
        return base * (1.0 + jitter * (2.0 * float(self.jitter_rng.random()) - 1.0))

    def _schedule_after(self, started: float) -> None:
        interval, regular = self.poll_interval_s, self._regular_due
        if regular is not None and interval > 0 and regular <= started:
            # This poll stood in for the regular one (or the poller paused): the grid moves on by whole intervals.
            regular += interval * (math.floor((started - regular) / interval) + 1)
        # One draw per poll whichever branch runs, so the stream (and a seeded run) never depends on the branch.
        jitter = self.jittered(1.0)
        if self._fast_next():
            self.fast_polls += 1
            self._regular_due = regular if regular is not None else started + interval * jitter
            self.next_poll_at = started + self.ramp_poll_interval_s * jitter
        elif regular is not None:
            self._regular_due = None
            self.next_poll_at = max(regular, started + self.ramp_poll_interval_s * jitter)
        else:
            self.next_poll_at = started + interval * jitter

    def update(self, obs: Observation, reason: str | None = None) -> int:
        """Apply one poll's outcome (``obs.ok=False`` for a failed poll, with ``reason``). Returns the target.

        Also schedules the next poll from when this one started (``begin_poll``; the observation's time if none
        was claimed)."""
        return self.decide(obs, reason).target

    def decide(self, obs: Observation, reason: str | None = None) -> Decision:
        """:meth:`update`, returning the whole decision: the target, the rule that fired and the figures."""
        started = self.poll_started_at if self.poll_started_at is not None else obs.time
        self.poll_started_at = None
        before = self.target
        rule, limited_by = self._apply(obs, reason)
        self._schedule_after(started)
        return self._record(Decision(obs.time, before, self.target, rule, limited_by, obs))

    def _record(self, decision: Decision) -> Decision:
        """Keep ``decision`` as the last one and log it: one INFO line per decision (``-v``)."""
        self.last_decision = decision
        if log.isEnabledFor(logging.INFO):
            log.info("%s", decision.log_line(self.name or "?"))
        return decision

    def _apply(self, obs: Observation, reason: str | None) -> tuple[str, str | None]:
        """One poll into the state; returns the rule that fired and what limits the target (decision.py)."""
        self.polls += 1
        self.last_poll_time = obs.time
        if not obs.ok:
            return self._fail(obs, reason or "poll failed")
        problem = _implausible(obs)
        if problem is not None:
            return self._fail(obs, f"implausible observation: {problem}")
        self.consecutive_failures = 0
        self.outage_floored = False
        self.last_ok, self.last_error, self.last_observation = True, None, obs
        answer, proposed = self._propose(obs)
        if not math.isfinite(proposed):
            proposed = self.target_value
        elif answer is not None:
            self.token_budget = _tokens(answer)
        before = self.target_value
        guarded = self.guard.bound(self.target_value, proposed, obs)
        self.target_value = self._clamp(min(proposed, guarded))
        if answer is None:
            rule = f"page hold: {self.page_hold.reason}" if self.page_hold.active else "policy error: held"
            return rule, limited_by_policy(obs, before)
        if self._clamp(guarded) < self._clamp(proposed):
            if obs.client_throttled > 0 or self._throttle_cap_binds(guarded):
                return "throttle cap", "throttled"
            return "growth guard", "guard"
        if proposed >= self.upper:
            return "ceiling", "ceiling"
        if self.target_value > before:
            return "policy", None
        return "policy", limited_by_policy(obs, before)

    def _throttle_cap_binds(self, guarded: float) -> bool:
        """Whether the guard's bound is its throttle cap (not its knee cap)."""
        cap, knee = self.guard.throttle_cap, self.guard.cap
        return cap is not None and guarded >= cap and (knee is None or cap <= knee)

    def _propose(self, obs: Observation) -> tuple[float | Target | None, float]:
        """The policy's answer and its request count; a page hold (page_hold.py) answers instead of the policy."""
        held = self.page_hold.judge(self.target_value, obs)
        if held is not None:
            return None, held
        try:
            answer = self.policy.next_target(self.target_value, obs)
            cap = self.page_hold.growth_cap(self.target_value)
            if cap is not None and float(answer) > cap:
                answer = Target(cap, answer.tokens) if isinstance(answer, Target) else cap
            return answer, float(answer)  # a Target is its request count; its tokens ride along
        except Exception as exc:  # a plug-in policy's bug must not reach the caller's fan-out
            self.last_error = f"policy {type(self.policy).__name__} raised {type(exc).__name__}: {exc}"
            log.error("%s; holding the target", self.last_error)
            return None, math.nan

    def note_throttled(self, inflight: int, now: float | None = None, factor: float | None = None) -> int:
        """A call came back 429/503: the target drops to ``throttle_cut`` × the calls still in flight, at once.

        ``factor`` replaces ``throttle_cut`` for one cut (a gentler cut on a queue-TTL expiry: gate/outcome.py).

        Between polls the target is otherwise fixed, so a window far above what the server allows would meet
        every freed slot with another refused call (a poll's worth of them). Cut at each refusal, the window
        shrinks geometrically with the refusals instead of one slot per refusal, until the poll's throttle cap
        (:meth:`GrowthGuard.bound`) sizes it from the rate the server allowed. The cut is 0.9, not 1.0: a window
        of exactly the calls in flight when the server refused is one the server has just refused, and leaves more
        calls throttled after the first minute (``model-concurrency compare rate-limited --policies
        adaptive,gradient``, ``throttled_fraction_after_60s``). Off with the guard.
        """
        if self.guard.enabled:
            before = self.target
            cut = self.throttle_cut if factor is None else factor
            self.target_value = self._clamp(min(self.target_value, float(inflight) * cut))
            if self.target != before:
                at = now if now is not None else (self.last_poll_time or 0.0)
                why = f"a call came back 429/503 with {inflight} in flight"
                self._record(Decision(at, before, self.target, "throttle cut", "throttled", why))
        return self.target

    def fail(self, now: float, reason: str, *, inflight: int = 0) -> int:
        """A poll that produced no observation (unreachable, garbage, timeout)."""
        return self.update(Observation(ok=False, time=now, inflight=inflight), reason)

    @property
    def effective_grace_polls(self) -> int:
        """The grace in force: a policy may pin its own (``seed-aimd`` reproduces the original reset with 0)."""
        pinned = declared_grace_polls(self.policy)
        return pinned if pinned is not None else self.grace_polls

    def _fail(self, obs: Observation, reason: str) -> tuple[str, str | None]:
        """Grace, then the hand-over to the guard (or the floor): the target never rises during an outage."""
        self.consecutive_failures += 1
        self.last_ok, self.last_error, self.last_observation = False, reason, obs
        held = self.target_value
        bounded = min(held, self.guard.bound(held, held, obs, good=False))
        failures, grace = self.consecutive_failures, self.effective_grace_polls
        read_once = self.last_snapshot is not None
        if failures <= grace:
            self.target_value = self._clamp(bounded)
            return f"grace {failures}/{grace} ({reason})", outage_limit(read_once, "guard")
        trouble = "hand-over off" if not self.outage_handover else self.guard.trouble(obs)
        if self.outage_floored or trouble is not None:
            rule = "floor until signals return" if self.outage_floored else f"floor: signals lost and {trouble}"
            self.outage_floored = True
            self.target_value = float(self.lower)
            self.token_budget = None  # the floor is a count: without fresh signals no token figure is trusted
            return f"{rule} ({failures} failed polls)", outage_limit(read_once, "floor")
        self.target_value = self._clamp(bounded)
        return f"outage hand-over: own calls healthy ({failures} failed polls)", outage_limit(read_once, "guard")


def _tokens(answer: object) -> int | None:
    """A policy's token budget: a Target's finite tokens, at least 1; anything else is "not enforced"."""
    tokens = answer.tokens if isinstance(answer, Target) else None
    if tokens is None or not math.isfinite(tokens):
        return None
    return max(1, int(tokens))


class CallRecorder:
    """Per-model tally of this process's own calls since the previous poll, fed by the gate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.calls = self.errors = self.throttled = self.server_errors = 0
        self.latency_sum = self.ok_latency_sum = 0.0
        self.latency_min: float | None = None

    def record(self, latency_s: float, *, ok: bool, status: int | None = None, throttled: bool | None = None) -> None:
        """One call. ``throttled`` (a refusal that says "slow down": gate/outcome.py) defaults to the status being
        429 or 503."""
        with self._lock:
            self.calls += 1
            if not ok:
                self.errors += 1
            if throttled if throttled is not None else status in THROTTLED:
                self.throttled += 1
            elif not ok and (status is None or status == 408 or status >= 500):
                self.server_errors += 1
            if math.isfinite(latency_s) and latency_s >= 0:
                self.latency_sum += latency_s
                if ok:
                    self.ok_latency_sum += latency_s
                self.latency_min = latency_s if self.latency_min is None else min(self.latency_min, latency_s)

    def drain(self) -> CallStats:
        with self._lock:
            stats = CallStats(
                calls=self.calls,
                errors=self.errors,
                throttled=self.throttled,
                latency_sum_s=self.latency_sum,
                latency_min_s=self.latency_min,
                ok_latency_sum_s=self.ok_latency_sum,
                server_errors=self.server_errors,
            )
            self._reset()
            return stats
