"""Capacity: model-based, in the spirit of TCP BBR: estimate the engine's capacity, target our share of it.

AIMD finds the engine's capacity by walking into it, 25 % a poll, and forgets it at every cut. BBR instead keeps
a model of the bottleneck (a windowed maximum of the delivery rate) and paces to it, probing above it now and
then. The engine equivalent of the delivery rate is how many requests it runs at once when it has more than it
can run: server-wide ``running`` on a poll with capacity-waiting is the engine's concurrency capacity at that
moment (``max_num_seqs`` or the KV cache, whichever binds). An unsaturated engine reveals nothing about its
capacity except that it is above the current load, so the policy must overrun it to see it, like BBR's STARTUP.

Estimate ``C``: the maximum of ``running`` over the last ``window_polls`` saturated polls no older than
``window_s`` seconds (the window forgets a capacity that went away); with no such poll, and a
``tokens_per_request`` hint, the KV-cache bound ``kv_num_blocks × block_size / tokens_per_request``; else none.
Own share ``s = inflight / (running + waiting)`` (1 when alone). The state machine, per poll:

* any state, saturated (``waiting_capacity > 0``): record ``running`` as a capacity sample and cut to what the
  engine serves us, ``min(target, drain_factor × inflight × running / (running + waiting))`` (never a raise);
  if the previous poll had jumped to the estimate (RETURN), the estimate was stale (capacity fell): samples
  above the current ``running`` are dropped first. → CRUISE.
* any state, application-limited (``inflight < near_full × target``): hold; the state is kept.
* no estimate (STARTUP): ``target × startup_gain`` (double) per near-full poll until the first saturation.
* ``target < s × C`` (below our share of the known capacity, e.g. after a cut or when another client left):
  jump to ``s × C`` at once. → RETURN.
* PROBE (the previous poll grew above the estimate and the engine absorbed it: capacity is larger than known,
  e.g. a GPU was added): ``target × startup_gain`` again, until a saturated poll measures the new capacity.
* CRUISE/RETURN at the estimate: hold; every ``probe_interval``-th such poll probe ``target × probe_gain``.
  → PROBE.

So after a GPU is added the target reaches the new capacity one poll after the engine is seen saturated at the
new level; reaching that level takes a probe and a doubling or two. After a GPU is removed the first saturated
poll cuts to the served share, one stale jump back to the old estimate drops it, and the estimate follows.
Every growth step is at least ``increase_min``. Open question for the study: the share jumps preserve the
current split between clients, so unlike AIMD nothing drives unequal clients towards equal shares except the
probes and cuts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from model_concurrency.observation import Observation
from model_concurrency.policies._common import app_limited, own_share, sustainable

__all__ = ["Capacity"]

Mode = Literal["startup", "cruise", "return", "probe"]


@dataclass(slots=True)
class Capacity:
    """Target this process's share of the engine's estimated concurrency capacity; probe now and then.

    Parameters:
        startup_gain: growth factor per near-full poll with no estimate, and after an absorbed probe (default 2).
        probe_gain: growth factor of a probe above the estimate (default 1.25, > 1).
        probe_interval: polls at the estimate between probes (default 3, >= 1).
        window_polls: saturated polls kept as capacity samples (default 10, >= 1).
        window_s: seconds a capacity sample is kept (default 600).
        drain_factor: a saturated poll cuts to ``drain_factor ×`` the served share (default 1, in (0, 1]).
        near_full: grow only when ``inflight ≥ near_full × target`` (default 0.8).
        increase_min: smallest growth step (default 1).
        tokens_per_request: optional hint (prompt + output tokens of a typical request) for a KV-cache capacity
            estimate before the first saturation (default None: no KV estimate).
        block_size: tokens per KV-cache block (default 16, vLLM's default).
    """

    startup_gain: float = 2.0
    probe_gain: float = 1.25
    probe_interval: int = 3
    window_polls: int = 10
    window_s: float = 600.0
    drain_factor: float = 1.0
    near_full: float = 0.8
    increase_min: float = 1.0
    tokens_per_request: float | None = None
    block_size: int = 16
    mode: Mode = field(default="startup", init=False)
    polls_at_estimate: int = field(default=0, init=False)
    samples: deque[tuple[float, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.startup_gain > 1:
            raise ValueError(f"startup_gain must be > 1, got {self.startup_gain}")
        if not self.probe_gain > 1:
            raise ValueError(f"probe_gain must be > 1, got {self.probe_gain}")
        if not (isinstance(self.probe_interval, int) and self.probe_interval >= 1):
            raise ValueError(f"probe_interval must be an int >= 1, got {self.probe_interval!r}")
        if not (isinstance(self.window_polls, int) and self.window_polls >= 1):
            raise ValueError(f"window_polls must be an int >= 1, got {self.window_polls!r}")
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")
        if not 0 < self.drain_factor <= 1:
            raise ValueError(f"drain_factor must be in (0, 1], got {self.drain_factor}")
        if not 0 <= self.near_full <= 1:
            raise ValueError(f"near_full must be in [0, 1], got {self.near_full}")
        if not self.increase_min >= 0:
            raise ValueError(f"increase_min must be >= 0, got {self.increase_min}")
        if self.tokens_per_request is not None and not (
            math.isfinite(self.tokens_per_request) and self.tokens_per_request > 0
        ):
            raise ValueError(f"tokens_per_request must be > 0 or None, got {self.tokens_per_request}")
        if not (isinstance(self.block_size, int) and self.block_size >= 1):
            raise ValueError(f"block_size must be an int >= 1, got {self.block_size!r}")
        self.samples = deque(maxlen=self.window_polls)

    def estimate(self, obs: Observation) -> float | None:
        """The engine's concurrency capacity as last seen, or None before any evidence."""
        while self.samples and obs.time - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        if self.samples:
            return max(running for _, running in self.samples)
        if self.tokens_per_request is not None and obs.kv_num_blocks:
            return obs.kv_num_blocks * self.block_size / self.tokens_per_request
        return None

    def _grow(self, target: float, gain: float) -> float:
        return max(target * gain, target + self.increase_min)

    def next_target(self, target: float, obs: Observation) -> float:
        if obs.waiting_capacity > 0:
            if self.mode == "return":
                # We jumped to the estimate and the engine could not take it: that capacity is gone.
                kept = [(t, r) for t, r in self.samples if r <= obs.running]
                self.samples.clear()
                self.samples.extend(kept)
            self.samples.append((obs.time, obs.running))
            self.mode, self.polls_at_estimate = "cruise", 0
            served = sustainable(obs)
            if served is None:  # none of the queue is ours
                return target
            return min(target, self.drain_factor * served)
        if app_limited(obs, target, self.near_full):
            return target
        capacity = self.estimate(obs)
        if capacity is None:
            self.mode = "startup"
            return self._grow(target, self.startup_gain)
        goal = own_share(obs) * capacity
        if target < goal:
            self.mode, self.polls_at_estimate = "return", 0
            return goal
        if self.mode == "probe":
            # The last growth went above the estimate and nothing queued: the engine has more room than we know.
            self.mode = "probe"
            return self._grow(target, self.startup_gain)
        self.polls_at_estimate += 1
        if self.polls_at_estimate >= self.probe_interval:
            self.mode, self.polls_at_estimate = "probe", 0
            return self._grow(target, self.probe_gain)
        self.mode = "cruise"
        return target
