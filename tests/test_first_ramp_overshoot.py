"""The first-ramp overshoot figure: the first ramp's peak summed target over the oracle's knee, exactly."""

from __future__ import annotations

import numpy as np

from model_concurrency.lab.summary import first_ramp_overshoot
from model_concurrency.lab.trace import ClientTrace, Trace


def trace(targets: list[list[float]], changes: list[float] | None = None) -> Trace:
    """A trace sampled every 10 s whose clients held these targets; nothing else about it matters here."""
    n = len(targets[0])
    zeros = np.zeros(n)
    clients = [ClientTrace(target=np.asarray(t, dtype=float), inflight=zeros, completions=zeros, errors=zeros)
               for t in targets]  # fmt: skip
    return Trace(time=np.arange(n) * 10.0, running=zeros, waiting_capacity=zeros, kv_usage=zeros, preemptions=zeros,
                 clients=clients, queue_times=zeros, latencies=zeros, finish_times=zeros, duration_s=n * 10.0,
                 capacity_changes=changes or [])  # fmt: skip


def test_the_peak_before_the_first_fall_over_the_knee() -> None:
    oracle = trace([[48] * 6])
    # Two clients ramp 8 -> 32 -> 30 together (summed 16, 40, 64, 60): the first fall ends the ramp at 64.
    run = trace([[4, 20, 32, 30, 40, 80], [4, 20, 32, 30, 40, 80]])
    assert first_ramp_overshoot(run, oracle) == 64 / 48
    # Probes after the first cut (80 + 80) are not the first ramp's.
    assert first_ramp_overshoot(trace([[4, 16, 40, 40, 40, 40]]), oracle) == 40 / 48


def test_only_the_first_phase_counts() -> None:
    # Engines added at t = 30 s: the ramp that follows is another phase's, and the knee is the first phase's.
    oracle = trace([[48, 48, 48, 96, 96, 96]], changes=[30.0])
    run = trace([[8, 32, 50, 64, 100, 120]], changes=[30.0])
    assert first_ramp_overshoot(run, oracle) == 50 / 48


def test_no_oracle_no_figure() -> None:
    assert first_ramp_overshoot(trace([[4, 8]]), None) is None
