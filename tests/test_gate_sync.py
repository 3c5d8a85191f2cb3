"""map_concurrent_sync: order, errors, timeouts, the self-shrinking pool, nesting, and pinned capacity."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from model_concurrency import gate_stats, map_concurrent_sync, register_model, reset_runtimes
from model_concurrency.gate import limiter_for, pool_for, registered_limiters


class Peak:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def wrap(self, fn: Callable[[int], Any]) -> Callable[[int], Any]:
        def call(x: int) -> Any:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                return fn(x)
            finally:
                with self.lock:
                    self.now -= 1

        return call


def wait_until(condition: Callable[[], bool], limit_s: float = 15.0) -> bool:
    """Poll a condition (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_results_in_order_and_capacity_is_the_concurrency() -> None:
    peak = Peak()
    out = map_concurrent_sync(range(200), peak.wrap(lambda x: (time.sleep(0.0005), x * 3)[1]), capacity=6)
    assert out == [x * 3 for x in range(200)]
    assert peak.peak == 6
    assert registered_limiters()["default"].inflight() == 0


def test_async_fn_runs_under_asyncio_run() -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    assert map_concurrent_sync(range(30), double, capacity=4) == [2 * x for x in range(30)]

    async def from_a_running_loop() -> list[int]:
        return map_concurrent_sync(range(5), double, capacity=2)  # bridged on a helper thread

    assert asyncio.run(from_a_running_loop()) == [0, 2, 4, 6, 8]


def test_first_error_is_raised_after_running_calls_finish() -> None:
    peak = Peak()

    def call(x: int) -> int:
        time.sleep(0.0005)
        if x == 7:
            raise ValueError("seven")
        return x

    with pytest.raises(ValueError, match="seven") as info:
        map_concurrent_sync(range(10_000), peak.wrap(call), capacity=4)
    assert peak.now == 0
    assert "item 7 failed first" in info.value.__notes__[0]
    assert gate_stats("default").calls < 10_000


def test_return_exceptions_and_timeout() -> None:
    release = threading.Event()

    def call(x: int) -> int:
        if x == 2:
            release.wait(10)
        if x == 4:
            raise OSError("four")
        return x

    # 1 s: only item 2 blocks; the others must not be timed out by a loaded machine's thread hand-offs.
    out = map_concurrent_sync(range(6), call, capacity=3, timeout=1.0, return_exceptions=True)
    assert isinstance(out[2], TimeoutError) and isinstance(out[4], OSError)
    assert [out[i] for i in (0, 1, 3, 5)] == [0, 1, 3, 5]
    release.set()
    assert wait_until(lambda: registered_limiters()["default"].inflight() == 0)


@pytest.mark.slow
def test_thread_count_returns_to_baseline_after_fan_outs_at_several_capacities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_THREAD_IDLE_S", "0.05")
    reset_runtimes()  # pools are created afresh with the short idle timeout

    def ours() -> int:
        return sum(t.name in ("model-concurrency-pooltest", "model-concurrency-m") for t in threading.enumerate())

    baseline = threading.active_count()  # threads of earlier tests' pools may still be idling out: <= below
    for capacity in (2, 16, 48, 8):
        out = map_concurrent_sync(range(300), lambda x: (time.sleep(0.001), x)[1], model="pooltest", capacity=capacity)
        assert out == list(range(300))
        assert pool_for("pooltest").threads <= 48  # threads follow the slots, not one pool per capacity
    register_model("m", base_url=None, max_parallel_calls=12)
    assert map_concurrent_sync(range(100), lambda x: (time.sleep(0.001), x)[1], model="m") == list(range(100))
    assert pool_for("m").threads <= 12
    assert wait_until(lambda: ours() == 0)
    assert threading.active_count() <= baseline
    assert pool_for("pooltest").threads == 0 and pool_for("m").threads == 0


def test_nested_sync_fan_out_on_the_same_model_does_not_deadlock() -> None:
    register_model("m", base_url=None, max_parallel_calls=2)
    limiter = limiter_for("m", 2)
    peak = 0
    lock = threading.Lock()

    def leaf(y: int) -> int:
        nonlocal peak
        with lock:
            peak = max(peak, limiter.inflight())
        time.sleep(0.0005)
        return y

    def parent(x: int) -> int:
        # Every slot is held by a parent: a nested call that queued for one would wait forever.
        return sum(map_concurrent_sync(range(5), leaf, model="m"))

    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(map_concurrent_sync(range(6), parent, model="m")))
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "nested map_concurrent_sync deadlocked"
    assert out == [[10] * 6]
    assert peak <= 2 and limiter.inflight() == 0


def test_pinned_capacity_counts_in_the_model_in_flight() -> None:
    register_model("m", base_url=None, max_parallel_calls=2)
    limiter = limiter_for("m", 2)
    started = threading.Event()
    go = threading.Event()
    seen: list[int] = []

    def pinned(x: int) -> int:
        started.set()
        go.wait(10)
        return x

    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(map_concurrent_sync(range(5), pinned, model="m", capacity=5))
    )
    thread.start()
    assert wait_until(lambda: limiter.inflight() == 5)  # 5 pinned calls over a limit of 2: counted, not gated
    gated = threading.Thread(target=lambda: seen.extend(map_concurrent_sync(range(3), lambda x: x, model="m")))
    gated.start()
    assert wait_until(lambda: limiter.waiting == 1)  # the gated caller waits for the count to drain below 2
    assert not seen
    go.set()
    thread.join(10)
    gated.join(10)
    assert results == [list(range(5))] and seen == [0, 1, 2]
    assert limiter.inflight() == 0
