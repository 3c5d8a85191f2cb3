"""Static: the floor, always. The baseline every adaptive policy must beat, and the original behaviour."""

from __future__ import annotations

from dataclasses import dataclass

from model_concurrency.observation import Observation

__all__ = ["Static"]


@dataclass(slots=True)
class Static:
    """Answers 0, which the controller clamps to the floor: the static configuration."""

    def next_target(self, target: float, obs: Observation) -> float:
        return 0.0
