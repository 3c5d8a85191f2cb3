"""The lab's rate-limit stage: the emulator's buckets on SimPy time, clients that honour Retry-After with the
live hold rule, and the summary's throttled figures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model_concurrency.engine.request import Request
from model_concurrency.lab.ratelimit import Finished, RateLimitedFront, Refused
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario, scenario_from_dict
from model_concurrency.lab.summary import summarize
from model_concurrency.lab.trace import ClientTrace, Trace
from model_concurrency.lab.world import World
from model_concurrency.policies.static import Static


def limited(rpm: float, *, duration_s: float = 90.0, floor: int = 16, **limit: Any) -> Any:
    return scenario_from_dict(
        {
            "name": "limited",
            "seed": 3,
            "duration_s": duration_s,
            "fleet": {"preset": "llama-8b-h100"},
            "workload": {"prompt_tokens": 256, "output_tokens": 32},
            "clients": {"floor": floor, "ceiling": floor},
            "rate_limit": {"requests_per_minute": rpm, **limit},
        }
    )


def test_bundled_scenario_and_key_errors() -> None:
    scenario = load_scenario("rate-limited")
    assert scenario.name == "rate-limited" and scenario.rate_limit.active
    assert scenario.rate_limit.items_per_s(640) == 10.0  # 600 rpm binds before 500k tpm (13 items/s)
    assert load_scenario("ramp").rate_limit.active is False
    with pytest.raises(ValueError, match=r"rate_limit.requests_per_minute = -5: must be > 0"):
        limited(-5)
    with pytest.raises(ValueError, match=r"rate_limit.tokens_per_minute = \"many\": expected a number"):
        limited(60, tokens_per_minute="many")


class RecordingFront(RateLimitedFront):
    """The real front, noting when each call reached it and each refusal's Retry-After deadline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[float] = []
        self.holds: list[tuple[float, float]] = []  # (answer arrived, Retry-After deadline)

    def submit_limited(self, request: Request, on_finish: Finished, on_refused: Refused) -> None:
        self.calls.append(self.env.now)

        def refused(req: Request, delay: float) -> None:
            self.holds.append((self.env.now, self.env.now + delay))
            on_refused(req, delay)

        super().submit_limited(request, on_finish, refused)


def test_clients_send_nothing_during_a_hold_and_stay_within_the_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    fronts: list[RecordingFront] = []

    def recording(*args: Any, **kwargs: Any) -> RecordingFront:
        fronts.append(RecordingFront(*args, **kwargs))
        return fronts[-1]

    monkeypatch.setattr("model_concurrency.lab.world.RateLimitedFront", recording)
    scenario = limited(120)  # 2 per second; the bucket starts with 120
    trace = simulate(scenario, policy_factory=Static)
    front = fronts[0]
    assert front.refused > 0 and front.admitted > 0
    # The bucket's bound: never more than one minute's worth plus the refill.
    assert front.admitted <= 120 + 2 * scenario.duration_s
    # The rule: after a refusal's answer arrives, the client sends nothing before its Retry-After deadline.
    calls = np.asarray(front.calls)
    assert front.holds
    for answered, deadline in front.holds:
        assert not np.any((calls > answered) & (calls < deadline - 1e-9))
    client = trace.clients[0]
    assert 0 < client.throttled[-1] <= front.refused  # the trace's last sample is up to trace_dt_s before the end
    summary = summarize(trace)
    sent = client.throttled[-1] + client.completions[-1] + client.errors[-1]
    assert summary["throttled_fraction"] == pytest.approx(client.throttled[-1] / sent)
    # After the first minute the limit admits its refill and whatever of the first minute's bucket a hold left.
    after = scenario.duration_s - 60.0
    assert summary["limit_ratio"] is not None and summary["limit_ratio"] <= (120 + 2 * after) / (2 * after) + 1e-9


def test_no_limit_means_no_front() -> None:
    import simpy

    scenario = load_scenario("ramp")
    world = World(simpy.Environment(), scenario, resolve_fraction=lambda p, f: 0.0, rng=np.random.default_rng(0))
    assert world.front is world.fleet
    assert summarize(simulate(scenario.scaled(0.02), policy_factory=Static))["limit_ratio"] is None


def test_summary_throttled_figures_are_exact() -> None:
    time = np.arange(0.0, 121.0, 30.0)  # 0, 30, 60, 90, 120
    client = ClientTrace(
        target=np.full(5, 4.0),
        inflight=np.full(5, 4.0),
        completions=np.array([0, 30, 60, 80, 100.0]),
        errors=np.zeros(5),
        throttled=np.array([0, 40, 50, 50, 60.0]),
    )
    empty = np.zeros(0)
    trace = Trace(time, empty, np.zeros(5), empty, empty, [client], empty, empty, empty, 120.0, limit_rps=1.0)
    summary = summarize(trace)
    assert summary["throttled_fraction"] == 60 / 160
    assert summary["throttled_fraction_after_60s"] == 10 / 50  # from t=60: 40 completed, 10 refused
    assert summary["limit_ratio"] == (100 - 60) / 60 / 1.0


@pytest.mark.parametrize("policy", ["adaptive", "aimd"])
def test_the_target_settles_under_the_limit_instead_of_sawing_into_it(policy: str) -> None:
    """The rate-limit goal on the bundled scenario: >= 0.95 of the limit, < 1 % of calls throttled after the first
    minute (before the 429 rules of the controller and the guard: 99.7 % throttled, docs/results.md).

    The median of three seeds (the bundled one and the next two), each run at least 0.9: with the per-poll jitter
    on by default, where the cuts land moves with the draws (adaptive 0.931, 0.984, 0.970; 1.002 on the bundled
    seed without jitter)."""
    import dataclasses
    import statistics

    from model_concurrency.policies.registry import load_policy

    base = load_scenario("rate-limited")
    runs = [
        summarize(simulate(dataclasses.replace(base, seed=base.seed + k), policy_factory=lambda: load_policy(policy)))
        for k in range(3)
    ]
    ratios = [r["limit_ratio"] for r in runs]
    assert statistics.median(ratios) >= 0.95 and min(ratios) >= 0.9, ratios
    assert all(r["throttled_fraction_after_60s"] < 0.01 for r in runs)


def test_clients_sharing_a_limit_their_floors_overrun_back_off_instead_of_hammering_it() -> None:
    """Four clients with floors of 8 behind 600 requests a minute (10 a second, about 3 calls in flight at a time):
    the floors alone ask for ten times what the limit admits, and every refusal names the same instant, the
    bucket's next token. Before the hold's backoff at the floor (gate/hold.py) 97 % of their calls were refused
    after the first minute, at 1.00 of the limit and Jain 0.36; with it 7 %, 0.90 and 0.97."""
    from model_concurrency.policies.registry import load_policy

    scenario = scenario_from_dict(
        {
            "name": "shared-limit",
            "seed": 5,
            "duration_s": 240.0,
            "fleet": {"preset": "llama-8b-h100"},
            "workload": {"prompt_tokens": 256, "output_tokens": 32},
            "clients": {"count": 4, "floor": 8, "ceiling": 64},
            "rate_limit": {"requests_per_minute": 600},
        }
    )
    summary = summarize(simulate(scenario, policy_factory=lambda: load_policy("adaptive")))
    assert summary["throttled_fraction_after_60s"] < 0.1
    assert summary["limit_ratio"] is not None and summary["limit_ratio"] >= 0.85
    assert summary["jain_fairness"] >= 0.9
