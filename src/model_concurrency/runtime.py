"""One runtime per model: the controller, the limiter, the recorder, the usage meter and the poll schedule.

(Over 400 lines on purpose: the one owner of a model's state, its only writer and publisher, and its registry sit
together so every lock that guards them is in one file.)

A :class:`ModelRuntime` is everything this process knows and decides about one model, in one object:

* the spec and the :class:`~model_concurrency.controller.ControllerCore` (policy, bounds, grace);
* the model's :class:`~model_concurrency.gate.model_limiter.ModelLimiter`: the only in-flight count, whose
  usage meter gives each poll the interval's peak and mean in flight;
* the :class:`~model_concurrency.controller.CallRecorder` the gate and :func:`slot` feed;
* the signal source and the schedule: while anything uses the model (a fan-out, a slot) a background thread
  polls it every ``MODEL_CONCURRENCY_POLL_S`` (``/ MODEL_CONCURRENCY_RAMP_POLL_DIVISOR`` while the policy is in
  its first ramp), each wait moved by up to ``± MODEL_CONCURRENCY_POLL_JITTER`` of itself (the core's
  ``next_poll_at``), so no poll rides on a completion and none blocks an event loop.

:func:`poll_step` is the poll itself (snapshot or error in at a time, target out). The lab's simulated clients
are runtimes too (lab/client.py): an injected limiter (:class:`Limits`), fixed :class:`RuntimeSettings`, nothing
published, and :meth:`ModelRuntime.poll_with` for a poll their SimPy clock times, which runs the same path from
the snapshot to the resized limiter as the poller thread. Callers read a runtime's state; only its poll writes it.
The registry (:func:`runtime_for`) holds one runtime per model key and owns reset and fork handling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from model_concurrency import config, export, telemetry
from model_concurrency._fork import reset_in_forked_child
from model_concurrency.config import ModelSpec, get_model, setting
from model_concurrency.controller import CallRecorder, ControllerCore
from model_concurrency.health import Health, HealthWatch, fallback_kind
from model_concurrency.observation import CallStats, EngineLimits, EngineSnapshot, Observation, counter_delta, observe
from model_concurrency.policies.base import Policy, uses_engine_signals
from model_concurrency.policies.registry import load_policy
from model_concurrency.policies.static import Static
from model_concurrency.signals.limits import StatedLimits, StatedLimitsRule, merge_limits
from model_concurrency.signals.prometheus_api import PrometheusSource
from model_concurrency.signals.saturation import gateway_view
from model_concurrency.signals.scrape import ScrapeLimits
from model_concurrency.signals.source import ClientOnlySource, SignalSource, VllmMetricsSource
from model_concurrency.state import RuntimeState

if TYPE_CHECKING:  # the gate imports this module; its own modules are imported where used
    from model_concurrency.gate.hold import AdmissionHold
    from model_concurrency.gate.limiter import Usage
    from model_concurrency.gate.model_limiter import ModelLimiter

__all__ = [
    "DEFAULT_POLICY",
    "LeaseView",
    "Limits",
    "ModelRuntime",
    "RuntimeSettings",
    "atarget_or_floor",
    "forget_runtime",
    "install_runtime",
    "is_current",
    "is_installed",
    "limiter_for",
    "on_reset",
    "poll_step",
    "registered_limiters",
    "registered_runtimes",
    "reset_controllers",
    "reset_runtimes",
    "runtime_for",
    "target_or_floor",
]

log = logging.getLogger("model_concurrency")
Clock = Callable[[], float]

DEFAULT_POLICY = "adaptive"
# The poller re-checks at least this often, so a clock that jumps (a test's) is followed promptly.
_MAX_WAIT_S = 0.02
# After resolve_capacity was last asked, the model is polled on schedule for at least this long (or 10 polls).
HOOK_LINGER_S = 10.0
# Between two polls at least this long even with MODEL_CONCURRENCY_POLL_S=0, so a scrape is never a busy loop.
_MIN_GAP_S = 0.005


def poll_step(
    core: ControllerCore,
    calls: CallStats,
    usage: Usage,
    now: float,
    snapshot: EngineSnapshot | None,
    reason: str | None = None,
    limits: EngineLimits | None = None,
) -> int:
    """One poll: the snapshot (or None, failed for ``reason``) plus the interval's calls and usage, into the core.

    Returns the bounded target. The live runtime and the lab's simulated clients both call this, so what the lab
    measures is the decision production makes. ``limits``: the engines' limits as the runtime merged them
    (:mod:`model_concurrency.signals.limits`); without them the Observation carries the snapshot's own.
    """
    failed = snapshot is None  # the client's own calls still go in: the guard judges an outage from them
    obs = observe(
        snapshot,
        None if failed else core.last_snapshot,
        inflight=usage.inflight,
        inflight_peak=usage.peak,
        inflight_mean=usage.mean,
        inflight_tokens=None if failed else usage.units,
        time=now,
        calls=calls,
        limits=limits,
    )
    if failed:
        return core.update(obs, reason or "no snapshot")
    core.last_snapshot = snapshot
    return core.update(obs)


def engine_view(
    snapshot: EngineSnapshot,
    before: tuple[float, EngineSnapshot] | None,
    now: float,
    target: int,
    answered: tuple[EngineSnapshot, int] | None = None,
) -> tuple[Usage, CallStats]:
    """The calls in flight and finished, judged from the engine, for a process whose calls nothing counts
    (``resolve_capacity`` alone): what the limiter's meter and the call recorder give a fan-out.

    ``running`` at the poll instant misses short calls: an embedding spends a few milliseconds on the engine and
    most of its round trip on the wire, so a pool that was full all interval is rarely caught running, and the
    application-limited rule would hold the hook at its floor on embedding engines. Interval figures go
    in instead, from the engine's counters since the previous reading ``before``:

    * the calls finished (``request_success``) and their mean latency (the e2e histogram's sum over them), as the
      recorder would count them: the policy's rules that wait for our calls to come back see them come back;
    * the mean in the server, by Little's law: the e2e seconds spent over the interval's length;
    * the peak: at least that mean, and at least the calls per answer. ``answered`` is the engine reading at
      the last poll that followed an answer of the hook, and the answers given since: a caller that sizes each
      batch or pool from the hook runs that many calls per answer, so it filled a window of ``target`` when the
      calls finished since over the answers is near ``target`` (capped there). Counted from answer to answer, not
      per poll: a batch outlasts a fast poll, and a poll between two answers says nothing either way.

    All are server-wide, as ``running`` is: another client's calls count as this one's (docs/operations.md).
    A first reading, or an engine without the counters, leaves ``running`` and no calls.
    """
    from model_concurrency.gate.limiter import Usage

    running = max(0, round(snapshot.running))
    if before is None or now <= before[0]:
        return Usage(running, running, float(running)), CallStats()
    then, previous = before
    spent = counter_delta(snapshot.e2e_latency_sum_total, previous.e2e_latency_sum_total)
    finished = counter_delta(snapshot.success_total, previous.success_total)
    mean = spent / (now - then) if spent is not None else float(running)
    peak = max(running, math.ceil(mean))
    if answered is not None and answered[1] > 0:
        since = counter_delta(snapshot.success_total, answered[0].success_total)
        if since is not None:
            peak = max(peak, min(target, math.floor(since / answered[1])))
    calls = CallStats()
    if finished and spent is not None and math.isfinite(spent):
        count = round(finished)
        calls = CallStats(calls=count, latency_sum_s=spent, ok_latency_sum_s=spent, latency_min_s=spent / count)
    return Usage(running, peak, mean), calls


def target_or_floor(model: str | None, floor: int, read: Callable[[], int]) -> int:
    """``read()``, or ``floor`` if it raises: the fail-safe every entry point shares (a broken poll or source
    never breaks a fan-out or a caller sizing a pool; it costs only the adaptive part)."""
    try:
        return read()
    except Exception:
        return _fell_back(model, floor)


async def atarget_or_floor(model: str | None, floor: int, read: Callable[[], Awaitable[int]]) -> int:
    """:func:`target_or_floor` for a read that is awaited (cancellation passes through)."""
    try:
        return await read()
    except Exception:
        return _fell_back(model, floor)


def _fell_back(model: str | None, floor: int) -> int:
    log.exception("model %s: adaptive capacity failed; using the floor %d", model, floor)
    return floor


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def adaptive_enabled() -> bool:
    return bool(setting(*config.ADAPTIVE_FLAG))


class Limits(Protocol):
    """What the poll path needs of a limiter: its count, its meter, its hold, and the two limits it sets.

    :class:`~model_concurrency.gate.model_limiter.ModelLimiter` (threads and event loops) is the production one;
    the lab injects a SimPy front-end on the same :class:`~model_concurrency.gate.limiter.LimiterCore`."""

    hold: AdmissionHold

    @property
    def limit(self) -> int: ...

    def inflight(self) -> int: ...

    def units(self) -> int: ...

    def take_usage(self) -> Usage: ...

    def resize(self, limit: int) -> None: ...

    def set_budget(self, budget: int | None) -> None: ...


@dataclass(frozen=True, slots=True)
class LeaseView:
    """A worker's lease from its job's coordinator, as its runtime applies and publishes it (ray_job.py)."""

    job: str
    permits: int | None  # the grant's limit; None: the lease lapsed and the runtime decides on its own
    tokens: int | None = None
    job_target: int | None = None  # the job's target at the last grant


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Fixed knobs for a runtime that must not read the environment (the lab passes its scenario's).

    Without them a runtime reads each knob through :func:`~model_concurrency.config.setting` at every poll."""

    poll_s: float
    ramp_poll_divisor: float
    poll_jitter: float
    grace_polls: int
    growth_guard: bool = True
    outage_handover: bool = True
    ceiling: int = 512
    adaptive: bool = True


class ModelRuntime:
    """One model in this process: its decisions, its limiter, its calls, and when it is polled next."""

    def __init__(
        self,
        spec: ModelSpec | None,
        *,
        name: str | None = None,
        source: SignalSource | None = None,
        policy: Policy | None = None,
        clock: Clock = time.monotonic,
        floor: int | None = None,
        limiter: Limits | None = None,
        settings: RuntimeSettings | None = None,
        publish: bool = True,
        poll_loop: asyncio.AbstractEventLoop | None = None,
        stated_limits: StatedLimits | None = None,
        recorder: CallRecorder | None = None,
    ) -> None:
        """``limiter``, ``settings`` and ``publish=False`` make a runtime whose caller owns the clock and the
        schedule (the lab's :class:`~model_concurrency.lab.client.SimClient`): its calls are counted in the
        injected limiter, its knobs are fixed, nothing is published or logged per model, and it polls only when
        told (:meth:`poll_with`).

        ``poll_loop`` (with ``clock=poll_loop.time``): the scheduled poller is a task on that event loop instead
        of a thread. For a loop on virtual time (lab/virtual_loop.py): a thread's waits are real, so when its poll
        lands among the loop's callbacks would depend on how fast the machine runs; a task's waits are the loop's
        timers, so every run makes the same polls at the same moments with the same calls in flight.

        ``stated_limits``: the engines' limits as their operator states them, instead of the spec's
        (``max_num_seqs``, ``max_num_batched_tokens`` over ``parallel_instances`` engines); the lab's clients, which
        have no spec, are told them this way. Either way every poll merges them with the page's by one rule.

        ``recorder``: where the poll drains the calls since the previous one; a job's coordinator (ray_job.py)
        gives one that reads its workers' reports, since its own process makes no call."""
        self.spec = spec
        self.name = spec.name if spec is not None else (name or "default")
        # The registry's count of this name's registrations when built: runtime_for rebuilds once it moves.
        self.registration = config.registration(self.name)
        self.clock = clock
        chosen = policy if policy is not None else _policy_for(spec)
        self.source = source if source is not None else _default_source(spec, chosen)
        self.core = ControllerCore(policy=chosen, name=self.name)
        self.calls = recorder if recorder is not None else CallRecorder()
        # Under a job's coordinator (ray_job.py) the limit is the worker's grant and this runtime does not poll.
        self.lease_view: LeaseView | None = None
        self._floor_override = floor
        self.settings = settings
        self._publish = publish
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()  # reading the limits and setting the limiter's happen together
        self._polling = False
        self._users = 0
        # Whether anything ever counted this model's calls in flight here (an injected limiter's owner does).
        self._reporting = limiter is not None
        self._said_engine_usage = False
        # The hook-alone path's previous engine reading; the reading at the last poll after an answer of the hook,
        # and the answers given since (engine_view).
        self._engine_seen: tuple[float, EngineSnapshot] | None = None
        self._answered_at: EngineSnapshot | None = None
        self._answers = 0
        self.poll_loop = poll_loop
        self._inline_polls: set[asyncio.Task[None]] = set()
        self._poller: threading.Thread | asyncio.Task[None] | concurrent.futures.Future[None] | None = None
        self._asked_at: float | None = None
        self._closed = threading.Event()
        self._last_poll_wall: float | None = None  # when the last poll was, in wall-clock seconds (published)
        url = self.source.description if self.source is not None else None
        self._watch = HealthWatch(self.name, quiet=not publish, url=url)
        self.health = Health()
        # The stated limits and the contradiction rule (signals/limits.py), merged into every poll's Observation.
        stated = stated_limits if stated_limits is not None else StatedLimits.from_spec(spec)
        self.stated_limits = StatedLimitsRule(self.name, stated, quiet=not publish)
        self._refresh_knobs()
        # The limits every method here sets and reads: the gate's limiter, whose fronts acquire from it, or an
        # injected one (the lab's SimPy front-end, whose owner admits the calls). A runtime given its limits has
        # no gate limiter (``limiter`` is not set): nothing of the gate runs on it, and a lab of 1,000 clients
        # would build 1,000 unused ones.
        self.limiter: ModelLimiter
        if limiter is None:
            from model_concurrency.gate.model_limiter import ModelLimiter

            self.limiter = ModelLimiter(self.name, self.core.target, clock)
            limiter = self.limiter
        self.limits: Limits = limiter
        self.published: RuntimeState = self._state_locked()  # replaced after every poll

    # -- what callers read ---------------------------------------------------------------------------------
    @property
    def floor(self) -> int:
        if self._floor_override is not None:
            return self._floor_override
        return self.spec.static_capacity if self.spec is not None else 1

    @property
    def adaptive(self) -> bool:
        """Whether the controller applies now (a source, and the flag on): else the floor, with no scrape."""
        if self.settings is not None:  # fixed knobs: the caller reads the signals (poll_with)
            return self.settings.adaptive
        return self.source is not None and adaptive_enabled()

    def current(self) -> int:
        """The limit in force now, without polling (hot paths, dashboards): a job's grant while one holds."""
        lease = self.lease_view
        if lease is not None and lease.permits is not None:
            return lease.permits
        return self.core.target if self.adaptive else self.floor

    peek = current

    def current_budget(self) -> int | None:
        """The token budget in force now (None: not enforced; only weighted calls are bound by it)."""
        lease = self.lease_view
        if lease is not None and lease.permits is not None:  # a grant of no tokens still lets one call through
            return None if lease.tokens is None else max(1, lease.tokens)
        return self.core.token_budget if self.adaptive else None

    def leased(self) -> bool:
        """Whether a job's grant sets the limit now (the coordinator polls; this runtime does not)."""
        lease = self.lease_view
        return lease is not None and lease.permits is not None

    def lease(self, view: LeaseView | None, *, start: int | None = None) -> int:
        """Set what a job's lease says (ray_job.py, the worker's only writer of it) and apply the limits.

        A view with permits: the grant is the limit, and no poll runs here. A view without (the lease lapsed) or
        None (the worker left its job): this runtime decides again on its own, from ``start`` (within its bounds)
        and with a poll at once, since it has not read the engine while the grant held."""
        with self._lock:
            self.lease_view = view
            if start is not None and (view is None or view.permits is None):
                self._start_at(start)
            if self._publish:
                self.published = self._state_locked()
        return self.apply_limits()

    def resume_from(self, start: int) -> int:
        """Go on from ``start`` (within the bounds), with the next poll due now: a job's new coordinator, whose
        predecessor died, takes up the calls its workers already run rather than the floor."""
        with self._lock:
            self._start_at(start)
            if self._publish:
                self.published = self._state_locked()
        return self.apply_limits()

    def _start_at(self, start: int) -> None:
        self.core.target_value = float(max(1, start))
        self.core.set_bounds(self.floor, self.core.ceiling)
        self.core.next_poll_at = self.clock()

    def apply_limits(self) -> int:
        """Bring the limiter to the limits in force (the request count and the token budget); returns the count.

        The only place a limit changes: the runtime owns the limiter, and everything above it (a fan-out's
        :class:`~model_concurrency.gate.target.Target`, :func:`slot`) asks for this instead of resizing."""
        with self._apply_lock:
            limit = max(1, self.current())
            self.limits.resize(limit)
            self.limits.set_budget(self.current_budget())
            return limit

    def seed_limit(self, limit: int) -> None:
        """Set the limiter of a runtime nothing has used yet (:func:`limiter_for`); the next apply overrides it."""
        with self._apply_lock:
            self.limits.resize(limit)

    def apply_budget(self) -> None:
        """Bring the limiter's token budget to the one in force (read and set together: a stale read never wins)."""
        with self._apply_lock:
            self.limits.set_budget(self.current_budget())

    def inflight(self) -> int:
        return self.limits.inflight()

    def note_retry_after(self, seconds: float) -> float:
        """A 429/503 asked to wait ``seconds``: no new call to this model starts before then (gate/hold.py).

        ``ValueError`` for NaN, infinite or negative delays; longer than ``MAX_RETRY_AFTER_S`` is capped. Returns
        the hold's deadline on this runtime's clock. What the policy does about the throttling is its own business
        (it reads ``client_throttled`` at the next poll); this only keeps calls from being wasted meanwhile. While
        the target stands at the floor, where no cut can lower it, refusals that repeat lengthen the hold
        (:class:`~model_concurrency.gate.hold.AdmissionHold`'s backoff).
        """
        now = self.clock()
        until = self.limits.hold.note(seconds, now, backoff=self.core.target <= self.core.lower)
        # Debug, not info: a burst of 429s would log one line each; the count is limiter.hold.holds.
        log.debug("model %s: throttled; no new call for %.3f s (Retry-After)", self.name, until - now)
        return until

    def note_throttled(self, factor: float | None = None) -> int:
        """A call came back 429/503: the target drops to the calls still in flight, now, not at the next poll.

        The rule is :meth:`ControllerCore.note_throttled` (the lab's clients call the same one); this applies it
        to the limiter at once. ``factor``: a gentler cut than the core's (gate/outcome.py). Returns the limit.
        """
        if not self.adaptive:
            return self.floor
        with self._lock:
            self.core.note_throttled(self.limits.inflight(), self.clock(), factor)
            if self._publish:
                self.published = self._state_locked()
                telemetry.publish(self.published, polled=False)
        self.apply_limits()
        return self.current()

    def held_for(self) -> float:
        """Seconds until the Retry-After hold ends (0 when calls may start)."""
        return self.limits.hold.remaining(self.clock())

    def set_floor(self, floor: int) -> None:
        self._floor_override = max(1, int(floor))
        with self._lock:
            self.core.set_bounds(self.floor, self.core.ceiling)
        self.apply_limits()

    # -- what the runtime publishes ------------------------------------------------------------------------
    def state(self) -> RuntimeState:
        """The model's state now, as one frozen record (``get_utilization`` is its ``as_dict()``)."""
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> RuntimeState:
        core = self.core
        obs, decision = core.last_observation, core.last_decision
        good = obs if (obs is not None and obs.ok) else None
        snapshot = core.last_snapshot
        score = snapshot.gateway_saturation if core.last_ok and snapshot is not None else None
        gateway_saturation, gateway_saturated = gateway_view(core.last_ok, score)
        outage = self.limits.hold.outage
        since = outage.since
        return RuntimeState(
            model=self.name,
            served_model_name=self.spec.served_name if self.spec is not None else None,
            running=good.running if good else None,
            waiting=good.waiting if good else None,
            waiting_capacity=good.waiting_capacity if good else None,
            kv_cache_usage=good.kv_cache_usage if good else None,
            inflight=self.limits.inflight(),
            inflight_tokens=self.limits.units(),
            token_budget=self.current_budget(),
            current_target=self.current() if self.leased() else core.target,
            floor=core.lower,
            ceiling=core.upper,
            metrics_ok=core.last_ok,
            saturated=core.saturated,
            gateway_saturation=gateway_saturation,
            gateway_saturated=gateway_saturated,
            page_hold=core.page_hold.reason,
            last_poll=self._last_poll_wall,
            consecutive_failures=core.consecutive_failures,
            last_error=core.last_error,
            metrics_url=self.source.description if self.source is not None else None,
            policy=type(core.policy).__name__,
            adaptive=True,
            limited_by=decision.limited_by if decision is not None else None,
            last_decision=str(decision) if decision is not None else None,
            fallback=self.health.fallback,
            signal_stale=self.health.signal_stale,
            limit_unreached=self.health.limit_unreached,
            counter_resets=self.health.counter_resets,
            outage=outage.reason if since is not None else None,
            outage_s=max(0.0, self.clock() - since) if since is not None else None,
            hold_backoff=self.limits.hold.factor,
            limits=self._limits_view(obs),
            **self._job_view(),
        )

    def _job_view(self) -> dict[str, Any]:
        lease = self.lease_view
        if lease is None:
            return {}
        return {
            "job": lease.job,
            "grant": lease.permits,
            "job_target": lease.job_target,
            "lease_lapsed": lease.permits is None,
        }

    def _limits_view(self, obs: Observation | None) -> dict[str, Any] | None:
        """The limits last merged into an Observation; before the first poll, the stated ones alone."""
        if obs is not None:
            known = obs.limits
        else:
            rule = self.stated_limits
            known = merge_limits(rule.stated, None, None, seqs_ignored=rule.seqs_ignored)[0]
        return known.as_dict() if known is not None else None

    def _refresh_knobs(self) -> None:
        fixed = self.settings
        if fixed is not None:
            core = self.core
            core.poll_interval_s, core.ramp_poll_divisor = fixed.poll_s, fixed.ramp_poll_divisor
            core.poll_jitter, core.grace_polls = fixed.poll_jitter, fixed.grace_polls
            core.guard.enabled, core.outage_handover = fixed.growth_guard, fixed.outage_handover
            core.set_bounds(self.floor, fixed.ceiling)
            return
        self.core.poll_interval_s = setting(*config.POLL_S)
        self.core.ramp_poll_divisor = setting(*config.RAMP_POLL_DIVISOR)
        self.core.poll_jitter = setting(*config.POLL_JITTER)
        self.core.grace_polls = setting(*config.GRACE_POLLS)
        self.core.guard.enabled = setting(*config.GROWTH_GUARD)
        self.core.outage_handover = setting(*config.OUTAGE_HANDOVER)
        self.core.set_bounds(self.floor, setting(*config.MAX_CONCURRENCY))
        if isinstance(self.source, (VllmMetricsSource, PrometheusSource)):
            timeout = setting(*config.TIMEOUT_S)
            if timeout != self.source.limits.timeout_s:
                self.source.limits = ScrapeLimits(timeout_s=timeout, deadline_s=2 * timeout)

    # -- users and the schedule ----------------------------------------------------------------------------
    def enter(self) -> None:
        """A fan-out or a slot starts using the model: its calls are counted, and it is polled on schedule."""
        with self._lock:
            self._users += 1
            self._reporting = True
            self._start_poller()

    def asked(self) -> None:
        """The hook was asked for the capacity: poll on schedule for a while, as the caller's pool runs.

        With a poll interval of 0 every ask polls inline already, and a scheduled poller would only spin.
        """
        with self._lock:
            self._asked_at = self.clock()
            self._answers += 1
            if self.core.poll_interval_s > 0:
                self._start_poller()

    def _start_poller(self) -> None:
        if self._poller is None and self.source is not None and not self._closed.is_set():
            export.ensure_started()  # MODEL_CONCURRENCY_EXPORT: publish for `watch --job` (export.py)
            if self.poll_loop is not None:
                poller = self._apoll_loop()
                if _running_loop() is self.poll_loop:
                    self._poller = self.poll_loop.create_task(poller)
                else:  # asked from another thread (a hook called through asyncio.to_thread)
                    self._poller = asyncio.run_coroutine_threadsafe(poller, self.poll_loop)
                return
            self._poller = threading.Thread(
                target=self._poll_loop, name=f"model-concurrency-poll-{self.name}", daemon=True
            )
            self._poller.start()

    def _in_use(self) -> bool:
        """Someone counts calls here, or the hook was asked recently (a pool it sized may still be running)."""
        if self._users > 0:
            return True
        if self._asked_at is None:
            return False
        linger = max(10 * self.core.poll_interval_s, HOOK_LINGER_S)
        return self.clock() - self._asked_at <= linger

    def scheduled_poll_at(self) -> float | None:
        """When the background poller polls next: now while a poll (or the resize after it) is under way, None
        while nothing is polled on schedule (nor during an outage: gate/outage.py pins the limit and no poll is
        claimed). A virtual-time harness stops its clock there until the poll is done, as a wall clock would wait
        for it (lab/conformance.py)."""
        with self._lock:
            if self._poller is None or self._closed.is_set():
                return None
            if self._polling:
                return self.clock()
            if self.limits.hold.outage.active:
                return None
            if self.limits.limit != self.current():
                return self.clock()
            if self.poll_loop is not None:  # the poller is a task there: its own timer stops that loop's clock
                return None
            return self.core.next_poll_at

    def leave(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)

    def close(self) -> None:
        """Stop polling (the registry dropped this runtime); holders still release into its limiter."""
        self._closed.set()

    def _next_move(self) -> tuple[bool, float] | None:
        """The scheduled poller's next move, the same for its thread and its task: None to stop (nothing uses the
        model any more), else whether it claimed a poll to run now, and how long to wait after it (or instead)."""
        with self._lock:
            if not self._in_use() or self._closed.is_set():
                self._poller = None
                return None
            wait = self.core.next_poll_at - self.clock()
        if wait > 0:
            return False, wait
        if self.adaptive and self._claim():
            return True, _MIN_GAP_S
        return False, _MAX_WAIT_S  # due but not claimed (an outage, or a poll under way elsewhere): no spin

    def _poll_loop(self) -> None:
        while (move := self._next_move()) is not None:
            claimed, wait = move
            if claimed:
                self._poll_blocking()
            self._closed.wait(min(wait, _MAX_WAIT_S))  # a clock that jumps (a test's) is followed promptly

    async def _apoll_loop(self) -> None:
        """:meth:`_poll_loop` as a task on ``poll_loop``: every wait is that loop's timer."""
        while (move := self._next_move()) is not None:
            claimed, wait = move
            if claimed:
                await self._apoll()
            await asyncio.sleep(wait)

    # -- the poll ------------------------------------------------------------------------------------------
    def _claim(self) -> bool:
        if self.source is None:
            return False
        now = self.clock()
        with self._lock:
            # While the model is unreachable by its own calls (gate/outage.py) a poll says nothing new: the
            # target is kept for when it returns, the limiter meanwhile admits one probe at a time.
            if self._polling or not self.core.poll_due(now) or self.limits.hold.outage.active or self.leased():
                return False
            self._polling = True
            self._refresh_knobs()
            self.core.begin_poll(now)
            return True

    def poll_with(self, read: Callable[[], EngineSnapshot | None], unavailable: str = "no snapshot") -> int:
        """A poll at the caller's moment, due or not (the lab's, on its SimPy clock): claimed, ``read`` for the
        snapshot (None: no signal, for ``unavailable``), then the scheduled poll's own path (:meth:`_finish`: the
        poll step, the health judgement, the limits applied). Returns the limit in force."""
        with self._lock:
            self._polling = True
            if self.settings is None:  # fixed settings were applied when the runtime was built
                self._refresh_knobs()
            self.core.begin_poll(self.clock())
        try:
            snapshot = read()
        except Exception as exc:
            self._finish(None, exc)
        else:
            self._finish(snapshot, None, unavailable)
        return self.current()

    def _finish(self, snapshot: EngineSnapshot | None, error: BaseException | None, unavailable: str = "") -> None:
        with self._lock:
            try:
                now = self.clock()
                usage, calls = self.limits.take_usage(), self.calls.drain()
                if snapshot is not None and not self._reporting:
                    answered = (self._answered_at, self._answers) if self._answered_at is not None else None
                    usage, calls = engine_view(snapshot, self._engine_seen, now, self.core.target, answered)
                    self._engine_seen = (now, snapshot)
                    if self._answers > 0 or self._answered_at is None:
                        self._answered_at, self._answers = snapshot, 0
                    if not self._said_engine_usage:
                        self._said_engine_usage = True
                        log.info(
                            "model %s: nothing here counts calls in flight (resolve_capacity alone); judging use "
                            "from the engine's running requests and its completions between polls",
                            self.name,
                        )
                reason = None
                if snapshot is None:
                    reason = f"{type(error).__name__}: {error}" if error is not None else (unavailable or "no snapshot")
                previous, limit = self.core.last_snapshot, self.limits.limit
                try:
                    known = self.stated_limits.merge(
                        snapshot.limits if snapshot is not None else None,
                        snapshot.running if snapshot is not None else None,
                    )
                    poll_step(self.core, calls, usage, now, snapshot, reason, known)
                except Exception as exc:  # a bug in reading the page must cost one poll, never the caller's call
                    log.exception("model %s: the poll step failed", self.name)
                    snapshot, reason = None, f"poll step raised {type(exc).__name__}: {exc}"
                    self.core.fail(now, reason, inflight=usage.inflight)
                self._judge_health(snapshot, previous, limit, reason)
                if self._publish:
                    self._last_poll_wall = _wall(self.core.last_poll_time, self.clock())
                    self.published = self._state_locked()
                    telemetry.publish(self.published)
            finally:
                self._polling = False
        self.apply_limits()

    def _judge_health(
        self, snapshot: EngineSnapshot | None, previous: EngineSnapshot | None, limit: int, reason: str | None
    ) -> None:
        """The failure states after a poll (health.py): fields of the state, metrics, a line when one changes."""
        core = self.core
        fallback = fallback_kind(
            core.last_ok, core.consecutive_failures, core.effective_grace_polls, core.outage_floored
        )
        self.health = self._watch.judge(
            fallback=fallback,
            obs=core.last_observation,
            limit=limit,
            target=core.target,
            snapshot=snapshot,
            previous=previous,
            failures=core.consecutive_failures,
            reason=reason,
        )

    def _poll_blocking(self) -> None:
        assert self.source is not None
        try:
            snapshot = self.source.read()
        except Exception as exc:
            self._finish(None, exc)
        else:
            self._finish(snapshot, None)

    def target(self) -> int:
        """The limit for sync callers; polls inline when due, or in a thread when inside a running event loop."""
        if self.adaptive and self._claim():
            running = _running_loop()
            if running is not None and running is self.poll_loop:
                task = running.create_task(self._apoll())
                self._inline_polls.add(task)  # the loop keeps only a weak reference to a task
                task.add_done_callback(self._inline_polls.discard)
            elif running is not None:
                threading.Thread(target=self._poll_blocking, name="model-concurrency-poll", daemon=True).start()
            else:
                self._poll_blocking()
        return self.current()

    async def atarget(self) -> int:
        """The limit for async callers; a due poll is awaited here, never blocking the loop."""
        if self.adaptive and self._claim():
            await self._apoll()
        return self.current()

    async def _apoll(self) -> None:
        """A claimed poll, read on the running loop."""
        assert self.source is not None
        try:
            snapshot = await self.source.aread()
        except asyncio.CancelledError:
            with self._lock:
                self._polling = False
            raise
        except Exception as exc:
            self._finish(None, exc)
        else:
            self._finish(snapshot, None)

    def __repr__(self) -> str:
        return f"ModelRuntime(model={self.name!r}, target={self.current()}, source={self.source!r})"


def _wall(at: float | None, now: float) -> float | None:
    """A time on the runtime's clock as wall-clock seconds since the epoch (dashboards show dates, not uptimes)."""
    return None if at is None else time.time() - (now - at)


def _default_source(spec: ModelSpec | None, policy: Policy) -> SignalSource | None:
    if spec is None:
        return None
    if not uses_engine_signals(policy):
        return ClientOnlySource() if spec.base_url else None
    limits = ScrapeLimits(timeout_s=setting(*config.TIMEOUT_S), deadline_s=2 * setting(*config.TIMEOUT_S))
    # An explicit metrics_url was chosen on purpose: the fleet-wide Prometheus setting never overrides it.
    prometheus_url = spec.prometheus_url or ("" if spec.metrics_url else config.fleet_prometheus_url())
    if prometheus_url:
        return PrometheusSource(prometheus_url, spec.served_name, limits=limits)
    url = spec.resolved_metrics_url
    if url is None:
        return None
    return VllmMetricsSource.for_model(
        url, spec.served_name, base_url=spec.base_url, api_key=spec.api_key, limits=limits
    )


def _policy_for(spec: ModelSpec | None) -> Policy:
    if spec is None:
        return Static()
    chosen = spec.policy if spec.policy is not None else setting(*config.POLICY)
    if not isinstance(chosen, str):
        return chosen
    try:
        return load_policy(chosen)
    except ValueError as exc:
        log.error("model %s: %s; using the built-in default policy %r", spec.name, exc, DEFAULT_POLICY)
        return load_policy(DEFAULT_POLICY)


# -- the registry ------------------------------------------------------------------------------------------------
_runtimes: dict[str, ModelRuntime] = {}
_installed: set[str] = set()
_registry_lock = threading.Lock()
_reset_hooks: list[Callable[[], None]] = []


def _key(model: str | None) -> tuple[ModelSpec | None, str]:
    spec = get_model(model)
    return spec, (spec.name if spec is not None else (model or "default"))


def runtime_for(model: str | None) -> ModelRuntime:
    """The process's one runtime for ``model`` (a name or a role); rebuilt when its registration changed."""
    spec, key = _key(model)
    runtime = _runtimes.get(key)
    if runtime is not None and _fits(runtime, spec, key):
        return runtime
    with _registry_lock:
        runtime = _runtimes.get(key)
        if runtime is None or not _fits(runtime, spec, key):
            if runtime is not None:
                runtime.close()
            _installed.discard(key)
            runtime = _runtimes[key] = ModelRuntime(spec, name=key)
        return runtime


def _fits(runtime: ModelRuntime, spec: ModelSpec | None, key: str) -> bool:
    """Whether ``runtime`` still serves ``key``: not re-registered since it was built (the registry's count, so
    config never calls in here), and built from the current spec unless it was installed on purpose."""
    if runtime.registration != config.registration(key):
        return False
    return runtime.spec == spec or key in _installed


def install_runtime(runtime: ModelRuntime) -> ModelRuntime:
    """Make ``runtime`` the one every entry point uses for its model (tests, custom sources or clocks).

    It stays until the model is re-registered or runtimes are reset.
    """
    with _registry_lock:
        old = _runtimes.get(runtime.name)
        if old is not None and old is not runtime:
            old.close()
        _runtimes[runtime.name] = runtime
        _installed.add(runtime.name)
    return runtime


def forget_runtime(name: str) -> None:
    """Drop ``name``'s runtime (its model was re-registered); calls in flight release into the old limiter."""
    with _registry_lock:
        runtime = _runtimes.pop(name, None)
        _installed.discard(name)
    if runtime is not None:
        runtime.close()


def is_installed(name: str) -> bool:
    """Whether ``name`` has a runtime put there by :func:`install_runtime` (a model known without a spec)."""
    return name in _installed


def registered_runtimes() -> dict[str, ModelRuntime]:
    with _registry_lock:
        return dict(_runtimes)


def on_reset(hook: Callable[[], None]) -> None:
    """Run ``hook`` when runtimes are reset (the gate drops its pools and stats this way)."""
    _reset_hooks.append(hook)


def reset_runtimes() -> None:
    """Drop every runtime and its state (registrations stay); calls in flight finish normally."""
    with _registry_lock:
        dropped = list(_runtimes.values())
        _runtimes.clear()
        _installed.clear()
    for runtime in dropped:
        runtime.close()
    for hook in _reset_hooks:
        hook()


# The original design's name for :func:`reset_runtimes` (it dropped "gates and controllers", which a runtime now
# holds together). Callers that reset between tests or jobs use it; a rename never breaks them.
reset_controllers = reset_runtimes


def limiter_for(model: str | None, limit: int | None = None) -> ModelLimiter:
    """The model's limiter (its runtime's); ``limit`` resizes it only when the runtime is new."""
    fresh = _key(model)[1] not in _runtimes
    runtime = runtime_for(model)
    if fresh and limit is not None:
        runtime.seed_limit(limit)
    return runtime.limiter


def is_current(limiter: ModelLimiter) -> bool:
    """Whether ``limiter`` still belongs to its model's registered runtime (False after a reset)."""
    runtime = _runtimes.get(limiter.name)
    return (
        runtime is not None and runtime.limiter is limiter and runtime.registration == config.registration(limiter.name)
    )


def registered_limiters() -> dict[str, ModelLimiter]:
    return {name: runtime.limiter for name, runtime in registered_runtimes().items()}


# A child must not inherit locks held by a parent's thread mid-poll, nor its poll state or poller threads.
reset_in_forked_child(globals(), "_registry_lock", threading.Lock, _runtimes, _installed)
