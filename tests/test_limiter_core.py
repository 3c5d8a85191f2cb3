"""Exact walkthroughs of the pure limiter core: every call's return value and the whole state after it."""

from __future__ import annotations

import pytest

from model_concurrency.gate.limiter import LimiterCore


def state(core: LimiterCore[str]) -> tuple[int, int, int]:
    return core.limit, core.inflight, core.waiting


def test_trio_walkthrough() -> None:
    # trio's test: 2 holders and 3 waiting; +2 gives 4 holders; -3 gives 4 held against a total of 1;
    # three releases admit nobody; the fourth admits one.
    core: LimiterCore[str] = LimiterCore(2)
    assert core.try_acquire() and core.try_acquire()
    assert [core.acquire_or_enqueue(w) for w in "abc"] == [False, False, False]
    assert state(core) == (2, 2, 3)
    assert core.resize(4) == ["a", "b"]
    assert state(core) == (4, 4, 1)
    assert core.resize(1) == []
    assert state(core) == (1, 4, 1)
    assert [core.release() for _ in range(3)] == [[], [], []]
    assert state(core) == (1, 1, 1)
    assert core.release() == ["c"]
    assert state(core) == (1, 1, 0)


def test_shrink_then_grow_with_holders_in_does_not_over_admit() -> None:
    # The anyio bug: 4 holders, total 4 -> 1 -> 3 admitted 6 against a total of 3.
    core: LimiterCore[int] = LimiterCore(4)
    assert all(core.try_acquire() for _ in range(4))
    assert [core.acquire_or_enqueue(w) for w in range(4)] == [False] * 4
    assert core.resize(1) == []
    assert core.resize(3) == []
    assert state(core) == (3, 4, 4)  # type: ignore[arg-type]
    assert core.release() == []
    assert core.release() == [0]
    assert state(core) == (3, 3, 3)  # type: ignore[arg-type]


def test_fifo_hand_off_before_wake_blocks_queue_jumping() -> None:
    core: LimiterCore[str] = LimiterCore(1)
    assert core.try_acquire()
    assert not core.acquire_or_enqueue("first")
    assert not core.acquire_or_enqueue("second")
    assert core.release() == ["first"]
    # "first" has not woken yet, but its slot is taken: a newcomer cannot jump in.
    assert not core.try_acquire()
    assert core.release() == ["second"]
    assert state(core) == (1, 1, 0)


def test_cancel_before_and_after_grant() -> None:
    core: LimiterCore[str] = LimiterCore(1)
    assert core.try_acquire()
    assert not core.acquire_or_enqueue("a")
    assert not core.acquire_or_enqueue("b")
    assert core.cancel("a") is True  # withdrawn while queued
    assert core.release() == ["b"]
    assert core.cancel("b") is False  # already granted: the canceller must pass the slot on
    assert core.release() == []
    assert state(core) == (1, 0, 0)


def test_pinned_slots_count_but_never_wait() -> None:
    core: LimiterCore[str] = LimiterCore(2)
    core.acquire_pinned()
    core.acquire_pinned()
    core.acquire_pinned()
    assert state(core) == (2, 3, 0)
    assert not core.try_acquire()  # gated callers wait until the pinned ones drain below the limit
    assert not core.acquire_or_enqueue("g")
    assert core.release() == []
    assert core.release() == ["g"]
    assert state(core) == (2, 2, 0)


def test_growth_admits_waiters_at_once() -> None:
    core: LimiterCore[int] = LimiterCore(1)
    assert core.try_acquire()
    for w in range(5):
        core.acquire_or_enqueue(w)
    assert core.resize(4) == [0, 1, 2]
    assert state(core) == (4, 4, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", None])
def test_bad_limits_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        LimiterCore(bad)  # type: ignore[arg-type]
    core: LimiterCore[str] = LimiterCore(1)
    with pytest.raises(ValueError):
        core.resize(bad)  # type: ignore[arg-type]


def test_misuse_is_loud() -> None:
    core: LimiterCore[str] = LimiterCore(1)
    with pytest.raises(RuntimeError, match="release without a matching acquire"):
        core.release()
    assert core.try_acquire()
    assert not core.acquire_or_enqueue("a")
    with pytest.raises(ValueError, match="already queued"):
        core.acquire_or_enqueue("a")
