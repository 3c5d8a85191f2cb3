"""The controller: bounds, throttle, grace and fail-safe around a policy, one per model.

Two layers, so the same decisions run live, in threads and in the simulator:

* :class:`ControllerCore` is a pure state machine. It is told "a poll succeeded with this Observation" or
  "a poll failed because ..." at a time it is given; it applies the policy, the grace rule and the bounds, and
  says when the next poll is due. It never fetches or sleeps, so tests drive it with plain calls and the SimPy
  lab drives it on simulated time.
* :class:`LiveController` wraps a core with a :class:`~model_concurrency.signals.SignalSource`, a clock and a
  lock. Callers ask for the target; when a poll is due exactly one caller performs it (inline in a plain thread,
  awaited on the async path, or in a background thread when a sync caller sits inside a running event loop), and
  everyone else gets the current target without waiting.

Fail-safe rules (docs/operations.md): the target starts at the floor; a failed poll holds the last good target
while no more than ``grace_polls`` consecutive polls have failed, and the next failure drops it to the floor;
observations with non-finite or negative values count as failed polls; a policy that raises or answers NaN
holds. The target is always clamped to ``[floor, max(floor, ceiling)]``: the floor (the static configuration)
wins over a ceiling set below it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from model_concurrency import config, telemetry
from model_concurrency.config import ModelSpec, setting
from model_concurrency.observation import CallStats, EngineSnapshot, Observation, observe
from model_concurrency.policies.base import Policy
from model_concurrency.policies.registry import load_policy, make_policy
from model_concurrency.signals.prometheus_api import PrometheusSource
from model_concurrency.signals.scrape import ScrapeLimits
from model_concurrency.signals.source import ClientOnlySource, SignalSource, VllmMetricsSource

__all__ = [
    "CallRecorder",
    "ControllerCore",
    "LiveController",
    "forget_controller",
    "get_controller",
    "install_controller",
    "reset_controllers",
]

log = logging.getLogger("model_concurrency")
Clock = Callable[[], float]


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
    target_value: float = field(init=False)
    consecutive_failures: int = 0
    polls: int = 0
    next_poll_at: float = -math.inf
    last_poll_time: float | None = None
    last_ok: bool | None = None
    last_error: str | None = None
    last_observation: Observation | None = None
    last_snapshot: EngineSnapshot | None = None

    def __post_init__(self) -> None:
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
        return bool(self.last_ok and obs is not None and obs.waiting_capacity > 0)

    def set_bounds(self, floor: int, ceiling: int) -> None:
        self.floor, self.ceiling = floor, ceiling
        self.target_value = self._clamp(self.target_value)

    def _clamp(self, value: float) -> float:
        return float(min(max(value, self.lower), self.upper))

    def poll_due(self, now: float) -> bool:
        return now >= self.next_poll_at

    def begin_poll(self, now: float) -> None:
        """Claim the poll that is due: the next one is due a full interval after this one started."""
        self.next_poll_at = now + self.poll_interval_s

    def update(self, obs: Observation, reason: str | None = None) -> int:
        """Apply one poll's outcome (``obs.ok=False`` for a failed poll, with ``reason``). Returns the target."""
        self.polls += 1
        self.last_poll_time = obs.time
        if not obs.ok:
            return self._fail(obs, reason or "poll failed")
        problem = _implausible(obs)
        if problem is not None:
            return self._fail(obs, f"implausible observation: {problem}")
        self.consecutive_failures = 0
        self.last_ok, self.last_error, self.last_observation = True, None, obs
        try:
            proposed = float(self.policy.next_target(self.target_value, obs))
        except Exception as exc:  # a plug-in policy's bug must not reach the caller's fan-out
            self.last_error = f"policy {type(self.policy).__name__} raised {type(exc).__name__}: {exc}"
            log.error("%s; holding the target", self.last_error)
            return self.target
        if math.isfinite(proposed):
            self.target_value = self._clamp(proposed)
        return self.target

    def fail(self, now: float, reason: str, *, inflight: int = 0) -> int:
        """A poll that produced no observation (unreachable, garbage, timeout)."""
        return self.update(Observation(ok=False, time=now, inflight=inflight), reason)

    @property
    def effective_grace_polls(self) -> int:
        """The grace in force: a policy may pin its own (``seed-aimd`` reproduces the original reset with 0)."""
        pinned = getattr(self.policy, "grace_polls", None)
        return int(pinned) if isinstance(pinned, int) and pinned >= 0 else self.grace_polls

    def _fail(self, obs: Observation, reason: str) -> int:
        self.consecutive_failures += 1
        self.last_ok, self.last_error, self.last_observation = False, reason, obs
        if self.consecutive_failures > self.effective_grace_polls:
            self.target_value = float(self.lower)
        return self.target


class CallRecorder:
    """Per-model tally of this process's own calls since the previous poll, fed by the gate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.calls = self.errors = self.throttled = 0
        self.latency_sum = 0.0
        self.latency_min: float | None = None

    def record(self, latency_s: float, *, ok: bool, status: int | None = None) -> None:
        with self._lock:
            self.calls += 1
            if not ok:
                self.errors += 1
            if status in (429, 503):
                self.throttled += 1
            if math.isfinite(latency_s) and latency_s >= 0:
                self.latency_sum += latency_s
                self.latency_min = latency_s if self.latency_min is None else min(self.latency_min, latency_s)

    def drain(self) -> CallStats:
        with self._lock:
            stats = CallStats(
                calls=self.calls,
                errors=self.errors,
                throttled=self.throttled,
                latency_sum_s=self.latency_sum,
                latency_min_s=self.latency_min,
            )
            self._reset()
            return stats


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class LiveController:
    """A :class:`ControllerCore` fed by a live signal source, safe to share across threads and event loops."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        source: SignalSource | None = None,
        policy: Policy | None = None,
        clock: Clock = time.monotonic,
        floor: int | None = None,
    ) -> None:
        self.spec = spec
        self.clock = clock
        chosen = policy if policy is not None else _policy_for(spec)
        self.source = source if source is not None else _default_source(spec, chosen)
        self.core = ControllerCore(policy=chosen)
        self.inflight: Callable[[], int] = lambda: 0
        self.calls = CallRecorder()
        self._floor_override = floor
        self._lock = threading.Lock()
        self._polling = False
        self._refresh_knobs()

    # -- knobs ---------------------------------------------------------------------------------------------
    @property
    def floor(self) -> int:
        return self._floor_override if self._floor_override is not None else self.spec.static_capacity

    def set_floor(self, floor: int) -> None:
        self._floor_override = max(1, int(floor))
        with self._lock:
            self.core.set_bounds(self.floor, self.core.ceiling)

    def _refresh_knobs(self) -> None:
        self.core.poll_interval_s = max(0.0, setting(*config.POLL_S))
        self.core.grace_polls = max(0, setting(*config.GRACE_POLLS))
        self.core.set_bounds(self.floor, setting(*config.MAX_CONCURRENCY))
        if isinstance(self.source, (VllmMetricsSource, PrometheusSource)):
            timeout = setting(*config.TIMEOUT_S)
            if timeout > 0 and timeout != self.source.limits.timeout_s:
                self.source.limits = ScrapeLimits(timeout_s=timeout, deadline_s=2 * timeout)

    # -- polling -------------------------------------------------------------------------------------------
    def _claim(self) -> bool:
        if self.source is None:
            return False
        now = self.clock()
        with self._lock:
            if self._polling or not self.core.poll_due(now):
                return False
            self._polling = True
            self._refresh_knobs()
            self.core.begin_poll(now)
            return True

    def _finish(self, snapshot: EngineSnapshot | None, error: BaseException | None) -> None:
        with self._lock:
            try:
                now = self.clock()
                inflight = self.inflight()
                calls = self.calls.drain()
                if snapshot is not None:
                    obs = observe(snapshot, self.core.last_snapshot, inflight=inflight, time=now, calls=calls)
                    self.core.last_snapshot = snapshot
                    self.core.update(obs)
                else:
                    reason = f"{type(error).__name__}: {error}" if error is not None else "no snapshot"
                    self.core.fail(now, reason, inflight=inflight)
                    log.warning(
                        "model %s: metrics poll failed (%s); %d consecutive, target %d",
                        self.spec.name,
                        reason,
                        self.core.consecutive_failures,
                        self.core.target,
                    )
                telemetry.publish(self)
            finally:
                self._polling = False

    def _poll_blocking(self) -> None:
        assert self.source is not None
        try:
            snapshot = self.source.read()
        except Exception as exc:
            self._finish(None, exc)
        else:
            self._finish(snapshot, None)

    def target(self) -> int:
        """The current target for sync callers. Polls inline when due, unless inside a running event loop."""
        if self._claim():
            if _in_event_loop():
                threading.Thread(target=self._poll_blocking, name="model-concurrency-poll", daemon=True).start()
            else:
                self._poll_blocking()
        return self.core.target

    async def atarget(self) -> int:
        """The current target for async callers; a due poll is awaited here, never blocking the loop."""
        if self._claim():
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
        return self.core.target

    def peek(self) -> int:
        """The current target without polling (for dashboards and hot paths)."""
        return self.core.target

    def __repr__(self) -> str:
        return f"LiveController(model={self.spec.name!r}, target={self.core.target}, source={self.source!r})"


def _default_source(spec: ModelSpec, policy: Policy) -> SignalSource | None:
    if getattr(policy, "uses_engine_signals", True) is False:
        return ClientOnlySource() if spec.base_url else None
    limits = ScrapeLimits(timeout_s=setting(*config.TIMEOUT_S), deadline_s=2 * setting(*config.TIMEOUT_S))
    if spec.prometheus_url:
        return PrometheusSource(spec.prometheus_url, spec.served_name, limits=limits)
    url = spec.resolved_metrics_url
    if url is None:
        return None
    return VllmMetricsSource.for_model(
        url,
        spec.served_name,
        base_url=spec.base_url,
        api_key=spec.api_key,
        limits=ScrapeLimits(timeout_s=setting(*config.TIMEOUT_S), deadline_s=2 * setting(*config.TIMEOUT_S)),
    )


def _policy_for(spec: ModelSpec) -> Policy:
    chosen = spec.policy if spec.policy is not None else setting(*config.POLICY)
    if not isinstance(chosen, str):
        return chosen
    try:
        return load_policy(chosen)
    except ValueError as exc:
        log.error("model %s: %s; using the default AIMD", spec.name, exc)
        return make_policy("aimd")


# -- the per-model cache ---------------------------------------------------------------------------------------
_controllers: dict[str, LiveController] = {}
_cache_lock = threading.Lock()
_reset_hooks: list[Callable[[], None]] = []


def get_controller(spec: ModelSpec) -> LiveController:
    """The process's one controller for ``spec.name`` (rebuilt if the registration changed)."""
    with _cache_lock:
        controller = _controllers.get(spec.name)
        if controller is None or controller.spec != spec:
            controller = LiveController(spec)
            _controllers[spec.name] = controller
        return controller


def install_controller(controller: LiveController) -> LiveController:
    """Make ``controller`` the one the hooks and the gate use for its model (tests, custom sources or clocks).

    It stays until the model is re-registered or controllers are reset.
    """
    with _cache_lock:
        _controllers[controller.spec.name] = controller
    return controller


def forget_controller(name: str) -> None:
    with _cache_lock:
        _controllers.pop(name, None)


def on_reset(hook: Callable[[], None]) -> None:
    """Run ``hook`` when controllers are reset (the gate drops its limiters this way)."""
    _reset_hooks.append(hook)


def reset_controllers() -> None:
    """Drop every controller and its state (registrations stay); calls in flight finish normally."""
    with _cache_lock:
        _controllers.clear()
    for hook in _reset_hooks:
        hook()


def _after_fork_in_child() -> None:
    # A child must not inherit locks held by a parent's thread mid-poll, nor its poll state.
    global _cache_lock
    _cache_lock = threading.Lock()
    _controllers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
