"""The growth guard and the outage hand-over: exact rules, and properties of the fail-safe over any outage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency import ControllerCore, Observation
from model_concurrency.guard import GrowthGuard


class Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def next_target(self, target: float, obs: Observation) -> float:
        return self.value


def interval(
    t: float, concurrency: float, rate: float, latency: float, *, ok: bool = True, seconds: float = 10, **extra: int
) -> Observation:
    """One poll interval of ``seconds`` of a client that held ``concurrency`` in flight and finished ``rate``
    calls/s."""
    return Observation(
        ok=ok,
        time=t,
        inflight=int(concurrency),
        inflight_peak=int(concurrency),
        inflight_mean=concurrency,
        client_calls=int(rate * seconds),
        client_latency_mean_s=latency,
        **extra,
    )


def test_guard_caps_growth_that_bought_no_completions_at_the_knee() -> None:
    guard = GrowthGuard()
    assert guard.bound(8, 16, interval(0, 8, 100, 0.08)) == 16  # first poll: no interval to measure
    assert guard.bound(8, 16, interval(10, 8, 100, 0.08)) == 16
    # Double the concurrency, same completions per second (a front-end limit), latency doubles: cap at 8.
    assert guard.bound(16, 32, interval(20, 16, 101, 0.16)) == 8
    assert guard.cap == 8 and guard.fired == 1
    # The cap then rises by 10 % a poll while the policy still wants more...
    assert guard.bound(8, 16, interval(30, 8, 100, 0.08)) == 8.8
    # ...and is dropped once the policy is below it on its own.
    assert guard.bound(8, 8, interval(40, 8.8, 100, 0.088)) == 8
    assert guard.cap is None


def two_polls_at_8() -> GrowthGuard:
    """A guard that saw 8 calls in flight finish 100 a second at 0.08 s, twice: a knee to judge growth from."""
    guard = GrowthGuard()
    guard.bound(8, 16, interval(0, 8, 100, 0.08))
    guard.bound(8, 16, interval(10, 8, 100, 0.08))
    return guard


def test_the_cap_holds_while_the_policy_sits_at_it() -> None:
    guard = two_polls_at_8()
    assert guard.bound(16, 32, interval(20, 16, 101, 0.16)) == 8
    # The policy took the cap as its target and holds there: the cap stays, so its next probe cannot double past it.
    assert guard.bound(8, 8, interval(30, 8, 100, 0.08)) == 8
    assert guard.cap == 8
    assert guard.bound(8, 16, interval(40, 8, 100, 0.08)) == pytest.approx(8.8)


def grown(knee: float, grew_to: float, rate: float, running: tuple[float, float]) -> GrowthGuard:
    """A guard that saw two polls at ``knee`` in flight and then ``grew_to`` at the same completion rate, latency
    rising with concurrency (Little's law), while the engine's ``running`` went from ``running[0]`` to ``[1]``. Each
    poll lasts 40 s, longer than a call."""
    guard = GrowthGuard()
    latency = knee / rate
    guard.bound(knee, 2 * knee, interval(0, knee, rate, latency, running=int(running[0]), seconds=40))
    guard.bound(knee, 2 * knee, interval(40, knee, rate, latency, running=int(running[0]), seconds=40))
    late = interval(80, grew_to, rate, grew_to / rate, running=int(running[1]), seconds=40)
    guard.bound(grew_to, 2 * grew_to, late)
    return guard


def test_guard_lets_through_growth_that_was_a_small_part_of_the_engines() -> None:
    # The same intervals, but the engine's running rose by 80, ten times our growth of 8 (a fleet filling up):
    # the latency rise is the engine's, which the policy reads from its gauges; no cap.
    assert grown(8, 16, 100, (1000, 1080)).fired == 0
    # Running rose by 79 (or by just our 8, the engine taking in our own growth): cap at the knee as before.
    for rise in (79, 8):
        capped = grown(8, 16, 100, (1000, 1000 + rise))
        assert capped.cap == 8 and capped.fired == 1


def test_alone_on_the_engine_growth_that_reached_it_is_the_engines_to_judge() -> None:
    # One client, the whole engine: running follows our in-flight from 69 to 97, the completion rate stays flat
    # and latency rises (a batch slowing its steps, or noise over ~50 calls). The bottleneck the guard exists for
    # sits in front of the engine, and this growth reached it: no cap (``fuzz-41-0135``: 97 -> 64 at 0.2 KV).
    guard = grown(69, 97, 5.0, (69, 97))
    assert guard.cap is None and guard.fired == 0
    # The same growth that stayed in front of the engine (running flat: a front-end limit) is capped at the knee;
    # so is growth beside a neighbour that runs half the engine (our rate there is not ours alone to read).
    for running in ((69, 70), (138, 166)):
        capped = grown(69, 97, 5.0, running)
        assert capped.cap == 69 and capped.fired == 1


def ramp_past_the_front_end(running: int, waiting: int) -> GrowthGuard:
    """The live shape of an embedding server whose API front end, not its engine, is the bottleneck: the first
    ramp's polls at 4, 31 and 250 in flight, completions 77, 469 and 604 a second, the engine running a handful."""
    guard = GrowthGuard()
    guard.bound(4, 4, interval(0, 4, 77, 0.051))
    guard.bound(4, 32, interval(10, 4, 77, 0.051, running=0))
    guard.bound(32, 256, interval(20, 31, 469, 0.066, running=4))
    guard.bound(256, 512, interval(30, 250, 604, 0.37, running=running, waiting=waiting))
    return guard


def test_a_ramp_past_a_front_end_bottleneck_is_capped_at_twice_the_bandwidth_delay_product() -> None:
    # The ramp jumped 31 -> 250, so the lowest sample on the plateau is the current one and the knee rule has
    # nothing below it. 8 of our 250 calls are in the engine: the rest wait in front of it, at six times the
    # lowest latency. The cap: 2 x the best rate x the lowest latency, the concurrency that rate needs unloaded.
    guard = ramp_past_the_front_end(running=8, waiting=0)
    assert guard.cap == pytest.approx(2 * 604 * 0.051) and guard.fired == 1
    # A quarter or more of our calls in the engine (running or queued there; a pooling engine's next batch is on
    # the wire between its steps): the engine's queue is the policy's to read.
    assert ramp_past_the_front_end(running=8, waiting=55).fired == 0
    assert ramp_past_the_front_end(running=8, waiting=54).fired == 1
    # No engine signals at all (a hosted endpoint): nothing says where the calls wait, so no cap.
    assert ramp_past_the_front_end(running=0, waiting=0).fired == 0


def test_the_front_end_cap_waits_for_growth_well_past_it() -> None:
    guard = ramp_past_the_front_end(running=8, waiting=0)
    fit = guard.cap
    assert fit is not None
    # Held at the cap, the knee rule has plateau samples: 62 in flight at the best rate, the cap rising 10 % a poll.
    assert guard.bound(fit, 512, interval(40, fit, 604, fit / 604, running=8)) == pytest.approx(1.1 * fit)
    assert guard.fired == 1


def test_polls_shorter_than_a_call_add_up_to_one_sample() -> None:
    guard = GrowthGuard()
    guard.bound(100, 100, interval(0, 100, 100, 1.0, seconds=0.1))
    # 0.1 s polls of calls that take 1 s: each holds 10 completions, which started at whatever load came before.
    for i in range(1, 5):
        guard.bound(100, 100, interval(0.1 * i, 100, 100, 1.0, seconds=0.1))
    assert not guard.samples  # 40 completions over 0.4 s: shorter than half a call
    guard.bound(100, 100, interval(0.5, 100, 100, 1.0, seconds=0.1))
    assert [(s.concurrency, s.rate, s.latency) for s in guard.samples] == [pytest.approx((100, 100, 1.0))]
    # A poll at another load (beyond 1.25 x the span's mean) starts a new span: the old one's polls are not blended.
    for i in range(6, 10):
        guard.bound(100, 100, interval(0.1 * i, 100, 100, 1.0, seconds=0.1))
    for i in range(10, 16):
        guard.bound(400, 400, interval(0.1 * i, 400, 400, 1.0, seconds=0.1))
    assert [s.concurrency for s in guard.samples] == pytest.approx([100, 400])


def test_guard_ignores_an_interval_that_breaks_littles_law() -> None:
    guard = GrowthGuard()
    guard.bound(32, 256, interval(0, 32, 25, 1.2))
    guard.bound(32, 256, interval(10, 32, 25, 1.2))  # 32 in flight = 25/s x 1.28 s: steady, a sample
    # Right after a jump to 256, the calls that finish were started at the old load: 26/s at 1.7 s explains 44 in
    # flight, not 256. Growth that has not had a call's latency to show up is not judged.
    assert guard.bound(256, 257, interval(20, 256, 26, 1.7)) == 257
    assert guard.cap is None and len(guard.samples) == 1


def test_guard_lets_growth_that_buys_completions_through() -> None:
    guard = two_polls_at_8()
    # Twice the concurrency, 60 % more completions, latency up 25 %: a batching engine below its knee.
    assert guard.bound(16, 32, interval(20, 16, 160, 0.1)) == 32
    # Growth with flat completions but flat latency too (the application, not the server): no cap either.
    assert guard.bound(32, 64, interval(30, 32, 160, 0.1)) == 64
    assert guard.cap is None and guard.fired == 0


def test_guard_off_never_changes_a_proposal_but_keeps_its_baseline() -> None:
    guard = GrowthGuard(enabled=False)
    for i, c in enumerate((8, 16, 32, 64)):
        assert guard.bound(c, 2 * c, interval(10 * i, c, 100, c / 100)) == 2 * c
    assert guard.baseline_latency is not None


def test_guard_ignores_intervals_with_few_calls_errors_or_throttling() -> None:
    guard = GrowthGuard()
    guard.bound(8, 8, interval(0, 8, 100, 0.08))
    guard.bound(8, 8, interval(10, 8, 1, 0.08))  # 10 calls < min_calls
    guard.bound(8, 8, interval(20, 8, 100, 0.08, client_errors=3))
    guard.bound(8, 8, interval(30, 8, 100, 0.08, client_throttled=3))
    assert len(guard.samples) == 0


def test_trouble_needs_positive_evidence() -> None:
    guard = GrowthGuard()
    assert guard.trouble(interval(0, 8, 100, 0.08)) == "no latency baseline"
    guard.bound(8, 8, interval(0, 8, 100, 0.08))
    guard.bound(8, 8, interval(10, 8, 100, 0.08))
    assert guard.baseline_latency == 0.08
    assert guard.trouble(interval(20, 8, 100, 0.08 * 1.5)) is None
    assert guard.trouble(interval(20, 8, 100, 0.08 * 1.51)) is not None
    assert guard.trouble(interval(20, 8, 0, 0.08)) == "no completed calls to judge by"
    assert guard.trouble(interval(20, 8, 100, 0.08, client_errors=1)) == "1 failed calls"
    assert guard.trouble(interval(20, 8, 100, 0.08, client_throttled=2)) == "2 throttled calls"


def _core(grace: int = 1) -> ControllerCore:
    core = ControllerCore(policy=Constant(300), floor=4, ceiling=512, grace_polls=grace)
    for i in range(3):
        core.update(interval(10 * i, 300, 100, 3.0))
    assert core.target == 300
    return core


def test_outage_hands_over_instead_of_dropping_to_the_floor() -> None:
    core = _core(grace=1)
    assert core.update(interval(30, 300, 100, 3.0, ok=False), "refused") == 300  # grace
    assert core.update(interval(40, 300, 100, 3.1, ok=False), "refused") == 300  # hand-over: calls look fine
    assert core.outage_floored is False
    # Latency past 1.5 x the baseline: the floor, and it stays there for the rest of the outage.
    assert core.update(interval(50, 300, 60, 5.0, ok=False), "refused") == 4
    assert core.update(interval(60, 4, 100, 0.1, ok=False), "refused") == 4
    assert core.outage_floored is True
    # Signals back: the policy decides again.
    assert core.update(interval(70, 4, 100, 0.1)) == 300
    assert core.outage_floored is False


def test_outage_with_no_calls_or_with_hand_over_off_is_the_plain_floor() -> None:
    core = _core(grace=1)
    core.fail(30, "refused", inflight=300)
    assert core.fail(40, "refused", inflight=300) == 4  # nothing finished: no evidence, so the floor
    off = _core(grace=1)
    off.outage_handover = False
    off.update(interval(30, 300, 100, 3.0, ok=False), "refused")
    assert off.update(interval(40, 300, 100, 3.0, ok=False), "refused") == 4


outage_poll = st.fixed_dictionaries(
    {
        "calls": st.integers(0, 2000),
        "errors": st.integers(0, 5),
        "throttled": st.integers(0, 5),
        "latency": st.floats(0.001, 100.0),
        "concurrency": st.floats(0.0, 1000.0),
    }
)


@given(
    floor=st.integers(1, 64),
    ceiling=st.integers(1, 1024),
    grace=st.integers(0, 4),
    good=st.lists(st.tuples(st.floats(0.0, 5000.0), st.floats(0.001, 50.0), st.integers(0, 2000)), min_size=1),
    outage=st.lists(outage_poll, min_size=1, max_size=30),
)
def test_fail_safe_bounds_the_target_through_any_outage(
    floor: int, ceiling: int, grace: int, good: list[tuple[float, float, int]], outage: list[dict[str, float]]
) -> None:
    """Within [floor, ceiling] always; during an outage never above the last good target, whatever the calls."""
    core = ControllerCore(policy=Constant(0.0), floor=floor, ceiling=ceiling, grace_polls=grace)
    t = 0.0
    for proposal, latency, calls in good:
        core.policy = Constant(proposal)
        t += 12.0
        obs = Observation(time=t, inflight=calls % 512, client_calls=calls, client_latency_mean_s=latency)
        assert core.lower <= core.update(obs) <= core.upper
    last_good = core.target
    for poll in outage:
        t += 12.0
        obs = Observation(
            ok=False,
            time=t,
            inflight=int(poll["concurrency"]),
            inflight_mean=poll["concurrency"],
            client_calls=int(poll["calls"]),
            client_errors=int(poll["errors"]),
            client_throttled=int(poll["throttled"]),
            client_latency_mean_s=poll["latency"] if poll["calls"] else None,
        )
        target = core.update(obs, "refused")
        assert core.lower <= target <= core.upper
        assert target <= last_good
        if core.consecutive_failures > grace and (poll["errors"] or poll["throttled"] or not poll["calls"]):
            assert target == core.lower


def throttled_interval(t: float, served: int, throttled: int, ok_latency: float) -> Observation:
    """A 10 s poll interval in which ``served`` calls succeeded and ``throttled`` came back 429 (fast)."""
    return Observation(
        time=t,
        inflight_mean=10.0,
        client_calls=served + throttled,
        client_errors=throttled,
        client_throttled=throttled,
        client_latency_mean_s=0.5,  # the fast 429s drag the mean down: the cap must not use it
        client_ok_latency_mean_s=ok_latency,
    )


def test_throttle_cap_fits_the_allowed_rate_by_littles_law() -> None:
    guard = GrowthGuard()
    assert guard.bound(40, 80, interval(0, 40, 10, 2.0)) == 80  # first poll: no interval yet
    # 80 served in 10 s at 2 s each: 16 in flight fit the allowed rate; the cap is 0.95 of that.
    assert guard.bound(40, 80, throttled_interval(10, 80, 20, 2.0)) == pytest.approx(15.2)
    assert guard.throttle_fit == pytest.approx(15.2) and guard.throttle_fired == 1
    # A policy below the cap is left alone, and the cap stays (the limit did not move)...
    assert guard.bound(10, 12, interval(20, 10, 5, 2.0)) == 12
    assert guard.throttle_cap == pytest.approx(15.2)
    # ...and it probes up 1 % a poll only while the policy presses against it.
    assert guard.bound(15, 30, interval(30, 15, 7.5, 2.0)) == pytest.approx(15.2 * 1.01)


def test_throttle_cap_starts_no_higher_than_the_target_the_429s_left() -> None:
    guard = GrowthGuard()
    guard.bound(40, 80, interval(0, 40, 10, 2.0))
    # The bucket's burst inflated the interval's rate; the per-call cuts already brought the target to 9.
    assert guard.bound(9, 18, throttled_interval(10, 80, 20, 2.0)) == 9
    # Pressed, it recovers 10 % a poll up to the estimate, then 1 % a poll past it.
    assert guard.bound(9, 18, interval(20, 9, 4.5, 2.0)) == pytest.approx(9.9)
    guard.throttle_cap = 15.0
    assert guard.bound(15, 30, interval(30, 15, 7.5, 2.0)) == pytest.approx(15.2)
    assert guard.bound(15, 30, interval(40, 15, 7.5, 2.0)) == pytest.approx(15.2 * 1.01)


def test_throttled_with_nothing_served_halves() -> None:
    guard = GrowthGuard()
    guard.bound(40, 80, interval(0, 40, 10, 2.0))
    assert guard.bound(40, 80, throttled_interval(10, 0, 30, 2.0)) == pytest.approx(0.95 * 20)  # half, x the margin


def test_throttle_cap_is_off_with_the_guard() -> None:
    guard = GrowthGuard(enabled=False)
    guard.bound(40, 80, interval(0, 40, 10, 2.0))
    assert guard.bound(40, 80, throttled_interval(10, 80, 20, 2.0)) == 80


def test_a_throttled_call_cuts_the_target_to_the_calls_in_flight() -> None:
    core = ControllerCore(policy=Constant(100), floor=4, ceiling=512)
    core.target_value = 100.0
    assert core.note_throttled(50) == 45  # 0.9 x 50
    assert core.note_throttled(80) == 45  # never raises
    assert core.note_throttled(0) == 4  # the floor still bounds it
    core.guard.enabled = False
    core.target_value = 100.0
    assert core.note_throttled(10) == 100


@given(st.lists(st.integers(0, 600), max_size=30), st.integers(1, 64), st.integers(1, 600))
def test_note_throttled_stays_within_the_bounds(inflights: list[int], floor: int, ceiling: int) -> None:
    core = ControllerCore(policy=Constant(1), floor=floor, ceiling=ceiling)
    core.target_value = float(core.upper)
    for n in inflights:
        before = core.target
        after = core.note_throttled(n)
        assert core.lower <= after <= before <= core.upper
