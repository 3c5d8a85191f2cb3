"""The token dimension end to end: the budget rule, its way through the controller, the signal it reads, the lab.

Exact values where the rule is exact (the budget is arithmetic on one Observation), the controller's bounds and
fail-safe on plain calls, the KV pool read from a rendered vLLM page of the engine model, and the lab's
heavy-tailed scenario (scaled down) run through the production policy, controller and limiter.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import simpy

from engine_helpers import tiny_preset
from model_concurrency.controller import ControllerCore
from model_concurrency.engine import Server
from model_concurrency.lab.client import request_stream
from model_concurrency.lab.compare import run_study
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.observation import Observation
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.base import Target
from model_concurrency.policies.token_budget import TokenBudget, TokenSide
from model_concurrency.signals.vllm import parse_vllm_metrics

SIMS = Path(__file__).resolve().parents[1] / "sims"
POOL = 100_000


def obs(**kw: object) -> Observation:
    base: dict[str, object] = {"kv_tokens": POOL, "running": 10.0, "inflight": 10}
    base.update(kw)
    return Observation(**base)  # type: ignore[arg-type]


# -- the rule ---------------------------------------------------------------------------------------------------
def test_without_the_pool_there_is_no_budget() -> None:
    assert TokenBudget().budget(obs(kv_tokens=None, inflight_tokens=500, kv_cache_usage=0.5)) is None


def test_nothing_weighted_in_flight_gives_our_share_of_the_pool() -> None:
    assert TokenBudget().budget(obs(inflight_tokens=0, kv_cache_usage=0.5)) == POOL
    # a quarter of the engine's load is ours: a quarter of the pool
    assert TokenBudget().budget(obs(inflight_tokens=0, running=30.0, waiting=10.0)) == POOL / 4


def test_alone_the_budget_is_in_flight_times_kv_high_over_usage() -> None:
    rule = TokenBudget(kv_high=0.9, overcommit=2.0)
    # weights overstate by half (usage 0.3 of the pool for 60 000 units): room in units is twice the room in KV
    assert rule.budget(obs(inflight_tokens=60_000, kv_cache_usage=0.3)) == pytest.approx(60_000 * 0.9 / 0.3)
    # over kv_high: a trim in proportion to the overshoot
    assert rule.budget(obs(inflight_tokens=60_000, kv_cache_usage=0.95)) == pytest.approx(60_000 * 0.9 / 0.95)


def test_beside_others_the_steps_add_one_call_and_cut_by_the_decrease() -> None:
    rule = TokenBudget(kv_high=0.9, overcommit=4.0, steps=True)

    def beside(usage: float) -> float | None:  # half the engine's load is ours: 10 calls of 20 running
        return rule.budget(obs(inflight_tokens=60_000, kv_cache_usage=usage, running=20.0))

    # Far under kv_high the room is the larger step: as without the steps (our half of the room, in our units).
    assert beside(0.3) == pytest.approx(60_000 * 0.9 / 0.3)
    # From where a cut lands (0.9 × kv_high) to kv_high: one call of ours (6 000 units, 60 000 over 10 calls).
    assert beside(0.85) == pytest.approx(66_000) and beside(0.9) == pytest.approx(66_000)
    # Over it: 0.9 × what we hold, where the proportional trim would give back only 5 %.
    assert beside(0.95) == pytest.approx(54_000)
    # Alone on the engine there is nobody to even out with: the proportional rule, both ways.
    assert rule.budget(obs(inflight_tokens=60_000, kv_cache_usage=0.85)) == pytest.approx(60_000 * 0.9 / 0.85)
    assert rule.budget(obs(inflight_tokens=60_000, kv_cache_usage=0.95)) == pytest.approx(60_000 * 0.9 / 0.95)


def test_two_clients_on_one_cache_even_out_under_the_steps() -> None:
    # Two clients hold 30 and 6 calls of 100 units on a pool of 4 000 tokens the calls fill as they weigh; each
    # poll, each client's budget becomes what it holds (both always have the calls to fill it).
    def split(steps: bool) -> tuple[float, float]:
        rule, held = TokenBudget(kv_high=0.9, steps=steps), [3_000.0, 600.0]
        for _ in range(100):
            usage, running = sum(held) / 4_000, sum(held) / 100
            held = [
                rule.budget(
                    obs(
                        kv_tokens=4_000,
                        inflight=round(h / 100),
                        running=running,
                        inflight_tokens=h,
                        kv_cache_usage=usage,
                    )
                )
                or 0.0
                for h in held
            ]
        return min(held) / max(held), sum(held) / 4_000

    assert split(steps=False) == pytest.approx((0.2, 0.9))  # proportional both ways: the 5 : 1 split stays
    evened, usage = split(steps=True)  # equal steps up, proportional cuts down: it evens out
    assert evened > 0.95 and 0.9 * 0.9 * 0.9 <= usage <= 0.9 + 2 * 100 / 4_000


@pytest.mark.parametrize(
    "bad", [{"kv_high": 0.0}, {"overcommit": math.inf}, {"min_fraction": 0.0}, {"decrease": 1.0}, {"decrease": 0.0}]
)
def test_bad_parameters_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TokenBudget(**bad)


# -- the answer and the controller ------------------------------------------------------------------------------
def test_a_target_is_its_request_count() -> None:
    t = Target(12.5, 4000)
    assert t == 12.5 and t.requests == 12.5 and t.tokens == 4000.0 and isinstance(t, float)
    assert pickle.loads(pickle.dumps(t)).tokens == 4000.0
    with pytest.raises(AttributeError):
        t.tokens = 1.0  # type: ignore[misc]


class Answer:
    def __init__(self, value: float) -> None:
        self.value = value

    def next_target(self, target: float, o: Observation) -> float:
        return self.value


@pytest.mark.parametrize(
    ("answer", "target", "budget"),
    [
        (Target(900, 5000.7), 64, 5000),  # requests clamped to the ceiling, tokens carried (whole tokens)
        (Target(0.5, 0.2), 2, 1),  # and to the floor; a budget is at least one token
        (Target(10, math.nan), 10, None),  # a non-finite budget is "not enforced"
        (Target(10, None), 10, None),
        (10.0, 10, None),  # a plain float, as every existing plug-in answers
    ],
)
def test_the_controller_carries_the_budget_through_its_bounds(answer: float, target: int, budget: int | None) -> None:
    core = ControllerCore(policy=Answer(answer), floor=2, ceiling=64)
    assert core.update(obs()) == target
    assert core.token_budget == budget


def test_the_fail_safe_drops_the_budget_with_the_target() -> None:
    core = ControllerCore(policy=Answer(Target(40, 7000)), floor=2, ceiling=64, grace_polls=1)
    core.update(obs())
    core.fail(1.0, "down")  # within grace: both held
    assert (core.target, core.token_budget) == (40, 7000)
    core.fail(2.0, "down")  # past grace: the floor, and no token figure is trusted
    assert (core.target, core.token_budget) == (2, None)
    core.update(obs())
    assert core.token_budget == 7000


def test_a_count_view_drops_kv_signals_only_while_the_budget_binds() -> None:
    side = TokenSide(TokenBudget(kv_high=0.9), near_full=0.8)
    first = obs(
        inflight_tokens=90_000, kv_cache_usage=0.97, preemptions=3.0, waiting_capacity=4.0, running=50.0, inflight=50
    )
    assert side.view(first) == first  # no budget answered yet
    assert side.answer(50, first).tokens == pytest.approx(90_000 * 0.9 / 0.97)
    later = obs(inflight_tokens=85_000, kv_cache_usage=0.97, preemptions=3.0, waiting_capacity=4.0, running=20.0)
    seen = side.view(later)
    assert seen.kv_cache_usage == pytest.approx(0.9 * 0.999) and seen.preemptions == 0.0
    assert seen.waiting_capacity == 0.0  # fewer sequences than ever ran: the engine waits for our KV blocks
    at_most = obs(inflight_tokens=85_000, kv_cache_usage=0.5, waiting_capacity=4.0, running=50.0)
    assert side.view(at_most).waiting_capacity == 4.0  # the most sequences ever seen: the sequence limit's
    assert side.view(obs(inflight_tokens=0, waiting_capacity=4.0)).waiting_capacity == 4.0  # nothing weighted


def test_adaptive_answers_both_and_its_count_only_preset_one() -> None:
    o = obs(inflight_tokens=20_000, kv_cache_usage=0.2, inflight=10, running=10.0, inflight_peak=10)
    answer = Adaptive().next_target(10.0, o)
    assert isinstance(answer, Target) and answer.tokens == pytest.approx(20_000 * 0.92 / 0.2)
    plain = Adaptive(token_budget=False).next_target(10.0, o)
    assert not isinstance(plain, Target) and plain == float(answer)


# -- the signal ---------------------------------------------------------------------------------------------------
def test_the_pool_is_blocks_times_block_size_summed_over_engines() -> None:
    server = Server(simpy.Environment(), tiny_preset(num_gpu_blocks=120), num_engines=3)
    snapshot = parse_vllm_metrics(server.render_metrics(), "org/tiny-model-1.0")
    assert snapshot.kv_tokens == 3 * 120 * tiny_preset().block_size
    assert snapshot == server.snapshot()


# -- the lab ------------------------------------------------------------------------------------------------------
def test_a_heavy_tail_comes_in_bursts_of_long_items() -> None:
    rng = np.random.default_rng(5)
    tail = {"long_fraction": 0.05, "long_prompt_tokens": 20_000, "long_output_tokens": 50, "long_burst": 4}
    stream = request_stream(rng, 300, 100, 0.5, 0.5, **tail)  # type: ignore[arg-type]
    sizes = [next(stream).prompt_tokens for _ in range(20_000)]
    long = [s >= 19_000 for s in sizes]
    assert 0.04 < sum(long) / len(long) < 0.06
    runs, run = [], 0
    for flag in [*long, False]:
        if flag:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    assert all(r % 4 == 0 for r in runs)  # whole runs of long_burst (two may touch)
    assert max(s for s, is_long in zip(sizes, long, strict=True) if is_long) <= 20_000


def test_heavy_tail_weighted_default_never_preempts_where_count_only_does(tmp_path: Path) -> None:
    scenario = load_scenario(SIMS / "heavy-tail.toml").scaled(0.2)
    study = run_study([scenario], ["adaptive", "adaptive-count"], jobs=1)
    weighted, count = study.row("heavy-tail", "adaptive"), study.row("heavy-tail", "adaptive-count")
    assert weighted["preemptions"] == 0 < count["preemptions"]
    assert weighted["goodput"] > count["goodput"]
