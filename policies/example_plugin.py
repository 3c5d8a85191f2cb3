"""An example policy plug-in: AIMD with hysteresis and a KV-cache cap. Copy this file to write your own.

A policy is any object with ``next_target(target: float, obs: Observation) -> float``. The rules of the game
(docs/policies.md):

* no I/O, no clock: time is ``obs.time``; the same object runs live, in threads and in the simulator;
* no bounds: the controller clamps the answer to ``[floor, ceiling]`` and treats NaN/inf (or an exception) as
  "hold", so a bug here cannot take a fan-out down, but it can make it useless;
* never called for a failed poll: the controller's grace rule owns those;
* one instance per controller (the loader builds a new one per call), so keeping state on ``self`` is fine;
* constructor parameters are what a preset's TOML keys set; validate them in ``__post_init__`` and raise
  ``ValueError``, which the loader reports with the preset's name.

Load it in any of these ways:

* ``MODEL_CONCURRENCY_POLICY=hysteresis`` (the preset ``policies/hysteresis.toml`` says
  ``policy = "example_plugin.py:Hysteresis"``; a ``.py`` path in a preset is relative to the preset's folder);
* ``--policy policies/hysteresis.toml`` or ``--policy policies/example_plugin.py:Hysteresis``;
* from your own package: ``policy = "mypackage.policies:Hysteresis"``, or an entry point in the group
  ``model_concurrency.policies`` in your ``pyproject.toml``::

      [project.entry-points."model_concurrency.policies"]
      hysteresis = "mypackage.policies:Hysteresis"

What this one does: the production AIMD reacts to a single poll. This variant changes the target only when the
signal persists (``up_polls`` healthy near-full polls in a row to grow, ``down_polls`` saturated polls in a row
to cut), which trades reaction time for fewer oscillations on a noisy engine, and it never grows while the
engine's KV cache is above ``kv_cap`` (the preemption zone), the signal AIMD itself ignores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model_concurrency import AIMD, Observation

__all__ = ["Hysteresis"]


@dataclass(slots=True)
class Hysteresis:
    """AIMD steps taken only on a persistent signal; no growth above ``kv_cap`` KV-cache usage.

    Parameters:
        up_polls: healthy near-full polls in a row before one growth step (default 2, >= 1).
        down_polls: saturated polls in a row before one cut (default 1, >= 1).
        kv_cap: no growth while ``kv_cache_usage >= kv_cap`` (default 0.9, in (0, 1]; ignored without the gauge).
        increase_fraction, increase_min, decrease_factor, near_full: the AIMD step, as in ``AIMD``.
    """

    up_polls: int = 2
    down_polls: int = 1
    kv_cap: float = 0.9
    increase_fraction: float = 0.25
    increase_min: float = 1.0
    decrease_factor: float = 0.8
    near_full: float = 0.8
    up_count: int = field(default=0, init=False)
    down_count: int = field(default=0, init=False)
    _aimd: AIMD = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.up_polls, int) and isinstance(self.down_polls, int)):
            raise ValueError("up_polls and down_polls must be integers")
        if self.up_polls < 1 or self.down_polls < 1:
            raise ValueError("up_polls and down_polls must be >= 1")
        if not 0 < self.kv_cap <= 1:
            raise ValueError(f"kv_cap must be in (0, 1], got {self.kv_cap}")
        # AIMD validates the step parameters itself.
        self._aimd = AIMD(
            increase_fraction=self.increase_fraction,
            increase_min=self.increase_min,
            decrease_factor=self.decrease_factor,
            near_full=self.near_full,
        )

    def next_target(self, target: float, obs: Observation) -> float:
        if obs.waiting_capacity > 0:
            self.up_count, self.down_count = 0, self.down_count + 1
            if self.down_count < self.down_polls:
                return target
            self.down_count = 0
            return self._aimd.next_target(target, obs)
        self.down_count = 0
        kv_full = obs.kv_cache_usage is not None and obs.kv_cache_usage >= self.kv_cap
        if kv_full or obs.inflight < self.near_full * target:
            self.up_count = 0
            return target
        self.up_count += 1
        if self.up_count < self.up_polls:
            return target
        self.up_count = 0
        return self._aimd.next_target(target, obs)
