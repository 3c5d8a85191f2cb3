"""The direct peers as policies (policies/peers.py): exact values from their published rules, fed Observations."""

from __future__ import annotations

import math

import pytest

from model_concurrency.observation import Observation
from model_concurrency.policies.base import uses_engine_signals
from model_concurrency.policies.peers import AIBrix, BatchGatewayAIMD, LlmdAIMD, QueueTimeAIMD
from model_concurrency.policies.registry import find_preset, load_policy, load_preset

PEERS = {
    "aibrix": AIBrix,
    "llmd-aimd": LlmdAIMD,
    "batch-gateway-aimd": BatchGatewayAIMD,
    "queue-time-aimd": QueueTimeAIMD,
}


def calls(
    ok: int = 0, throttled: int = 0, server: int = 0, other: int = 0, latency: float | None = None, **engine: float
) -> Observation:
    """A poll in which ``ok`` calls succeeded, ``throttled`` were refused (429/503), ``server`` failed with a 5xx
    or dropped, ``other`` failed otherwise (a 400)."""
    errors = throttled + server + other
    return Observation(
        client_calls=ok + errors,
        client_errors=errors,
        client_throttled=throttled,
        client_server_errors=server,
        client_ok_latency_mean_s=latency,
        **engine,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("name", sorted(PEERS))
def test_each_peer_loads_by_name_and_its_preset_states_its_defaults(name: str) -> None:
    policy = load_policy(name)
    assert type(policy) is PEERS[name]
    preset_file = find_preset(name)
    assert preset_file is not None
    preset = load_preset(preset_file)
    assert preset.policy == name
    built = PEERS[name]()
    assert all(getattr(built, k) == v for k, v in preset.params.items())
    assert uses_engine_signals(policy) == (name == "queue-time-aimd")


def test_aibrix_probes_by_a_quarter_per_8_healthy_completions() -> None:
    p = AIBrix()
    # 16 healthy completions: 40 -> 50 -> 62; 16 < a window of 40, so nothing is judged.
    assert p.next_target(40, calls(ok=16, latency=1.0)) == 62
    assert p.next_target(1020, calls(ok=8)) == 1024  # the cap


def test_aibrix_cuts_a_window_with_errors_once_then_grows_by_one() -> None:
    p = AIBrix()
    # 2 overload errors of 10 calls, a full window of 10: x0.9; the errors also reset the streak (no growth).
    assert p.next_target(10, calls(ok=8, throttled=1, server=1)) == pytest.approx(9.0)
    assert not p.probing
    assert p.next_target(9, calls(ok=8)) == 10  # +1 after the first cut, window 8 < 9 not judged
    # A 400 is not an overload error: no cut for it, and it is not a healthy completion either.
    assert p.next_target(10, calls(ok=2, other=5)) == 10


def test_aibrix_cuts_a_slow_window_against_its_ewma() -> None:
    p = AIBrix()
    assert p.next_target(8, calls(ok=8, latency=1.0)) == 10  # +2 (probing), window judged: sets the EWMA to 1.0
    # +2 -> 12, then a window at 2.0 s > 1.75 x 1.0: x0.8.
    assert p.next_target(10, calls(ok=10, latency=2.0)) == pytest.approx(9.6)
    assert not p.probing


def test_llmd_slow_start_halves_once_per_flight_then_grows_by_one_over_w() -> None:
    p = LlmdAIMD()
    assert p.next_target(4, calls(ok=10)) == 14  # slow start: +1 per accepted request
    assert p.next_target(14, calls(ok=4, throttled=1)) == 7  # halve; the threshold is now 7
    # A rejection of the same flight (fewer than 7 calls finished since the cut) is ignored; growth is 1/w each.
    assert p.next_target(7, calls(ok=2, throttled=1)) == pytest.approx(7 + 2 / 7)
    w = 7 + 2 / 7
    assert p.next_target(w, calls(ok=4)) == pytest.approx(w + 4 / w)  # the flight of 7 calls has now finished
    assert p.next_target(8, calls(throttled=1)) == 4  # a new flight: its rejection halves
    assert LlmdAIMD().next_target(250, calls(ok=20)) == 256  # max 256
    assert LlmdAIMD().next_target(1, calls(throttled=3)) == 1  # min 1
    assert LlmdAIMD().next_target(10, calls(ok=5, server=3)) == 15  # a 5xx is not a capacity rejection


def test_batch_gateway_starts_at_20_halves_per_rejection_and_adds_one_per_clean_window() -> None:
    p = BatchGatewayAIMD()
    assert p.next_target(4, calls()) == 20
    assert p.next_target(20, calls(ok=45)) == 22  # 20 clean -> 21, 21 more -> 22, 4 left over
    assert p.next_target(22, calls(ok=3, throttled=1, server=1)) == 5.5  # two rejections: x0.25
    assert p.next_target(6, calls(throttled=3)) == 5  # the minimum
    assert p.next_target(100, calls(ok=500)) == 100  # the maximum
    assert p.next_target(30, calls(ok=4, other=9)) == 30  # 400s are not rejections


def test_queue_time_aimd_starts_at_32_and_cuts_above_its_target() -> None:
    p = QueueTimeAIMD()
    assert p.next_target(4, calls(ok=3)) == 32
    assert p.next_target(32, calls(ok=40, queue_time_mean_s=0.2)) == 33  # one window of 32 completions: +1
    assert p.next_target(33, calls(ok=10, queue_time_mean_s=0.8)) == pytest.approx(24.75)
    assert p.next_target(24.75, calls(ok=10)) == 24.75  # no queue reading, too few completions: hold


@pytest.mark.parametrize("factory", [AIBrix, LlmdAIMD, BatchGatewayAIMD, QueueTimeAIMD])
def test_a_peer_never_answers_a_non_finite_or_negative_target(factory: type) -> None:
    p = factory()
    target = 8.0
    for obs in [calls(ok=50, latency=0.5), calls(throttled=40, server=10), calls(ok=3, latency=30.0)] * 5:
        target = p.next_target(target, obs)
        assert math.isfinite(target) and target > 0


def test_the_recorder_counts_server_errors_apart_from_refusals_and_bad_requests() -> None:
    from model_concurrency.controller import CallRecorder
    from model_concurrency.observation import observe

    recorder = CallRecorder()
    recorder.record(0.5, ok=True)
    for status in (429, 503, 500, 408, None, 400):
        recorder.record(0.01, ok=False, status=status)
    stats = recorder.drain()
    assert (stats.calls, stats.errors, stats.throttled, stats.server_errors) == (7, 6, 2, 3)
    obs = observe(None, None, inflight=0, time=0.0, calls=stats)
    assert (obs.client_errors, obs.client_throttled, obs.client_server_errors) == (6, 2, 3)
    assert recorder.drain().server_errors == 0
