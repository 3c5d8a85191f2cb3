"""adaptive-neighbour (policies/neighbour.py): adaptive's every decision while nobody else shows up; a cut at a
neighbour's burst onset, a refill when it ends, headroom below a fill line while a neighbour is about."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_concurrency.lab.experiment import run_scenario
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.observation import Observation
from model_concurrency.policies import load_policy
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.neighbour import AdaptiveNeighbour

PRESETS = Path(__file__).resolve().parents[1] / "policies"


def poll(time: float, inflight: int, others: int, *, waiting: int = 0, kv: float | None = None) -> Observation:
    """One poll: our window full at ``inflight``, ``others`` requests of somebody else's running beside it (plus
    ``waiting`` queued, capacity-waiting), and 20 of our calls finished."""
    return Observation(
        time=time,
        inflight=inflight,
        inflight_peak=inflight,
        running=float(inflight + others),
        waiting=float(waiting),
        waiting_capacity=float(waiting),
        kv_cache_usage=kv,
        client_calls=20,
        client_latency_mean_s=4.0,
    )


def settled() -> tuple[AdaptiveNeighbour, Adaptive]:
    """The wrapper and a bare adaptive twin past their first ramp: a saturated poll (200 of ours and 56 others
    running, 64 waiting) cuts both to 0.9 x the served share 200 x 256 / 320 = 144, and the engine's capacity
    is 256."""
    policy, twin = AdaptiveNeighbour(), Adaptive()
    first = poll(0, 200, 56, waiting=64)
    assert policy.next_target(200, first) == twin.next_target(200, first) == 144
    assert not policy.inner.ramping and policy.capacity == 256
    return policy, twin


def quiet_poll(policy: AdaptiveNeighbour, twin: Adaptive, target: float, obs: Observation) -> float:
    """A poll without an onset: the wrapper answers what the twin answers."""
    answer = policy.next_target(target, obs)
    assert answer == twin.next_target(target, obs) and not policy.active
    return answer


def test_the_preset_states_each_default_and_loads_the_wrapper() -> None:
    preset = tomllib.loads((PRESETS / "adaptive-neighbour.toml").read_text())
    params = {f.name for f in dataclasses.fields(AdaptiveNeighbour) if f.init} - {"adaptive"}
    assert {k: preset[k] for k in params} == {k: getattr(AdaptiveNeighbour(), k) for k in params}
    policy = load_policy("adaptive-neighbour", adaptive={"increase_step": 2.0})
    assert isinstance(policy, AdaptiveNeighbour) and policy.inner.increase_step == 2.0
    with pytest.raises(ValueError, match="headroom"):
        AdaptiveNeighbour(headroom=1.0)


def test_a_burst_onset_cuts_to_the_floor_and_holds() -> None:
    policy, twin = settled()
    target = quiet_poll(policy, twin, 144, poll(12, 144, 50))  # others 56 -> 50: a fall is no onset
    # Others 50 -> 80 while our in-flight stayed at 144, on an engine loaded past its fill line (224 of 256 >=
    # 0.75 x 256 = 192): a rise of 30 >= 16, a neighbour's burst. Cut: 0, which the controller clamps to the floor.
    cut = policy.next_target(target, poll(24, 144, 80))
    assert cut == 0 and getattr(cut, "tokens", None) is None  # no token budget: the controller's floor holds
    assert policy.active and policy.resume_to >= target and policy.onset_rise == 30
    # Held at whatever the controller made of it, the others' load steady, for as long as the burst lasts.
    assert policy.next_target(4, poll(36, 4, 85)) == 4
    assert policy.next_target(4, poll(48, 4, 84)) == 4


def test_no_onset_below_the_fill_line() -> None:
    policy, twin = settled()
    target = quiet_poll(policy, twin, 144, poll(12, 144, 10))
    # Others 10 -> 40 (+30), but the engine holds 184 < 192: the rise found free slots. Adaptive's answer.
    quiet_poll(policy, twin, target, poll(24, 144, 40))
    assert policy.seen_at is None


def test_no_onset_on_a_one_step_engine() -> None:
    """A pooling (embedding) engine: requests complete without generating a token. No first token to protect,
    and polls far faster than the seconds the rules hold for: the others' rise is adaptive's business alone."""
    policy, twin = settled()
    target = quiet_poll(
        policy, twin, 144, dataclasses.replace(poll(12, 144, 50), completed=30.0, generation_tokens=0.0)
    )
    assert policy.inner.one_step
    quiet_poll(policy, twin, target, dataclasses.replace(poll(24, 144, 80), completed=30.0, generation_tokens=0.0))
    assert policy.seen_at is None


def test_our_own_growth_is_discounted_from_the_others_rise() -> None:
    policy, twin = settled()
    target = quiet_poll(policy, twin, 144, poll(12, 144, 50))
    # The others' count rose by 20, but our in-flight rose by 10 at the same time (calls that had not reached the
    # engine's gauges yet): 20 - 10 = 10 < 16, no cut. The rise still switches the headroom on: the answer is
    # capped at our in-flight plus our share of the room under the line, 154 + 154 / 224 x (192 - 224) = 132.
    assert policy.next_target(target, poll(24, 154, 70)) == pytest.approx(132)
    assert not policy.active and policy.seen_at == 24


def test_the_neighbour_going_idle_refills_under_the_fill_line() -> None:
    policy, twin = settled()
    target = quiet_poll(policy, twin, 144, poll(12, 144, 50))
    assert policy.next_target(target, poll(24, 144, 80)) == 0
    assert policy.next_target(4, poll(36, 4, 84)) == 4  # 12 s: under min_active_s (20), a fall would not count
    # 24 s after the onset the others' load falls 84 -> 12 (under half, by 72 >= 8): the burst is over. The target
    # goes back toward where the cut found it, capped by the fill line: 192 less the 16 on the engine is 176 of
    # room, our share of the engine is 4 / 16, so 4 + 176 / 4 = 48.
    assert policy.next_target(4, poll(48, 4, 12)) == 48
    assert not policy.active and policy.refilled_at == 48
    # Settling: the batch clients beside us refill too, and their rise (12 -> 150, the engine at 198) is no new
    # onset for 30 s; the wrapped policy sees the 6 above the line as a queue and cuts to 0.9 x its served 48.
    assert policy.next_target(48, poll(60, 48, 150)) == pytest.approx(0.9 * 48)
    assert not policy.active


def test_a_misread_onset_is_released_when_the_engine_fills_without_us() -> None:
    policy, twin = settled()
    target = quiet_poll(policy, twin, 144, poll(12, 144, 50))
    assert policy.next_target(target, poll(24, 144, 80)) == 0
    # Another batch client took our room: the engine is back at the fill line (4 + 190 >= 192) without us, so
    # holding buys nobody anything. Refill: the wrapped policy sees the 2 above the line as a queue and cuts to
    # 0.9 x its served 4 (the fair cut of rule "headroom"), under the cap of our share of the room (4 - 2/194 x 4).
    assert policy.next_target(4, poll(48, 4, 190)) == pytest.approx(3.6)
    assert not policy.active


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(4, 300), st.integers(-15, 15), st.integers(0, 40), st.booleans()),
        min_size=2,
        max_size=30,
    )
)
def test_without_a_neighbours_rise_every_decision_is_adaptives(steps: list[tuple[int, int, int, bool]]) -> None:
    """Others moving by less than ``rise`` between polls (fellow clients' steps and cuts, a steady tenant): the
    wrapper answers exactly what adaptive answers, poll for poll, whatever the queue and KV do."""
    ours, theirs = Adaptive(), AdaptiveNeighbour()
    target, others = 4.0, 20
    for i, (inflight, move, waiting, kv) in enumerate(steps):
        others = max(0, others + move)
        queued = min(waiting, others)  # the others' load is what runs and what waits beside our calls
        obs = poll(12.0 * i, min(inflight, int(target) + 8), others - queued, waiting=queued, kv=0.5 if kv else None)
        expected = ours.next_target(target, obs)
        assert theirs.next_target(target, obs) == expected
        assert not theirs.active
        target = max(4.0, min(512.0, float(expected)))


def test_in_the_lab_the_neighbours_ttft_p99_improves_over_adaptive() -> None:
    """interactive-bursts at half its length (a few seconds a run): the tenant's TTFT p99 in its bursts over the
    same tenant alone falls from 69.6x under adaptive to 40.0x, idle throughput and deadlines no worse."""
    scenario = load_scenario("interactive-bursts").scaled(0.5)

    def summary(name: str) -> dict[str, object]:
        return run_scenario(scenario, lambda: load_policy(name), with_oracle=False).summary

    ours, theirs = summary("adaptive-neighbour"), summary("adaptive")
    assert isinstance(ours["neighbour_ttft_p99_ratio"], float) and isinstance(theirs["neighbour_ttft_p99_ratio"], float)
    assert ours["neighbour_ttft_p99_ratio"] < 0.75 * theirs["neighbour_ttft_p99_ratio"]
    assert isinstance(ours["deadlines_met"], int) and isinstance(theirs["deadlines_met"], int)
    assert ours["deadlines_met"] >= theirs["deadlines_met"]
