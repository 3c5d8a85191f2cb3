"""What a simulated run leaves behind: sampled time series (numpy arrays) and per-request figures.

The runner samples every ``trace_dt_s`` simulated seconds; per-request arrays hold only the fan-out clients'
requests (background traffic is the environment, not the thing judged).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ClientTrace", "Trace", "load_trace", "save_trace"]

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
    # The Gateway API Inference Extension's pool score per sample (signals/saturation.py); empty when not sampled.
    gateway_saturation: Array = field(default_factory=lambda: np.zeros(0))
    # The interactive tenant's latencies (lab/neighbour.py NeighbourLatency), for scenarios with one; not stored.
    neighbour: Any = None

    @classmethod
    def sampled(cls, samples: dict[str, list[float]], clients: list[ClientTrace], **rest: Any) -> Trace:
        """A trace from the engine-wide series a sampler took on the trace grid (``time``, ``running``,
        ``waiting``, ``kv``, ``preemptions``; other keys are the sampler's own), the lab's and the conformance
        harness's alike, so both read the same fields the same way."""
        arr = {k: np.asarray(samples[k], dtype=float) for k in ("time", "running", "waiting", "kv", "preemptions")}
        return cls(
            time=arr["time"],
            running=arr["running"],
            waiting_capacity=arr["waiting"],
            kv_usage=arr["kv"],
            preemptions=arr["preemptions"],
            clients=clients,
            **rest,
        )

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


# Stored traces: one ``.npy`` per array in a directory, read back memory-mapped (the oracle's cached runs).
_SERIES = ("time", "running", "waiting_capacity", "kv_usage", "preemptions", "queue_times", "latencies", "finish_times")
# Series a trace may lack (older cached traces, runners that do not sample them): written only when sampled.
_OPTIONAL_SERIES = ("gateway_saturation",)
_CLIENT_SERIES = ("target", "inflight", "completions", "errors", "throttled")
_TRACE_FORMAT = 1


def save_trace(trace: Trace, directory: Path) -> None:
    """Write ``trace`` into ``directory`` (created), losslessly: float64 arrays and a JSON header.

    Per-client series of equal length go in one (clients, samples) matrix each, as the runner builds them; poll
    times and targets, which differ in length per client, are stored flat with their lengths."""
    directory.mkdir(parents=True, exist_ok=True)
    lengths = {len(getattr(c, name)) for c in trace.clients for name in _CLIENT_SERIES}
    if len(lengths) > 1:
        raise ValueError("per-client series of different lengths: not a trace from the runner")
    for name in _SERIES:
        np.save(directory / f"{name}.npy", np.asarray(getattr(trace, name), dtype=np.float64))
    for name in _OPTIONAL_SERIES:
        if len(getattr(trace, name)):
            np.save(directory / f"{name}.npy", np.asarray(getattr(trace, name), dtype=np.float64))
    samples = lengths.pop() if lengths else 0
    for name in _CLIENT_SERIES:
        matrix = np.empty((len(trace.clients), samples), dtype=np.float64)
        for i, client in enumerate(trace.clients):
            matrix[i] = getattr(client, name)
        np.save(directory / f"clients.{name}.npy", matrix)
    for name in ("poll_times", "poll_targets"):
        parts = [np.asarray(getattr(c, name), dtype=np.float64) for c in trace.clients]
        np.save(directory / f"clients.{name}.npy", np.concatenate(parts) if parts else np.zeros(0))
        np.save(directory / f"clients.{name}.lengths.npy", np.asarray([len(p) for p in parts], dtype=np.int64))
    header = {
        "format": _TRACE_FORMAT,
        "duration_s": trace.duration_s,
        "capacity_changes": list(trace.capacity_changes),
        "limit_rps": trace.limit_rps,
    }
    (directory / "trace.json").write_text(json.dumps(header))


def load_trace(directory: Path) -> Trace:
    """Read a trace :func:`save_trace` wrote. Arrays are read-only memory maps: pages are read when used, so a
    large run costs memory only for what its reader touches. Raises ``OSError``/``ValueError`` if incomplete."""
    header = json.loads((directory / "trace.json").read_text())
    if header.get("format") != _TRACE_FORMAT:
        raise ValueError(f"{directory}: trace format {header.get('format')!r}, expected {_TRACE_FORMAT}")

    def array(name: str) -> Array:
        loaded: Array = np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        return loaded

    series = {name: array(name) for name in _SERIES}
    series |= {name: array(name) for name in _OPTIONAL_SERIES if (directory / f"{name}.npy").exists()}
    matrices = {name: array(f"clients.{name}") for name in _CLIENT_SERIES}
    flat = {name: array(f"clients.{name}") for name in ("poll_times", "poll_targets")}
    lengths = {name: np.load(directory / f"clients.{name}.lengths.npy", allow_pickle=False).tolist() for name in flat}
    offsets = {name: np.concatenate([[0], np.cumsum(lengths[name], dtype=np.int64)]).tolist() for name in flat}
    count = len(matrices["target"])
    clients = [
        ClientTrace(
            **{name: matrix[i] for name, matrix in matrices.items()},
            poll_times=flat["poll_times"][offsets["poll_times"][i] : offsets["poll_times"][i + 1]],
            poll_targets=flat["poll_targets"][offsets["poll_targets"][i] : offsets["poll_targets"][i + 1]],
        )
        for i in range(count)
    ]
    return Trace(
        **series,
        clients=clients,
        duration_s=float(header["duration_s"]),
        capacity_changes=[float(t) for t in header["capacity_changes"]],
        limit_rps=header["limit_rps"],
    )
