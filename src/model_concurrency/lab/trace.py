"""What a simulated run leaves behind: sampled time series (numpy arrays) and per-request figures.

The runner samples every ``trace_dt_s`` simulated seconds; per-request arrays hold only the fan-out clients'
requests (background traffic is the environment, not the thing judged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["ClientTrace", "Trace"]

Array = npt.NDArray[np.float64]


@dataclass(slots=True)
class ClientTrace:
    """One fan-out client's view, sampled on the trace's time grid."""

    target: Array
    inflight: Array
    completions: Array  # cumulative items completed
    errors: Array  # cumulative items that failed (and were retried)
    throttled: Array = field(default_factory=lambda: np.zeros(0))  # cumulative calls refused 429 (and retried)
    poll_times: Array = field(default_factory=lambda: np.zeros(0))
    poll_targets: Array = field(default_factory=lambda: np.zeros(0))


@dataclass(slots=True)
class Trace:
    time: Array
    running: Array
    waiting_capacity: Array
    kv_usage: Array
    preemptions: Array  # cumulative, fleet-wide
    clients: list[ClientTrace]
    queue_times: Array  # engine queue time of each completed client request
    latencies: Array  # end-to-end latency of each completed client request
    finish_times: Array
    duration_s: float
    capacity_changes: list[float] = field(default_factory=list)
    limit_rps: float | None = None  # the scenario's rate limit in items per second (None: no limit)

    @property
    def total_completions(self) -> float:
        return float(sum(c.completions[-1] for c in self.clients)) if len(self.time) else 0.0

    def throughput(self, window_s: float = 30.0) -> Array:
        """Items per second over the trailing ``window_s``, on the trace's time grid, all clients together."""
        total = np.sum([c.completions for c in self.clients], axis=0) if self.clients else np.zeros_like(self.time)
        out = np.zeros_like(self.time)
        if len(self.time) < 2:
            return out
        dt = float(self.time[1] - self.time[0])
        lag = max(1, round(window_s / dt))
        out[lag:] = (total[lag:] - total[:-lag]) / (lag * dt)
        out[:lag] = total[:lag] / np.maximum(self.time[:lag], dt)
        return out
