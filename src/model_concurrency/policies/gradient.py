"""Gradient: a latency gradient in the Gradient2 style, from this process's own measured latencies.

For endpoints with no ``/metrics`` (hosted APIs, gateways), the only signals are the client's own: how long its
calls took, and whether the server pushed back (HTTP 429/503). Netflix's Gradient2 limit works from exactly that.
It compares a short-term latency with a long-term baseline; latency rising above the baseline means queues are
growing somewhere, so the limit shrinks in proportion:

* ``long ← long + a_long × (latency − long)`` and ``short ← short + a_short × (latency − short)`` with
  ``a = 2 / (window + 1)`` (EWMAs over polls; ``latency`` is ``obs.client_latency_mean_s``, the mean of this
  process's calls that finished since the previous poll). When ``long / short > 2`` the baseline is decayed by
  ``long_decay``: after a long overload the baseline was dragged up and would otherwise take ages to come back;
* application-limited hold: ``inflight < app_limited × target`` → hold (a job that is not using its window learns
  nothing about the server from growing it);
* ``gradient = clamp(min_gradient, 1, tolerance × long / short)``;
  ``new = target × gradient + max(queue_size, queue_fraction × target)``;
  ``next = (1 − smoothing) × target + smoothing × new``;
* throttled (``obs.client_throttled > 0``): ``next = throttle_factor × target``, and that poll's latency is not
  fed to the averages (fast rejections would drag the baseline down);
* no latency this poll (no call finished): hold.

Departures from Gradient2, and why: Gradient2 updates on every request; this runs once per poll (12 s), so its
growth term scales with the target (``queue_fraction``; Gradient2 adds a constant 4, which per poll would take
hours to reach hundreds) and the smoothing is per poll. With the defaults a steady latency grows the target
12.5 % a poll and the largest latency rise shrinks it 12.5 % a poll; it settles where latency is about
``tolerance / (1 − queue_fraction)`` times the baseline. Engine gauges are ignored entirely, so an observation
with zero gauges (no ``/metrics``) is fine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from model_concurrency.observation import Observation
from model_concurrency.policies._common import app_limited
from model_concurrency.policies.base import PolicyBase

__all__ = ["Gradient"]


@dataclass(slots=True)
class Gradient(PolicyBase):
    """Shrink as the short-term latency rises above the long-term baseline; grow while it does not.

    Parameters:
        tolerance: latency may rise to ``tolerance ×`` the baseline before the target shrinks (default 1.5).
        min_gradient: the largest cut per poll, as the lower clamp of the gradient (default 0.5, in (0, 1]).
        queue_size: smallest growth term (default 4, as Gradient2).
        queue_fraction: growth term as a fraction of the target (default 0.25, in [0, 1)).
        smoothing: weight of the new estimate per poll (default 0.5, in (0, 1]).
        long_window: polls in the long-term latency EWMA (default 20).
        short_window: polls in the short-term latency EWMA (default 1: the latest poll's mean).
        long_decay: baseline decay when ``long / short > 2`` (default 0.95, in (0, 1]).
        app_limited: hold while ``inflight < app_limited × target`` (default 0.5, as Gradient2).
        throttle_factor: multiplicative cut on a poll with 429/503 responses (default 0.8, in (0, 1)).
    """

    #: Works from this process's own latencies and 429/503s: a hosted endpoint has no /metrics page to scrape.
    uses_engine_signals: ClassVar[bool] = False

    tolerance: float = 1.5
    min_gradient: float = 0.5
    queue_size: float = 4.0
    queue_fraction: float = 0.25
    smoothing: float = 0.5
    long_window: float = 20.0
    short_window: float = 1.0
    long_decay: float = 0.95
    app_limited: float = 0.5
    throttle_factor: float = 0.8
    slow_start_factor: float = 2.0
    startup_exit: float = 1.15
    restart_below: float = 0.25
    long_latency: float | None = field(default=None, init=False)
    short_latency: float | None = field(default=None, init=False)
    ramping: bool = field(default=True, init=False)
    ramp_rate: float | None = field(default=None, init=False)
    level: float = field(default=0.0, init=False)
    last_time: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not self.tolerance >= 1:
            raise ValueError(f"tolerance must be >= 1, got {self.tolerance}")
        if not 0 < self.min_gradient <= 1:
            raise ValueError(f"min_gradient must be in (0, 1], got {self.min_gradient}")
        if not self.queue_size >= 0:
            raise ValueError(f"queue_size must be >= 0, got {self.queue_size}")
        if not 0 <= self.queue_fraction < 1:
            raise ValueError(f"queue_fraction must be in [0, 1), got {self.queue_fraction}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if not (self.long_window >= 1 and self.short_window >= 1):
            raise ValueError("long_window and short_window must be >= 1 poll")
        if not 0 < self.long_decay <= 1:
            raise ValueError(f"long_decay must be in (0, 1], got {self.long_decay}")
        if not 0 <= self.app_limited <= 1:
            raise ValueError(f"app_limited must be in [0, 1], got {self.app_limited}")
        if not 0 < self.throttle_factor < 1:
            raise ValueError(f"throttle_factor must be in (0, 1), got {self.throttle_factor}")
        if not self.slow_start_factor >= 1:
            raise ValueError(f"slow_start_factor must be >= 1, got {self.slow_start_factor}")
        if not self.startup_exit >= 1:
            raise ValueError(f"startup_exit must be >= 1, got {self.startup_exit}")
        if not 0 <= self.restart_below < 1:
            raise ValueError(f"restart_below must be in [0, 1), got {self.restart_below}")

    def _update_latency(self, latency: float) -> tuple[float, float]:
        if self.long_latency is None or self.short_latency is None:
            self.long_latency = self.short_latency = latency
            return latency, latency
        long = self.long_latency + 2 / (self.long_window + 1) * (latency - self.long_latency)
        short = self.short_latency + 2 / (self.short_window + 1) * (latency - self.short_latency)
        if long > 2 * short:
            long *= self.long_decay
        self.long_latency, self.short_latency = long, short
        return long, short

    def _rate(self, obs: Observation) -> float | None:
        """This process's completions per second since the previous poll (None on the first)."""
        before, self.last_time = self.last_time, obs.time
        if before is None or obs.time <= before:
            return None
        return obs.client_calls / (obs.time - before)

    def _ramp(self, target: float, rate: float | None) -> float | None:
        """Slow start: double while a doubling still buys ``startup_exit`` × the completion rate; None once done."""
        if not self.ramping:
            return None
        previous, self.ramp_rate = self.ramp_rate, rate
        if previous is not None and rate is not None and previous > 0 and rate < self.startup_exit * previous:
            self.ramping, self.ramp_rate = False, None
            return None
        return target * self.slow_start_factor

    def next_target(self, target: float, obs: Observation) -> float:
        rate = self._rate(obs)
        if obs.client_throttled > 0:
            self.ramping, self.ramp_rate = False, None
            return self.throttle_factor * target
        latency = obs.client_latency_mean_s
        if latency is None or not (math.isfinite(latency) and latency > 0):
            return target
        long, short = self._update_latency(latency)
        if app_limited(obs, target, self.app_limited):
            self.ramp_rate = None  # an application-limited poll says nothing about the last doubling
            return target
        if self.slow_start_factor > 1:
            if target < self.restart_below * self.level:  # dropped far below (a metrics outage's floor)
                self.ramping, self.level = True, 0.0
            ramped = self._ramp(target, rate)
            if ramped is not None:
                return ramped
        self.level = max(self.level, target)
        gradient = min(1.0, max(self.min_gradient, self.tolerance * long / short))
        estimate = target * gradient + max(self.queue_size, self.queue_fraction * target)
        return (1 - self.smoothing) * target + self.smoothing * estimate
