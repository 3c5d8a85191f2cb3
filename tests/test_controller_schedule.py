"""The poll schedule: faster polls during the policy's first ramp, counted on a fake clock (no sleeps, no timing).

A driver plays the poller: at each due time it claims the poll (``begin_poll``) and feeds an outcome
(``update``), then moves the clock straight to ``next_poll_at``. The poll times it records are exact. The grid's
rules are checked with ``poll_jitter=0``; the jitter's own tests (bounds, seeded draws, the lab and the live
poller drawing the same waits) are at the end.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import AIMD, ControllerCore, Observation
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.base import wants_fast_polls

SIMS = Path(__file__).parent.parent / "sims"


@dataclass
class Scripted:
    """A policy that asks for fast polls on the first ``fast_for`` polls and answers a fixed target."""

    fast_for: int
    answer: float = 64.0
    seen: int = field(default=0, init=False)

    @property
    def wants_fast_polls(self) -> bool:
        return self.seen < self.fast_for

    def next_target(self, target: float, obs: Observation) -> float:
        self.seen += 1
        return self.answer


def poll_times(
    core: ControllerCore,
    until: float,
    failing: set[int] = frozenset(),
    asked: list[bool] | None = None,  # type: ignore[assignment]
) -> list[float]:
    """Drive the core as the poller does until ``until``; polls whose index is in ``failing`` fail.

    ``asked`` collects, per poll, whether the policy still asked for fast polls after it."""
    now, times = 0.0, []
    while now <= until:
        assert core.poll_due(now)
        core.begin_poll(now)
        if len(times) in failing:
            core.fail(now, "refused")
        else:
            core.update(Observation(running=1, inflight=core.target, time=now))
        times.append(now)
        if asked is not None:
            asked.append(wants_fast_polls(core.policy))
        now = core.next_poll_at
    return times


def test_fast_while_ramping_one_more_then_back_on_the_regular_grid() -> None:
    core = ControllerCore(policy=Scripted(fast_for=3), poll_interval_s=12, ramp_poll_divisor=6, poll_jitter=0)
    # Two polls leave the policy ramping (0, 2); the third ends it (4); one more look (6); then the regular
    # polls where the throttle put them from the first poll: 12, 24, 36.
    assert poll_times(core, 40) == [0, 2, 4, 6, 12, 24, 36]
    assert core.fast_polls == 3


def test_divisor_one_is_the_plain_throttle() -> None:
    core = ControllerCore(policy=Scripted(fast_for=3), poll_interval_s=12, ramp_poll_divisor=1, poll_jitter=0)
    assert poll_times(core, 40) == [0, 12, 24, 36]
    assert core.fast_polls == 0


def test_a_policy_without_the_trait_gets_the_throttle() -> None:
    assert wants_fast_polls(AIMD()) is False
    core = ControllerCore(policy=AIMD(), poll_interval_s=12, ramp_poll_divisor=6, poll_jitter=0)
    assert poll_times(core, 30) == [0, 12, 24]


class Broken:
    @property
    def wants_fast_polls(self) -> bool:
        raise RuntimeError("plug-in bug")

    def next_target(self, target: float, obs: Observation) -> float:
        return target


class Truthy:
    wants_fast_polls = "yes"

    def next_target(self, target: float, obs: Observation) -> float:
        return target


@pytest.mark.parametrize("policy", [Broken(), Truthy()])
def test_only_a_real_true_asks_and_a_raising_trait_reads_false(policy: object) -> None:
    assert wants_fast_polls(policy) is False  # type: ignore[arg-type]
    core = ControllerCore(policy=policy, poll_interval_s=12, ramp_poll_divisor=6, poll_jitter=0)  # type: ignore[arg-type]
    assert poll_times(core, 30) == [0, 12, 24]


def test_at_the_ceiling_the_ramp_has_nowhere_to_go() -> None:
    core = ControllerCore(policy=Scripted(fast_for=100, answer=1000), ceiling=64, poll_interval_s=12, poll_jitter=0)
    # The first poll already lands on the ceiling: no fast poll, and no extra look after.
    assert poll_times(core, 30) == [0, 12, 24]


def test_a_failed_poll_goes_back_to_the_regular_grid_so_grace_keeps_its_seconds() -> None:
    core = ControllerCore(
        policy=Scripted(fast_for=100), poll_interval_s=12, ramp_poll_divisor=6, grace_polls=3, poll_jitter=0
    )
    # Polls 0 and 2 ramp; the poll at 4 fails: the next one is the regular poll at 12, and it fails too; the
    # failures are 12 s apart from there on, and the fourth in a row (at 36) drops to the floor.
    times = poll_times(core, 40, failing={2, 3, 4, 5})
    assert times == [0, 2, 4, 12, 24, 36]
    assert core.consecutive_failures == 4 and core.target == core.lower


def test_a_fast_poll_on_the_grid_moves_the_regular_poll_on() -> None:
    core = ControllerCore(policy=Scripted(fast_for=8), poll_interval_s=12, ramp_poll_divisor=6, poll_jitter=0)
    # Polls every 2 s through t = 14 (the one at 12 stood in for the regular poll), one more at 16, then 24.
    assert poll_times(core, 40) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 24, 36]


@given(
    divisor=st.sampled_from([1.0, 2.0, 4.0, 6.0]),
    fast_for=st.integers(min_value=0, max_value=20),
    failing=st.sets(st.integers(min_value=0, max_value=25), max_size=6),
)
def test_gaps_are_the_interval_or_its_fraction_and_regular_polls_keep_their_grid(
    divisor: float, fast_for: int, failing: set[int]
) -> None:
    interval = 12.0
    policy = Scripted(fast_for=fast_for)
    core = ControllerCore(policy=policy, poll_interval_s=interval, ramp_poll_divisor=divisor, poll_jitter=0)
    asked: list[bool] = []
    times = poll_times(core, 200, failing=failing, asked=asked)
    gaps = [after - before for before, after in itertools.pairwise(times)]
    # Never sooner than the fast interval, never later than the throttle's.
    assert all(interval / divisor - 1e-9 <= gap <= interval + 1e-9 for gap in gaps)
    # Once the policy stopped asking, after at most one more look, the regular polls: 12 s apart, on the grid
    # of the first poll.
    last_ask = max((k for k, a in enumerate(asked) if a), default=-1)
    settled = times[last_ask + 3 :]
    assert all(t / interval == pytest.approx(round(t / interval)) for t in settled)
    assert all(b - a == pytest.approx(interval) for a, b in itertools.pairwise(settled))
    if divisor == 1:
        assert core.fast_polls == 0 and all(gap == pytest.approx(interval) for gap in gaps)


def _gaps(policy_factory: object, scenario: str, monkeypatch: pytest.MonkeyPatch, divisor: str | None) -> list:  # type: ignore[type-arg]
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_JITTER", "0")  # the exact grid (the jitter's own tests are below)
    if divisor is not None:
        monkeypatch.setenv("MODEL_CONCURRENCY_RAMP_POLL_DIVISOR", divisor)
    trace = simulate(load_scenario(SIMS / f"{scenario}.toml").scaled(0.1), policy_factory=policy_factory)  # type: ignore[arg-type]
    return [[round(float(g), 9) for g in np.diff(c.poll_times)] for c in trace.clients]


def test_the_lab_client_follows_the_core_schedule_alone_on_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ramp``: adaptive alone on an engine with KV figures polls every 2 s until the ramp ends (plus one),
    then every 12 s on the grid of its first poll, and never fast again."""
    (gaps,) = _gaps(Adaptive, "ramp", monkeypatch, None)
    fast = next(k for k, gap in enumerate(gaps) if gap != 2.0)
    assert 2 <= fast <= 6, gaps  # a ramp of a few polls, each 2 s
    # Back on the regular grid (the first regular gap only completes the 12 s), then 12 s for good.
    assert (2.0 * fast + gaps[fast]) % 12.0 == 0 and set(gaps[fast + 1 :]) == {12.0}, gaps


def test_the_knob_at_one_and_a_shared_engine_keep_the_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    (gaps,) = _gaps(Adaptive, "ramp", monkeypatch, "1")
    assert set(gaps) == {12.0}
    monkeypatch.delenv("MODEL_CONCURRENCY_RAMP_POLL_DIVISOR")
    # Four clients on one engine: adaptive's first ramp is doubling there, at everyone's regular cadence.
    for client_gaps in _gaps(Adaptive, "multi-client", monkeypatch, None):
        assert set(client_gaps) == {12.0}


# -- the jitter ---------------------------------------------------------------------------------------------------
class NoDraws:
    """A stream that must not be read: with jitter 0 the schedule is the grid and draws nothing."""

    def random(self) -> float:
        raise AssertionError("drew from the stream with jitter 0")


def test_each_regular_wait_is_the_interval_times_one_plus_jitter_times_a_seeded_draw() -> None:
    core = ControllerCore(policy=AIMD(), poll_interval_s=12, poll_jitter=0.1, jitter_rng=random.Random(5))
    twin, expected = random.Random(5), [0.0]
    while expected[-1] <= 100:
        expected.append(expected[-1] + 12 * (1 + 0.1 * (2 * twin.random() - 1)))
    times = poll_times(core, 100)
    assert times == expected[:-1]
    assert all(10.8 <= b - a <= 13.2 for a, b in itertools.pairwise(times))


def test_jitter_zero_is_the_exact_grid_and_draws_nothing() -> None:
    core = ControllerCore(policy=Scripted(fast_for=3), poll_interval_s=12, poll_jitter=0, jitter_rng=NoDraws())
    assert poll_times(core, 40) == [0, 2, 4, 6, 12, 24, 36]


def test_the_ramp_polls_are_jittered_by_the_same_share() -> None:
    core = ControllerCore(policy=Scripted(fast_for=3), poll_interval_s=12, poll_jitter=0.1, jitter_rng=random.Random(2))
    twin = random.Random(2)
    factors = [1 + 0.1 * (2 * twin.random() - 1) for _ in range(4)]
    times = poll_times(core, 40)
    # Three fast polls, each 2 s × its draw; the regular poll is due 12 s × the first poll's draw after the first
    # poll (the grid the fast polls stand beside), then 12 s × each later draw.
    fast = [0.0, 2 * factors[0], 2 * factors[0] + 2 * factors[1], 2 * factors[0] + 2 * factors[1] + 2 * factors[2]]
    assert times[:4] == pytest.approx(fast)
    assert times[4] == pytest.approx(12 * factors[0])
    assert times[5] - times[4] == pytest.approx(12 * (1 + 0.1 * (2 * twin.random() - 1)))


@given(
    jitter=st.floats(min_value=0.0, max_value=0.99),
    seed=st.integers(min_value=0, max_value=2**32),
    divisor=st.sampled_from([1.0, 2.0, 6.0]),
    fast_for=st.integers(min_value=0, max_value=12),
    failing=st.sets(st.integers(min_value=0, max_value=25), max_size=6),
)
def test_every_wait_stays_within_the_jitter_of_its_interval(
    jitter: float, seed: int, divisor: float, fast_for: int, failing: set[int]
) -> None:
    interval = 12.0
    core = ControllerCore(
        policy=Scripted(fast_for=fast_for),
        poll_interval_s=interval,
        ramp_poll_divisor=divisor,
        poll_jitter=jitter,
        jitter_rng=random.Random(seed),
    )
    asked: list[bool] = []
    times = poll_times(core, 300, failing=failing, asked=asked)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    low, high = interval / divisor * (1 - jitter), interval * (1 + jitter)
    assert all(low - 1e-9 <= gap <= high + 1e-9 for gap in gaps)
    # Once the ramp is over (and its extra look, and the poll that completes the grid), each wait is a regular one.
    last_ask = max((k for k, a in enumerate(asked) if a), default=-1)
    settled = times[last_ask + 3 :]
    regular = [b - a for a, b in itertools.pairwise(settled)]
    assert all(interval * (1 - jitter) - 1e-9 <= gap <= high + 1e-9 for gap in regular)


@pytest.mark.parametrize("bad", [-0.01, 1.0, 1.5, math.nan, math.inf])
def test_a_jitter_outside_zero_to_one_is_refused_with_its_value(bad: float) -> None:
    with pytest.raises(ValueError, match="poll_jitter must be >= 0 and < 1"):
        ControllerCore(policy=AIMD(), poll_jitter=bad)
    core = ControllerCore(policy=AIMD())
    core.poll_jitter = bad  # set past the constructor: the next schedule refuses it, nothing is drawn
    core.begin_poll(0.0)
    with pytest.raises(ValueError, match="poll_jitter must be >= 0 and < 1"):
        core.update(Observation(running=1, time=0.0))


def test_the_live_default_is_a_tenth_and_the_knob_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from model_concurrency.runtime import ModelRuntime

    runtime = ModelRuntime(None, name="m", policy=AIMD())
    assert runtime.core.poll_jitter == 0.1 and isinstance(runtime.core.jitter_rng, random.Random)
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_JITTER", "0.25")
    runtime._refresh_knobs()
    assert runtime.core.poll_jitter == 0.25


def test_the_lab_draws_its_waits_from_the_scenario_seed_per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """``multi-client`` at the default jitter: every regular wait within 12 s ± 10 %, not all equal, and the same
    waits again from the same seed; jitter 0 (the knob) puts every client back on its 12 s grid."""
    scenario = load_scenario(SIMS / "multi-client.toml").scaled(0.1)
    first = simulate(scenario, policy_factory=Adaptive)
    again = simulate(scenario, policy_factory=Adaptive)
    for a, b in zip(first.clients, again.clients, strict=True):
        assert np.array_equal(a.poll_times, b.poll_times)
        gaps = np.diff(a.poll_times)
        assert np.all(gaps >= 10.8 - 1e-9) and np.all(gaps <= 13.2 + 1e-9) and len(set(gaps)) == len(gaps)
    for client_gaps in _gaps(Adaptive, "multi-client", monkeypatch, None):
        assert set(client_gaps) == {12.0}
