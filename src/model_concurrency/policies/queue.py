"""Queue: Vegas-style, keep the engine's capacity-waiting queue near a small setpoint.

TCP Vegas (and Netflix's ``VegasLimit``) estimates how many of its packets sit in queues and keeps that number
between α and β: grow below α, shrink above β, hold in between. An engine tells us its queue directly: the
capacity-waiting gauge counts requests the scheduler could not admit. A small standing queue keeps the engine's
batch full (throughput) without the unbounded waiting of a saturated engine (latency). So, per poll:

* ``waiting_capacity ≤ alpha`` and near-full (``inflight ≥ near_full × target``): grow by
  ``max(increase_min, increase_fraction × target)``;
* ``waiting_capacity > beta``: shrink by this process's share of the excess over α:
  ``target − max(decrease_min, share × (waiting_capacity − alpha))``, never below ``min_factor × target``, where
  ``share = inflight / (running + waiting)`` (our calls queue like everyone else's, so we own that fraction of the
  queue and remove only that part of it; every client doing so drains the excess in one poll);
* otherwise hold (the band between α and β, and the application-limited hold).

Unlike AIMD, it does not treat every waiting request as congestion: with ``alpha = 0`` it grows only when nothing
waits, and it cuts only a queue longer than ``beta``, in proportion to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_concurrency.observation import Observation
from model_concurrency.policies._common import app_limited, own_share

__all__ = ["QueuePolicy"]


@dataclass(slots=True)
class QueuePolicy:
    """Grow while at most ``alpha`` requests wait for capacity, shrink when more than ``beta`` wait.

    Parameters:
        alpha: the queue length (server-wide capacity-waiting) at or below which to grow (default 0).
        beta: the queue length above which to shrink (default 4; must be >= alpha).
        increase_fraction: growth as a fraction of the target (default 0.25).
        increase_min: smallest growth step (default 1).
        decrease_min: smallest shrink step (default 1).
        min_factor: one poll never shrinks below ``min_factor × target`` (default 0.5, in (0, 1]).
        near_full: grow only when ``inflight ≥ near_full × target`` (default 0.8).
    """

    alpha: float = 0.0
    beta: float = 4.0
    increase_fraction: float = 0.25
    increase_min: float = 1.0
    decrease_min: float = 1.0
    min_factor: float = 0.5
    near_full: float = 0.8

    def __post_init__(self) -> None:
        if not 0 <= self.alpha <= self.beta:
            raise ValueError(f"need 0 <= alpha <= beta, got alpha={self.alpha}, beta={self.beta}")
        if not (self.increase_fraction >= 0 and self.increase_min >= 0 and self.decrease_min >= 0):
            raise ValueError("increase_fraction, increase_min and decrease_min must be >= 0")
        if not 0 < self.min_factor <= 1:
            raise ValueError(f"min_factor must be in (0, 1], got {self.min_factor}")
        if not 0 <= self.near_full <= 1:
            raise ValueError(f"near_full must be in [0, 1], got {self.near_full}")

    def next_target(self, target: float, obs: Observation) -> float:
        queue = obs.waiting_capacity
        if queue > self.beta:
            step = max(self.decrease_min, own_share(obs) * (queue - self.alpha))
            return max(target - step, self.min_factor * target)
        if queue <= self.alpha and not app_limited(obs, target, self.near_full):
            return target + max(self.increase_min, self.increase_fraction * target)
        return target
