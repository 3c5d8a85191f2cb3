"""AIMD with slow start: double per poll until the first saturation, then the production AIMD.

The production AIMD grows by 25 % a poll, so 4 → 512 takes 22 polls (about 4.5 minutes at 12 s a poll), the
ramp users of every concurrency limiter complain about. TCP answers with slow start: double until the first loss,
then switch to congestion avoidance. Here a "loss" is a poll with capacity-waiting:

* slow start (initially, and again after a long idle): near-full and unsaturated → ``max(target × slow_start_factor,
  target + increase_min)``; the application-limited hold applies (no growth unless ``inflight ≥ near_full ×
  target``), so a job that cannot fill its window does not double it;
* the first saturated poll leaves slow start for good (until the next long idle) with the AIMD decrease
  ``min(decrease_factor × target, sustainable)``; from then on it is exactly :class:`AIMD`;
* a long idle (``inflight == 0`` on every poll for at least ``idle_s`` seconds of ``obs.time``) re-enters slow
  start, as TCP restarts its window after idle (RFC 5681 §4.1): what was learnt about the engine may be stale.

Doubling overshoots by up to 2×, for one poll: the saturated poll that ends slow start cuts straight to the
share the engine actually served, so the overshoot costs one poll of queueing, not a collapse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model_concurrency.observation import Observation
from model_concurrency.policies._common import IdleClock, app_limited
from model_concurrency.policies.aimd import AIMD

__all__ = ["AIMDSlowStart"]


@dataclass(slots=True)
class AIMDSlowStart(AIMD):
    """Slow start (×``slow_start_factor`` a poll) until the first saturation, then :class:`AIMD`.

    Parameters:
        slow_start_factor: growth factor per near-full poll during slow start (default 2, > 1).
        idle_s: seconds of ``inflight == 0`` (by ``obs.time``) after which slow start is entered again
            (default 120; ``inf`` never re-enters).
        increase_fraction, increase_min, decrease_factor, near_full: the AIMD phase, inherited from
            :class:`AIMD` (its defaults and checks); ``increase_min`` is also the smallest slow-start step and
            ``near_full`` gates both phases.
    """

    slow_start_factor: float = 2.0
    idle_s: float = 120.0
    in_slow_start: bool = field(default=True, init=False)
    idle: IdleClock = field(default_factory=IdleClock, init=False)

    def __post_init__(self) -> None:
        AIMD.__post_init__(self)  # not super(): a slots dataclass is a new class, which zero-argument super() misses
        if not self.slow_start_factor > 1:
            raise ValueError(f"slow_start_factor must be > 1, got {self.slow_start_factor}")
        if not self.idle_s >= 0:
            raise ValueError(f"idle_s must be >= 0, got {self.idle_s}")

    def _track_idle(self, obs: Observation) -> None:
        if self.idle.idle_past(obs, self.idle_s):
            self.in_slow_start = True

    def next_target(self, target: float, obs: Observation) -> float:
        self._track_idle(obs)
        if obs.waiting_capacity > 0:
            self.in_slow_start = False
            return AIMD.next_target(self, target, obs)
        if self.in_slow_start:
            if not app_limited(obs, target, self.near_full):
                return max(target * self.slow_start_factor, target + self.increase_min)
            return target
        return AIMD.next_target(self, target, obs)
