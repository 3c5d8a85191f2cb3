"""The direct peers as policies beside ours: four batch dispatchers that size their fan-out, from their rules.

Each is written here from the rule its project publishes (docs/policies.md, "The direct peers", names the
sources); none of their code is copied. They run on the same Observation as every policy, one poll at a time, so
a rule stated per completion is applied to the poll's completions in order-free form (what the poll's counts
allow). Where a peer reads a per-response figure this package does not observe, the nearest interval figure
stands in, and the class says which:

* :class:`AIBrix` (``aibrix``): AIBrix's batch client: grow after every 8 healthy completions (by a quarter of
  the limit while probing, by one after the first cut), judge a window of ``max(8, limit)`` completions: ×0.9
  on overload errors (≥ 2 and ≥ 10 %), ×0.8 on a slow window (latency above 1.75× its EWMA); cap 1,024.
* :class:`LlmdAIMD` (``llmd-aimd``): llm-d-async's AIMD gate: slow start, then ``+1/w`` per accepted request;
  a capacity rejection (429/503) halves the window at most once per flight; min 1, max 256.
* :class:`BatchGatewayAIMD` (``batch-gateway-aimd``): llm-d-batch-gateway: start 20, ×0.5 on a 429 or 5xx,
  +1 after a full window (``limit``) of clean successes; within [5, 100].
* :class:`QueueTimeAIMD` (``queue-time-aimd``): Fireworks' cookbook: AIMD on a prefill-queue-time target.

Only ``queue-time-aimd`` reads the engine (its queue-time histogram); the other three see only their own calls,
as they do in their projects, so they are declared ``uses_engine_signals = False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from model_concurrency.observation import Observation
from model_concurrency.policies.base import PolicyBase, require_fractions

__all__ = ["AIBrix", "BatchGatewayAIMD", "LlmdAIMD", "QueueTimeAIMD"]


def _overload_errors(obs: Observation) -> int:
    """Refusals (429/503) and server failures (408, 5xx, dropped connections): what the peers call errors."""
    return obs.client_throttled + obs.client_server_errors


def _successes(obs: Observation) -> int:
    return max(0, obs.client_calls - obs.client_errors)


@dataclass(slots=True)
class AIBrix(PolicyBase):
    """AIBrix's batch client (``LLMAdaptiveConcurrencyController``): windowed AIMD on errors and slow completions.

    Per-completion rules, applied to a poll's counts: every ``healthy_streak`` completions without an overload
    error grow the limit once (``max(1, probe_fraction × limit)`` while probing, ``+1`` after the first cut); an
    overload error resets the streak. Completions accumulate into a window of ``max(window_min, limit)``; a full
    window is judged once: ≥ ``error_min`` errors making ≥ ``error_rate`` of it → ×``error_decrease``; else a
    mean latency above ``slow_factor`` × its EWMA → ×``slow_decrease``. AIBrix judges TTFT and TPOT against
    targets the operator sets, and against their EWMA; without per-token timings of our calls (nor targets) the
    window's mean latency of successful calls against its own EWMA stands in.
    """

    uses_engine_signals: ClassVar[bool] = False

    healthy_streak: int = 8
    probe_fraction: float = 0.25
    window_min: int = 8
    error_min: int = 2
    error_rate: float = 0.10
    error_decrease: float = 0.9
    slow_factor: float = 1.75
    slow_decrease: float = 0.8
    ewma_alpha: float = 0.2
    cap: float = 1024.0
    probing: bool = field(default=True, init=False)
    _streak: int = field(default=0, init=False, repr=False)
    _window_calls: int = field(default=0, init=False, repr=False)
    _window_errors: int = field(default=0, init=False, repr=False)
    _window_ok: int = field(default=0, init=False, repr=False)
    _window_latency: float = field(default=0.0, init=False, repr=False)
    _ewma: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.healthy_streak < 1 or self.window_min < 1:
            raise ValueError("healthy_streak and window_min must be >= 1")
        for name in ("error_decrease", "slow_decrease", "ewma_alpha"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")

    def next_target(self, target: float, obs: Observation) -> float:
        limit = float(target)
        errors, ok = _overload_errors(obs), _successes(obs)
        if errors:
            self._streak = 0
        else:
            self._streak += ok
            while self._streak >= self.healthy_streak and limit < self.cap:
                self._streak -= self.healthy_streak
                limit += max(1.0, math.floor(self.probe_fraction * limit)) if self.probing else 1.0
            limit = min(limit, self.cap)
        self._window_calls += ok + errors
        self._window_errors += errors
        self._window_ok += ok
        if ok and obs.client_ok_latency_mean_s is not None:
            self._window_latency += ok * obs.client_ok_latency_mean_s
        if self._window_calls >= max(self.window_min, target):
            limit = self._judge(limit)
        return limit

    def _judge(self, limit: float) -> float:
        """One full window: at most one cut, then a fresh window."""
        calls, errors = self._window_calls, self._window_errors
        mean = self._window_latency / self._window_ok if self._window_ok and self._window_latency > 0 else None
        if errors >= self.error_min and errors >= self.error_rate * calls:
            limit *= self.error_decrease
            self.probing = False
        elif mean is not None and self._ewma is not None and mean > self.slow_factor * self._ewma:
            limit *= self.slow_decrease
            self.probing = False
        if mean is not None:
            self._ewma = mean if self._ewma is None else self.ewma_alpha * mean + (1 - self.ewma_alpha) * self._ewma
        self._window_calls = self._window_errors = self._window_ok = 0
        self._window_latency = 0.0
        return limit


@dataclass(slots=True)
class LlmdAIMD(PolicyBase):
    """llm-d-async's AIMD gate (``docs/aimd-gate.md``): slow start, ``+1/w`` per accepted request, halve on a
    capacity rejection at most once per flight.

    Slow start adds one per accepted request (the window doubles per round trip) until the first cut sets the
    threshold; after it each accepted request adds ``1/w``. A capacity rejection (429/503) halves the window,
    and rejections of requests sent before that cut are ignored: here, until one window's worth of calls
    (``w`` at the cut) has finished since it. Evictions change nothing; ``Retry-After`` closes admissions (the
    gate's own hold does that). The optional queue-duration target is off by default, as published, and not
    built here: the gate's queue is the router's, which this package does not observe.
    """

    uses_engine_signals: ClassVar[bool] = False

    decrease: float = 0.5
    min_window: float = 1.0
    max_window: float = 256.0
    threshold: float = field(default=math.inf, init=False)
    _flight_left: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        require_fractions(self, "decrease")
        if not 1 <= self.min_window <= self.max_window:
            raise ValueError("need 1 <= min_window <= max_window")

    def next_target(self, target: float, obs: Observation) -> float:
        window = float(target)
        finished = obs.client_calls
        in_flight_of_cut = self._flight_left > 0
        self._flight_left = max(0.0, self._flight_left - finished)
        if obs.client_throttled and not in_flight_of_cut:
            window = max(self.min_window, window * self.decrease)
            self.threshold = window
            self._flight_left = window
            return window
        accepted = _successes(obs)
        if window < self.threshold:  # slow start, up to the threshold the last cut set (none before the first)
            window = min(window + accepted, self.threshold)
        else:
            window += accepted / window
        return min(self.max_window, max(self.min_window, window))


@dataclass(slots=True)
class _Credit:
    """What batch-gateway's and Fireworks' AIMDs share: the first poll jumps to the policy's start, and after it
    each window's worth of successes (the window = the limit) earns ``+increase``. The run of successes is carried
    from poll to poll and is this object's alone to keep."""

    started: bool = False
    earned: float = 0.0  # successes toward the next +increase

    def begin(self, start: float, target: float) -> float:
        """The first poll's ``start``; later polls go on from the target."""
        if self.started:
            return float(target)
        self.started = True
        return start

    def spend(self, window: float, successes: int, increase: float, cap: float = math.inf) -> float:
        """The window after this poll's successes, below ``cap``; what is left over waits for the next poll."""
        self.earned += successes
        while self.earned >= window and window < cap:
            self.earned -= window
            window += increase
        return window


@dataclass(slots=True)
class BatchGatewayAIMD(PolicyBase):
    """llm-d-batch-gateway's AIMD (PR #394): start at 20, ×0.5 on a 429 or 5xx, +1 per full window of clean
    successes (window = the limit), within [5, 100].

    Each rejection in a poll halves the limit (the rule is per response); a poll with a rejection also resets the
    run of clean successes, which must reach the limit again before the next +1.
    """

    uses_engine_signals: ClassVar[bool] = False

    start: float = 20.0
    minimum: float = 5.0
    maximum: float = 100.0
    decrease: float = 0.5
    increase: float = 1.0
    _credit: _Credit = field(default_factory=_Credit, init=False, repr=False)

    def __post_init__(self) -> None:
        require_fractions(self, "decrease")
        if not 1 <= self.minimum <= self.start <= self.maximum:
            raise ValueError("need 1 <= minimum <= start <= maximum")

    def next_target(self, target: float, obs: Observation) -> float:
        limit = self._credit.begin(self.start, target)
        rejections = _overload_errors(obs)
        if rejections:
            self._credit.earned = 0.0
            return max(self.minimum, limit * self.decrease**rejections)
        limit = self._credit.spend(limit, _successes(obs), self.increase, self.maximum)
        if limit >= self.maximum:  # at the cap a clean run earns nothing to spend later
            self._credit.earned = 0.0
        return min(self.maximum, max(self.minimum, limit))


@dataclass(slots=True)
class QueueTimeAIMD(PolicyBase):
    """Fireworks' cookbook (PR #251): AIMD on the prefill queue time the server reports per response.

    Fireworks reads ``prefill_queue_duration`` from each streamed response; here the engine's queue-time histogram
    over the poll interval (``queue_time_mean_s``) stands in. Above ``target_s`` the window is cut by
    ``decrease`` (once per poll); at or below it each window's worth of completions adds ``increase``. Published:
    a window of 32 at the start, and a queue held at 0.08–0.25 s; the target, the step and the cut are not
    published, so ``target_s`` 0.5 s, +1 per window and ×0.75 are this package's choices.
    """

    start: float = 32.0
    target_s: float = 0.5
    increase: float = 1.0
    decrease: float = 0.75
    _credit: _Credit = field(default_factory=_Credit, init=False, repr=False)

    def __post_init__(self) -> None:
        require_fractions(self, "decrease")
        if self.target_s <= 0 or self.start < 1:
            raise ValueError("target_s must be > 0 and start >= 1")

    def next_target(self, target: float, obs: Observation) -> float:
        window = self._credit.begin(self.start, target)
        queue = obs.queue_time_mean_s
        if queue is not None and queue > self.target_s:
            self._credit.earned = 0.0
            return window * self.decrease
        return self._credit.spend(window, _successes(obs), self.increase)
