"""Every decision carries its reason: the rule, ``limited_by``, the ``-v`` line and the exported gauge agree."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from model_concurrency import get_utilization, register_model, resolve_capacity
from model_concurrency.controller import ControllerCore
from model_concurrency.decision import LIMITS
from model_concurrency.observation import EngineLimits, EngineSnapshot, Observation
from servers import Behaviour, EngineState, metrics_server, vllm_page

SERVED = "served"


class Constant:
    """A policy that always answers ``value`` (a pure unit: the classification is the controller's)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def next_target(self, target: float, obs: Observation) -> float:
        return self.value


def decide(policy_answer: float, obs: Observation, *, floor: int = 4, ceiling: int = 64, start: float = 16.0):  # type: ignore[no-untyped-def]
    core = ControllerCore(policy=Constant(policy_answer), floor=floor, ceiling=ceiling)
    core.target_value = start
    return core, core.decide(obs)


def test_growing_freely_is_limited_by_nothing() -> None:
    _, decision = decide(24, Observation(running=16, inflight=16, inflight_peak=16, time=1.0))
    assert (decision.previous, decision.target, decision.rule, decision.limited_by) == (16, 24, "policy", None)


def test_the_ceiling() -> None:
    _, decision = decide(1000, Observation(running=16, inflight=16, inflight_peak=16, time=1.0))
    assert (decision.target, decision.limited_by) == (64, "ceiling")


STATED = EngineLimits(max_num_seqs=16)
STATED_CASES = [
    # The engines run every slot their operator stated, nothing queued: the stated limit holds it...
    (Observation(running=16, inflight=16, inflight_peak=16, time=1.0, limits=STATED), "stated-limit"),
    # ...a slot still free is the policy's own judgement, and a queue for capacity is saturation either way.
    (Observation(running=15, inflight=16, inflight_peak=16, time=1.0, limits=STATED), "saturation"),
    (Observation(running=16, waiting_capacity=2, inflight=16, inflight_peak=16, time=1.0, limits=STATED), "saturation"),
]


@pytest.mark.parametrize(
    ("obs", "limited_by"),
    [
        (Observation(running=16, waiting_capacity=3, inflight=16, inflight_peak=16, time=1.0), "saturation"),
        (Observation(running=16, preemptions=2, inflight=16, inflight_peak=16, time=1.0), "saturation"),
        (Observation(running=6, inflight=5, inflight_peak=6, time=1.0), "app-limited"),
        (Observation(running=16, inflight=16, inflight_peak=16, time=1.0), "saturation"),  # the policy's own knee
        *STATED_CASES,
    ],
)
def test_a_hold_or_a_cut_says_why(obs: Observation, limited_by: str) -> None:
    _, decision = decide(12, obs)
    assert (decision.target, decision.rule, decision.limited_by) == (12, "policy", limited_by)


def test_the_growth_guard() -> None:
    core = ControllerCore(policy=Constant(40), floor=4, ceiling=64)
    core.target_value = 16.0
    core.guard.cap = 16.0  # the knee it found: it rises by `probe` a poll while it binds
    decision = core.decide(Observation(running=16, inflight=16, inflight_peak=16, time=1.0))
    assert (decision.target, decision.rule, decision.limited_by) == (17, "growth guard", "guard")


def test_a_throttle_cut_between_polls_is_a_decision() -> None:
    core = ControllerCore(policy=Constant(40), floor=4, ceiling=64)
    core.target_value = 40.0
    assert core.note_throttled(20, now=5.0) == 18
    decision = core.last_decision
    assert decision is not None and (decision.previous, decision.target, decision.limited_by) == (40, 18, "throttled")
    assert str(decision) == "40 -> 18: throttle cut [throttled]"


def test_an_outage_is_grace_then_the_floor() -> None:
    core = ControllerCore(policy=Constant(40), floor=4, ceiling=64, grace_polls=1)
    core.target_value = 30.0
    core.last_snapshot = EngineSnapshot()  # a page was read before the outage
    first = core.decide(Observation(ok=False, time=1.0), "ConnectError")
    assert (first.target, first.rule, first.limited_by) == (30, "grace 1/1 (ConnectError)", "guard")
    second = core.decide(Observation(ok=False, time=2.0), "ConnectError")
    assert (second.target, second.limited_by) == (4, "floor")
    assert second.rule == "floor: signals lost and no completed calls to judge by (2 failed polls)"


def limited_by_gauges(model: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.name == "model_concurrency_limited_by" and sample.labels["model"] == model:
                out[sample.labels["reason"]] = sample.value
    return out


def test_the_hook_reports_saturation_everywhere(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    page = vllm_page({SERVED: [EngineState(running=4, waiting_capacity=5, kv=0.95)]})
    with metrics_server(Behaviour(body=page)) as server:
        register_model("dec-sat", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        with caplog.at_level(logging.INFO, logger="model_concurrency"):
            assert resolve_capacity("dec-sat") == 4
        util = get_utilization("dec-sat")
    assert util["limited_by"] == "saturation"
    assert util["last_decision"] == "4 -> 4: policy [saturation]"
    assert limited_by_gauges("dec-sat") == {reason: float(reason == "saturation") for reason in LIMITS}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model dec-sat: target")]
    assert lines == [
        "model dec-sat: target 4 -> 4: policy [saturation] (running 4, waiting 5 (capacity 5), kv 0.95, "
        "in flight 4 (peak 4), calls 0)"
    ]


def test_the_hook_reports_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "6")
    pool = [0]  # the engine runs exactly the pool the caller sized from the hook's last answer
    behaviour = Behaviour(render=lambda: vllm_page({SERVED: [EngineState(running=pool[0])]}))
    with metrics_server(behaviour) as server:
        register_model("dec-ceil", base_url=f"{server.url}/v1", served_model_name=SERVED, max_parallel_calls=4)
        for _ in range(8):
            pool[0] = resolve_capacity("dec-ceil")
        util = get_utilization("dec-ceil")
    assert util["current_target"] == 6 and util["limited_by"] == "ceiling"
    assert limited_by_gauges("dec-ceil")["ceiling"] == 1.0


def test_throttled_calls_cap_the_target() -> None:
    obs = Observation(running=16, inflight=16, inflight_peak=16, client_calls=9, client_throttled=2, time=1.0)
    _, decision = decide(40, obs)
    assert (decision.rule, decision.limited_by) == ("throttle cap", "throttled") and decision.target < 16


def test_the_static_view_is_limited_by_nothing_it_decided() -> None:
    register_model("dec-static", base_url=None, max_parallel_calls=3)
    util = get_utilization("dec-static")
    assert util["limited_by"] is None and util["last_decision"] is None


def test_the_reasons_read_by_the_command_line_have_meanings() -> None:
    from model_concurrency.decision import MEANINGS, NEVER_READ, OFF, explain_limit, outage_limit, static_limit

    assert set(MEANINGS) == set(LIMITS) and {NEVER_READ, OFF} <= set(LIMITS)
    assert (outage_limit(True, "guard"), outage_limit(True, "floor")) == ("guard", "floor")
    assert (outage_limit(False, "guard"), outage_limit(False, "floor")) == (NEVER_READ, NEVER_READ)
    assert (static_limit(True), static_limit(False)) == (None, OFF)
    assert explain_limit(None) == "nothing (growing freely)"
    assert explain_limit(OFF) == "off (adaptive control is off (KG_ADAPTIVE_CONCURRENCY): pinned at the floor)"


def test_an_outage_before_any_page_was_read_says_so() -> None:
    from model_concurrency.decision import NEVER_READ

    core = ControllerCore(policy=Constant(40), floor=4, ceiling=64, grace_polls=1)
    first = core.decide(Observation(ok=False, time=1.0), "ConnectError")
    second = core.decide(Observation(ok=False, time=2.0), "ConnectError")
    assert (first.target, first.limited_by) == (4, NEVER_READ)
    assert (second.target, second.limited_by) == (4, NEVER_READ)
