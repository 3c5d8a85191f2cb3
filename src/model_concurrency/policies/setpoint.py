"""Setpoint: a PI controller that holds KV-cache usage (or mean queue time) at a setpoint.

AIMD only learns the engine's capacity by overrunning it (capacity-waiting is its only signal). The engine also
reports how close it is: the fraction of KV-cache blocks in use, and how long admitted requests queued. Gateways
treat KV usage 0.8 as saturated; a controller that holds usage just there keeps the batch as large as memory
allows without queueing or preempting. A proportional-integral loop does that without a steady-state error.

The loop runs in log space, because the engine's response is multiplicative (KV usage is proportional to the
number of requests running) and the gains should not depend on the engine's size:

* error ``e = clamp((setpoint − measured) / setpoint, −1, 1)``: positive means headroom;
* integral ``I ← I + ki × e × dt``, with ``dt`` from ``obs.time`` (capped at ``max_dt_s``, so a long gap between
  polls is not one huge step);
* output ``next = exp(I + kp × e)``.

Anti-windup, three ways, each for a reason:

1. tracking (back-calculation): when the target handed in is not what this policy last answered (the controller
   clamped it to the floor or ceiling, a grace drop, or the first poll), the integral is reset to
   ``log(target) − kp × e_previous``, so the integral always describes the target actually applied and never
   winds up against a bound it cannot see;
2. conditional integration: headroom (``e > 0``) is not integrated while the process is application-limited
   (``inflight < near_full × target``): an engine with room because we do not use our window says nothing about
   how large the window may be. The target holds, and the integral tracks it;
3. clamping: ``I`` stays in ``[0, log(integral_limit)]``.

A poll without the signal (no KV gauge, no queue-time histogram delta) holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from model_concurrency.observation import Observation
from model_concurrency.policies._common import app_limited

__all__ = ["Setpoint"]

Signal = Literal["kv_cache_usage", "queue_time"]


@dataclass(slots=True)
class Setpoint:
    """PI control of ``kv_cache_usage`` (or ``queue_time_mean_s``) toward ``setpoint``, in log space.

    Parameters:
        signal: ``"kv_cache_usage"`` (default; a fraction in [0, 1]) or ``"queue_time"`` (mean seconds queued
            per request since the previous poll).
        setpoint: the value to hold (default 0.8, a fraction for KV usage, seconds for queue time; > 0).
        kp: proportional gain, log-target per unit error (default 0.5).
        ki: integral gain, log-target per unit error per second (default 0.05: 0.6 per 12 s poll).
        integral_limit: the integral never stands for more than this many calls (default 4096, >= 1).
        max_dt_s: the longest interval integrated in one poll (default 60 s).
        near_full: headroom is integrated only while ``inflight ≥ near_full × target`` (default 0.8).
    """

    signal: Signal = "kv_cache_usage"
    setpoint: float = 0.8
    kp: float = 0.5
    ki: float = 0.05
    integral_limit: float = 4096.0
    max_dt_s: float = 60.0
    near_full: float = 0.8
    integral: float = field(default=0.0, init=False)
    last_error: float = field(default=0.0, init=False)
    last_output: float | None = field(default=None, init=False)
    last_time: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.signal not in ("kv_cache_usage", "queue_time"):
            raise ValueError(f"signal must be 'kv_cache_usage' or 'queue_time', got {self.signal!r}")
        if not (math.isfinite(self.setpoint) and self.setpoint > 0):
            raise ValueError(f"setpoint must be > 0, got {self.setpoint}")
        if self.signal == "kv_cache_usage" and self.setpoint > 1:
            raise ValueError(f"a KV-usage setpoint is a fraction in (0, 1], got {self.setpoint}")
        if not (self.kp >= 0 and self.ki >= 0):
            raise ValueError("kp and ki must be >= 0")
        if not (math.isfinite(self.integral_limit) and self.integral_limit >= 1):
            raise ValueError(f"integral_limit must be a finite number >= 1, got {self.integral_limit}")
        if not self.max_dt_s >= 0:
            raise ValueError(f"max_dt_s must be >= 0, got {self.max_dt_s}")
        if not 0 <= self.near_full <= 1:
            raise ValueError(f"near_full must be in [0, 1], got {self.near_full}")

    def _measure(self, obs: Observation) -> float | None:
        value = obs.kv_cache_usage if self.signal == "kv_cache_usage" else obs.queue_time_mean_s
        if value is None or not math.isfinite(value):
            return None
        return value

    def _clamp_integral(self, value: float) -> float:
        return min(max(value, 0.0), math.log(self.integral_limit))

    def next_target(self, target: float, obs: Observation) -> float:
        dt = 0.0 if self.last_time is None else min(max(obs.time - self.last_time, 0.0), self.max_dt_s)
        self.last_time = obs.time
        safe_target = max(target, 1.0)
        if self.last_output is None or not math.isclose(target, self.last_output, rel_tol=1e-9):
            # Tracking anti-windup: start from the target actually applied, whoever set it.
            self.integral = self._clamp_integral(math.log(safe_target) - self.kp * self.last_error)
        measured = self._measure(obs)
        if measured is None:
            self.last_output = target
            return target
        error = min(1.0, max(-1.0, (self.setpoint - measured) / self.setpoint))
        self.last_error = error
        if error > 0 and app_limited(obs, target, self.near_full):
            # Conditional integration: headroom we are not using is no reason to grow. Hold, and track.
            self.integral = self._clamp_integral(math.log(safe_target) - self.kp * error)
            self.last_output = target
            return target
        self.integral = self._clamp_integral(self.integral + self.ki * error * dt)
        output = math.exp(self.integral + self.kp * error)
        self.last_output = output
        return output
