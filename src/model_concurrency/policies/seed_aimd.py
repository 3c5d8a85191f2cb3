"""Seed AIMD: the original controller's rules, exactly as published, kept to show their flaws.

Do not use it in production. It exists so the lab can measure the production policies against the design they
replace (docs/policies.md, ``../shared/reference/prior-art.md``). Its rules, with server-wide gauges:

* saturated (``waiting_capacity > 0``): ``max(max(floor, running), decrease_factor × target)``: "decrease toward
  ``max(floor, running)``, at least ``0.8 × target``". With ``running`` counted server-wide this *raises* the
  target to everybody's in-flight total when other clients share the engine (flaw 1: floor 4, running 100,
  waiting 5, target 4 → 100, again and again);
* near-full (``running ≥ near_full × target``, no capacity-waiting): ``target + max(1, 25 % × target)``: the
  "additive" increase is multiplicative (flaw 3: 4 → 512 in 22 polls), and near-full is judged from the
  server-wide ``running``, so one client grows on another's load;
* otherwise hold.

Its fourth rule, the reset to the floor on one failed poll (flaw 2), is not a policy decision here: the controller
never calls a policy for a failed poll. The class therefore carries ``grace_polls = 0``, which a controller or the
lab honours to reproduce the original fail-safe (the production default holds the target for 3 failed polls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from model_concurrency.observation import Observation
from model_concurrency.policies.base import require_fractions

__all__ = ["SeedAIMD"]


@dataclass(slots=True)
class SeedAIMD:
    """The original AIMD rules. ``floor`` is its own copy of the static capacity, part of the flawed decrease.

    Parameters:
        floor: the static capacity the original decrease went "toward" (default 1).
        increase_fraction: growth as a fraction of the target (original: 0.25).
        increase_min: smallest growth step (original: 1).
        decrease_factor: the "at least" factor of the decrease (original: 0.8).
        near_full: grow when server-wide ``running ≥ near_full × target`` (original: 0.8).
    """

    floor: float = 1.0
    increase_fraction: float = 0.25
    increase_min: float = 1.0
    decrease_factor: float = 0.8
    near_full: float = 0.8

    #: The original reset a fully ramped target to the floor on the first failed poll: no grace.
    grace_polls: ClassVar[int] = 0

    def __post_init__(self) -> None:
        if not self.floor >= 0:
            raise ValueError(f"floor must be >= 0, got {self.floor}")
        require_fractions(self, "decrease_factor")
        if not (self.increase_fraction >= 0 and self.increase_min >= 0):
            raise ValueError("increase_fraction and increase_min must be >= 0")
        if not 0 <= self.near_full <= 1:
            raise ValueError(f"near_full must be in [0, 1], got {self.near_full}")

    def next_target(self, target: float, obs: Observation) -> float:
        if obs.waiting_capacity > 0:
            # The flaw, kept on purpose: server-wide running can be far above this process's own share.
            return max(max(self.floor, obs.running), self.decrease_factor * target)
        if obs.running >= self.near_full * target:
            return target + max(self.increase_min, self.increase_fraction * target)
        return target
