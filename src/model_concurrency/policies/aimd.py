"""AIMD: additive increase, multiplicative decrease on capacity-waiting (a baseline; the default is ``adaptive``).

Additive-increase/multiplicative-decrease converges to an efficient and fair share when every client sees the
same binary congestion signal (Chiu & Jain, 1989). Here the signal is vLLM's capacity-waiting gauge: requests
held back because the engine is at ``max_num_seqs`` or out of KV blocks. Two departures from the original
controller (see docs/architecture.md):

* the decrease never raises the target: it goes to ``min(decrease x target, sustainable)``, where
  ``sustainable`` estimates the share of the engine this process is actually being served, from its own
  in-flight count and the engine's running/waiting split. The original went *towards* the server-wide
  ``running``, which with several clients meant "decrease" to everybody's total.
* growth needs this process to be using its target (``inflight >= near_full x target``): a job that is not
  sending enough work to fill its window learns nothing about the engine by growing it (application-limited
  hold, as in Gradient2 and TCP's cwnd validation).

The increase step is ``max(increase_min, increase_fraction x target)``: proportional, so 4 → 512 takes 22 polls.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_concurrency.observation import Observation
from model_concurrency.policies._common import app_limited, sustainable
from model_concurrency.policies.base import PolicyBase, require_fractions

__all__ = ["AIMD"]


@dataclass(slots=True)
class AIMD(PolicyBase):
    """Grow by ``max(increase_min, increase_fraction x target)`` when near-full and healthy; cut on saturation."""

    increase_fraction: float = 0.25
    increase_min: float = 1.0
    decrease_factor: float = 0.8
    near_full: float = 0.8

    def __post_init__(self) -> None:
        require_fractions(self, "decrease_factor")
        if self.increase_fraction < 0 or self.increase_min < 0:
            raise ValueError("increase_fraction and increase_min must be >= 0")
        if not 0 <= self.near_full <= 1:
            raise ValueError(f"near_full must be in [0, 1], got {self.near_full}")

    def next_target(self, target: float, obs: Observation) -> float:
        if obs.waiting_capacity > 0:
            decreased = self.decrease_factor * target
            # Our calls are spread over running and waiting like everyone else's: the running fraction of our
            # in-flight calls is what the engine is sustaining for us right now.
            served = sustainable(obs)
            return decreased if served is None else min(decreased, served)
        if not app_limited(obs, target, self.near_full):
            return target + max(self.increase_min, self.increase_fraction * target)
        return target
