"""What limit a fan-out obeys right now, re-read cheaply while it runs.

A :class:`Target` belongs to one fan-out call. It resolves the model's key, finds its limiter and (when the
adaptive path applies) its controller, and re-reads the controller's target through the controller's own
throttle: ``target()``/``atarget()`` cost a clock read and a lock when no poll is due, so the gate may ask often.
It still asks only every :data:`REFRESH_EVERY` starts or :data:`REFRESH_S` seconds, which keeps the per-item
path free of environment and registry look-ups while a long fan-out follows the ramp.

Every re-read also re-wires ``controller.inflight`` to the limiter's count (cheap, and robust to the controller
being rebuilt when a model is re-registered), unless the limiter was dropped by a reset meanwhile: a call that
outlives a reset keeps its old limiter to release into, and must not report that old count.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from model_concurrency import hooks
from model_concurrency.config import get_model
from model_concurrency.gate.model_limiter import ModelLimiter, is_current, limiter_for
from model_concurrency.gate.stats import GateStats, status_of

if TYPE_CHECKING:
    from model_concurrency.controller import CallRecorder, LiveController

__all__ = ["REFRESH_EVERY", "REFRESH_S", "Target", "check_args"]

log = logging.getLogger("model_concurrency")

REFRESH_EVERY = 16
REFRESH_S = 0.1


def check_args(capacity: int | None, timeout: float | None) -> None:
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
        raise ValueError(f"capacity must be an int >= 1 (or None to follow the model's target), got {capacity!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds per item (or None), got {timeout!r}")


class Target:
    """One fan-out's view of its model: key, limiter, controller, current limit, and the outcome tally."""

    __slots__ = ("_limiter", "countdown", "floor", "key", "limit", "model", "next_at", "pinned", "recorder", "tally")

    def __init__(self, model: str | None, capacity: int | None) -> None:
        spec = get_model(model)
        self.model = model
        self.key = spec.name if spec is not None else (model or "default")
        self.floor = spec.static_capacity if spec is not None else 1
        self.pinned = capacity
        self.limit = capacity or self.floor
        self.recorder: CallRecorder | None = None
        self._limiter: ModelLimiter | None = None
        self.tally = GateStats()
        self.countdown = REFRESH_EVERY
        self.next_at = 0.0

    @property
    def limiter(self) -> ModelLimiter:
        assert self._limiter is not None, "refresh() first"
        return self._limiter

    def due(self) -> bool:
        """Count one start; True when the target should be re-read."""
        self.countdown -= 1
        return self.countdown <= 0 or time.monotonic() >= self.next_at

    def _controller(self) -> LiveController | None:
        try:
            return hooks.controller_for(self.model)
        except Exception:  # the fail-safe: a broken lookup never breaks a fan-out
            log.exception("model %s: no controller; using the static capacity", self.model)
            return None

    def _static(self) -> int:
        self.floor = hooks.static_capacity(self.model)
        return self.floor

    def refresh(self) -> int:
        """Re-read the target from a plain thread (a due poll runs inline, as the controller decides)."""
        controller = self._controller()
        if controller is None:
            return self._apply(None, self._static())
        try:
            target = controller.target()
        except Exception:
            log.exception("model %s: target failed; using the floor", self.model)
            target = controller.floor
        return self._apply(controller, target)

    async def arefresh(self) -> int:
        """Re-read the target from an event loop (a due poll is awaited, never blocking the loop)."""
        controller = self._controller()
        if controller is None:
            return self._apply(None, self._static())
        try:
            target = await controller.atarget()
        except Exception:
            log.exception("model %s: target failed; using the floor", self.model)
            target = controller.floor
        return self._apply(controller, target)

    def _apply(self, controller: LiveController | None, target: int) -> int:
        target = max(1, int(target))
        if self._limiter is None:
            self._limiter = limiter_for(self.key, target)
        limiter = self._limiter
        if controller is not None:
            self.recorder = controller.calls
            if is_current(limiter):
                controller.inflight = limiter.inflight
        else:
            self.recorder = None
        limiter.resize(target)
        self.limit = self.pinned or target
        self.countdown = REFRESH_EVERY
        self.next_at = time.monotonic() + REFRESH_S
        return self.limit

    def record(self, latency_s: float, exc: BaseException | None) -> None:
        """Tally one finished call here and, when a controller exists, in its recorder for the next poll."""
        tally = self.tally
        tally.calls += 1
        tally.latency_sum_s += latency_s
        if latency_s > tally.latency_max_s:
            tally.latency_max_s = latency_s
        if exc is None:
            if self.recorder is not None:
                self.recorder.record(latency_s, ok=True)
            return
        status = status_of(exc)
        tally.add_error(exc, status)
        if self.recorder is not None:
            self.recorder.record(latency_s, ok=False, status=status)
