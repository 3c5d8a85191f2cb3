"""The lab at fleet scale: per-poll jitter (on by default), per-client goodput percentiles, distribution plots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency.lab.plot import BAND_CLIENTS, draw_run
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import Scenario, load_scenario, scenario_from_dict
from model_concurrency.lab.summary import SUMMARY_KEYS, summarize
from model_concurrency.lab.trace import ClientTrace, Trace
from model_concurrency.policies.registry import load_policy

SIMS = Path(__file__).resolve().parents[1] / "sims"


def few_clients(count: int, jitter: float, duration_s: float = 120.0, seed: int = 5) -> Scenario:
    return scenario_from_dict(
        {
            "name": "few",
            "seed": seed,
            "duration_s": duration_s,
            "fleet": {"engine": {"max_num_seqs": 64}},
            "clients": {"count": count, "floor": 2, "ceiling": 32, "poll_jitter": jitter},
        }
    )


def gaps(trace: Trace) -> list[np.ndarray]:
    return [np.diff(c.poll_times) for c in trace.clients]


def test_jitter_keeps_every_wait_within_its_band_and_breaks_lock_step() -> None:
    trace = simulate(few_clients(3, 0.1), policy_factory=lambda: load_policy("adaptive"))
    for d in gaps(trace):
        assert len(d) >= 8
        assert np.all(d >= 12.0 * 0.9 - 1e-9) and np.all(d <= 12.0 * 1.1 + 1e-9)
        assert np.std(d) > 0  # drawn per poll, not one offset per client
    steady = simulate(few_clients(3, 0.0), policy_factory=lambda: load_policy("adaptive"))
    for d in gaps(steady):
        assert np.allclose(d, 12.0)


def test_jitter_is_reproducible_from_the_seed() -> None:
    a = simulate(few_clients(2, 0.2), policy_factory=lambda: load_policy("adaptive"))
    b = simulate(few_clients(2, 0.2), policy_factory=lambda: load_policy("adaptive"))
    for ca, cb in zip(a.clients, b.clients, strict=True):
        assert np.array_equal(ca.poll_times, cb.poll_times)
        assert np.array_equal(ca.target, cb.target)
    assert np.array_equal(a.latencies, b.latencies)


def test_a_lone_client_drifts_too_as_the_live_poller_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_RAMP_POLL_DIVISOR", "1")  # the regular grid only (no fast ramp polls)
    (d,) = gaps(simulate(few_clients(1, 0.5, duration_s=60.0), policy_factory=lambda: load_policy("adaptive")))
    assert np.all(d >= 6.0 - 1e-9) and np.all(d <= 18.0 + 1e-9) and np.std(d) > 0
    (d,) = gaps(simulate(few_clients(1, 0.0, duration_s=60.0), policy_factory=lambda: load_policy("adaptive")))
    assert np.allclose(d, 12.0)


def test_jitter_is_on_by_default_the_production_knob_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Unset in a scenario: the live poller's knob, MODEL_CONCURRENCY_POLL_JITTER (0.1 unless set).
    assert scenario_from_dict({"name": "x"}).clients.poll_jitter is None
    base = few_clients(2, 0.0)
    default = dataclasses.replace(base, clients=dataclasses.replace(base.clients, poll_jitter=None))
    for d in gaps(simulate(default, policy_factory=lambda: load_policy("adaptive"))):
        assert np.all(d >= 10.8 - 1e-9) and np.all(d <= 13.2 + 1e-9) and np.std(d) > 0
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_JITTER", "0")
    for d in gaps(simulate(default, policy_factory=lambda: load_policy("adaptive"))):
        assert np.allclose(d, 12.0)
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError, match="poll_jitter"):
            scenario_from_dict({"name": "x", "clients": {"poll_jitter": bad}})


def client(completed_by_end: float, n: int = 11) -> ClientTrace:
    done = np.linspace(0.0, completed_by_end, n)
    return ClientTrace(target=np.full(n, 4.0), inflight=np.zeros(n), completions=done, errors=np.zeros(n))


def trace_of(clients: list[ClientTrace], duration_s: float = 10.0) -> Trace:
    n = len(clients[0].completions)
    zeros = np.zeros(n)
    return Trace(
        time=np.linspace(0.0, duration_s, n),
        running=zeros,
        waiting_capacity=zeros,
        kv_usage=zeros,
        preemptions=zeros,
        clients=clients,
        queue_times=np.zeros(0),
        latencies=np.zeros(0),
        finish_times=np.zeros(0),
        duration_s=duration_s,
    )


def test_per_client_goodput_percentiles_follow_numpy() -> None:
    # 100 clients completing 0, 10, ..., 990 items in 10 s: goodputs 0, 1, ..., 99 items/s.
    summary = summarize(trace_of([client(10.0 * i) for i in range(100)]))
    assert {"client_goodput_p5", "client_goodput_p50", "client_goodput_p95"} <= set(SUMMARY_KEYS)
    assert summary["client_goodput_p5"] == pytest.approx(4.95)
    assert summary["client_goodput_p50"] == pytest.approx(49.5)
    assert summary["client_goodput_p95"] == pytest.approx(94.05)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40))
def test_per_client_goodput_percentiles_are_ordered_and_bounded(done: list[int]) -> None:
    summary = summarize(trace_of([client(float(d)) for d in done]))
    rates = [d / 10.0 for d in done]
    p5, p50, p95 = (summary[f"client_goodput_p{q}"] for q in (5, 50, 95))
    assert min(rates) <= p5 <= p50 <= p95 <= max(rates)


def test_many_clients_are_drawn_as_a_distribution_not_one_line_each() -> None:
    n = BAND_CLIENTS + 1
    clients = [client(float(i)) for i in range(n)]
    for i, c in enumerate(clients):
        c.target[:] = float(i)
    trace = trace_of(clients)
    fig, axes = plt.subplots(2, 1)
    draw_run(axes, trace)
    top = axes[0]
    labels = [line.get_label() for line in top.get_lines()]
    assert not any(label.startswith("target c") or label == "target (per client)" for label in labels)
    summed = next(line for line in top.get_lines() if line.get_label() == "target (sum of clients)")
    assert np.allclose(summed.get_ydata(), sum(range(n)))
    twin = next(ax for ax in fig.axes if ax is not top and ax is not axes[1] and ax.get_ylabel() == "per-client target")
    median = next(line for line in twin.get_lines() if line.get_label().startswith("per-client target p50"))
    assert np.allclose(median.get_ydata(), np.percentile(np.arange(n), 50))
    legend = top.get_legend()
    assert legend is not None
    texts = [t.get_text() for t in legend.get_texts()]
    assert "per-client target p5-p95 (right axis)" in texts and "target (sum of clients)" in texts
    plt.close(fig)


def test_few_clients_keep_one_line_each() -> None:
    trace = trace_of([client(1.0), client(2.0)])
    fig, axes = plt.subplots(2, 1)
    draw_run(axes, trace)
    labels = {line.get_label() for line in axes[0].get_lines()}
    assert {"target c0", "target c1"} <= labels
    plt.close(fig)


def test_the_fleet_scenario_is_the_one_the_issue_asks_for() -> None:
    sc = load_scenario(SIMS / "fleet-1000.toml")
    assert (sc.fleet.preset, sc.fleet.replicas, sc.fleet.engines, sc.fleet.balancer) == (
        "llama-8b-h100",
        16,
        4,
        "least-loaded",
    )
    assert sc.fleet.engine == {"max_num_seqs": 256}
    assert (sc.workload.prompt_tokens, sc.workload.output_tokens) == (512, 128)
    assert (sc.workload.prompt_sigma, sc.workload.output_sigma) == (0.5, 0.5)
    assert (sc.clients.count, sc.clients.floor, sc.clients.ceiling) == (1000, 4, 128)
    assert sc.clients.poll_s == 12.0 and sc.clients.poll_jitter is None  # the default: ± 10 %, as live
    assert sc.duration_s == 1800


def test_the_fleet_scenario_runs_scaled_down() -> None:
    # A few simulated seconds of the real fleet and all 1,000 clients: every client starts, none is lost.
    sc = dataclasses.replace(load_scenario(SIMS / "fleet-1000.toml"), duration_s=4.0)
    trace = simulate(sc, policy_factory=lambda: load_policy("adaptive"))
    assert len(trace.clients) == 1000
    assert all(c.target[0] == 4 for c in trace.clients)
    assert trace.running[-1] > 0
    summary = summarize(trace)
    assert summary["client_goodput_p5"] <= summary["client_goodput_p50"] <= summary["client_goodput_p95"]
