"""The policy interface: one pure function from (target, Observation) to the next target.

A policy does no I/O and reads time only from ``obs.time``, so the same object runs live, in threads and in the
simulator. It needs no floor or ceiling: the controller clamps whatever it returns to ``[floor, ceiling]`` and
treats a non-finite answer as "hold". It is never called for a failed poll; the controller's grace rule owns
those.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from model_concurrency.observation import Observation

__all__ = ["Policy"]


@runtime_checkable
class Policy(Protocol):
    """Anything with ``next_target``; plug-in authors implement this and nothing else."""

    def next_target(self, target: float, obs: Observation) -> float: ...
