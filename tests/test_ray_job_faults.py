"""A job's worker side without Ray: a grant of 0, a renewal whose answer is late, configurations that differ.

The worker's side (ray_job.py's ``_JobClient``) is driven here by hand: its grants come from a real
:class:`~model_concurrency.lease.LeaseBook` called directly, where Ray would carry them, and its calls in flight are
real slots of its runtime's limiter. What Ray adds (the actor, the renewal thread, answers that arrive late) is
tests/test_ray_job.py's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterator
from typing import Any

import pytest

from model_concurrency.lease import Grant, LeaseBook, LeaseConfig, LeaseConfigError
from model_concurrency.ray_job import _client, _clients, _JobClient, _Session
from model_concurrency.runtime import LeaseView, ModelRuntime

CONFIG = LeaseConfig(floor=4, ceiling=4, policy="adaptive")  # a job's target of exactly 4
LEASE_S = 4.0


def book() -> LeaseBook:
    return LeaseBook("j", "m", CONFIG, lease_s=LEASE_S)


def worker(name: str) -> tuple[_JobClient, _Session]:
    """A worker's side of job ``j`` over its own runtime; no coordinator is ever reached from here."""
    client = _JobClient("j", ModelRuntime(None, name=name), creator=None, lease_config=CONFIG)  # type: ignore[arg-type]
    return client, _Session(CONFIG)


def granted(client: _JobClient, session: _Session, grant: Grant) -> None:
    client._granted(session, grant, sent_at=time.monotonic())


def run(client: _JobClient, calls: int) -> None:
    """``calls`` calls of the worker start (and stay in flight): its limiter's slots, taken as the gate takes them."""
    for _ in range(calls):
        assert client.runtime.limits.try_acquire()  # type: ignore[attr-defined]


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.01)


@pytest.fixture
def thread() -> Iterator[Callable[[Callable[[], Any]], threading.Thread]]:
    started: list[threading.Thread] = []

    def start(target: Callable[[], Any]) -> threading.Thread:
        started.append(threading.Thread(target=target, daemon=True))
        started[-1].start()
        return started[-1]

    yield start
    for t in started:
        t.join(30)
        assert not t.is_alive()


# -- a worker granted nothing -------------------------------------------------------------------------------------
def test_workers_granted_nothing_wait_for_a_share_and_none_is_left_behind() -> None:
    """Six workers of three items each under a target of 4: by the split, two are granted 0. A worker starts calls
    only up to its permits (none at 0) and renews once a round, its calls of the round before done. The job never
    has more than its target in flight, and the workers granted 0 get shares as the others' demand ends."""
    leases = book()
    left = {f"w{i}": 3 for i in range(6)}
    running = dict.fromkeys(left, 0)
    grants = {w: leases.request(w, left[w], now=0.0) for w in left}
    assert sorted(leases.shares().values()) == [0, 0, 1, 1, 1, 1]
    rounds, waited = 0, set()
    while any(left.values()):
        rounds += 1
        assert rounds <= 10, f"stuck: {left}"
        for w in left:
            left[w] -= running[w]
            running[w] = 0
        for w in left:
            grants[w] = grant = leases.renew(w, left[w], now=float(rounds), unused=grants[w].held)
            running[w] = min(grant.permits, left[w])
            assert sum(running.values()) <= leases.target
            if left[w] and not grant.permits:
                waited.add(w)
    assert waited == {"w4", "w5"}  # the rounding's ties go to the smaller ids; the others wait their turn
    ledger = leases.ledger()
    assert ledger.granted == ledger.returned + ledger.outstanding and ledger.expired == 0


def test_a_worker_granted_nothing_holds_its_items_back_until_a_grant_lets_them_start(
    thread: Callable[[Callable[[], Any]], threading.Thread],
) -> None:
    leases = book()
    assert leases.request("a", 8, now=0.0).permits == 4  # a's 4 calls run (they are not this test's worker)
    b, session = worker("starved-b")
    granted(b, session, leases.request(session.worker, 8, now=0.0))  # share 2, all 4 still held by a
    assert session.grant is not None and (session.grant.share, session.grant.permits) == (2, 0)
    # The limiter's least is one call; the admission holds the item back instead.
    assert (b.runtime.limiter.limit, b.admission.closed) == (1, True)
    taken: list[int] = []
    thread(lambda: taken.extend(b.admission.items([1, 2, 3], on_a_loop=False)))
    assert taken == []
    leases.renew("a", 8, now=1.0, unused=4)  # a's calls ended: it hands them back
    granted(b, session, leases.renew(session.worker, 8, now=1.0))
    assert (b.runtime.limiter.limit, b.admission.closed) == (2, False)
    wait_until(lambda: taken == [1, 2, 3], "the items are handed over")


def test_an_async_worker_granted_nothing_waits_without_blocking_its_loop() -> None:
    leases = book()
    leases.request("a", 8, now=0.0)
    b, session = worker("starved-async")
    granted(b, session, leases.request(session.worker, 8, now=0.0))
    assert b.admission.closed

    async def opener() -> None:
        for _ in range(3):  # the loop runs on while the items wait
            await asyncio.sleep(0)
        leases.renew("a", 8, now=1.0, unused=4)
        granted(b, session, leases.renew(session.worker, 8, now=1.0))

    async def main() -> list[int]:
        items = b.admission.items([1, 2], on_a_loop=True)
        assert isinstance(items, AsyncIterable)
        opening = asyncio.ensure_future(opener())
        taken = [item async for item in items]
        await opening
        return taken

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [1, 2]


def test_a_call_that_meets_a_grant_of_0_in_its_slot_waits_there_and_is_not_counted_as_running(
    thread: Callable[[Callable[[], Any]], threading.Thread],
) -> None:
    """Its item was handed over under a grant; a renewal went out with nothing running (handing every permit back,
    so nothing may start until its answer); then the item took its slot. The call waits in the slot, and the worker
    counts it as not running, or its next renewal would keep a permit for a call that is not running."""
    leases = book()
    b, session = worker("parked")
    granted(b, session, leases.request(session.worker, 8, now=0.0))
    assert session.grant is not None and session.grant.permits == 4
    assert b._hand_back(session.grant) == (4, 0) and b.admission.closed  # the renewal goes out
    called: list[int] = []
    run(b, 1)  # the item's slot
    thread(lambda: b.admission.calls(called.append)(7))
    wait_until(lambda: b.admission.parked == 1, "the call waits in its slot")
    assert b.runtime.limits.inflight() == 1 and b._running() == (0, 0) and called == []
    granted(b, session, leases.renew(session.worker, 8, now=1.0, unused=4))  # the answer
    wait_until(lambda: called == [7], "the call ran once the grant let it")
    assert b.admission.parked == 0


# -- a renewal whose answer is late -------------------------------------------------------------------------------
def test_what_a_renewal_hands_back_is_not_used_while_its_answer_travels() -> None:
    """A worker that hands permits back must not start calls on them before the answer: the book may grant them to
    another at once. With a coordinator that answers late (a second, say), that window is the whole round trip."""
    leases = book()
    a, session = worker("handing-back")
    granted(a, session, leases.request(session.worker, 8, now=0.0))
    assert a.runtime.limiter.limit == 4
    run(a, 2)  # two of its four permits in use
    assert leases.request("b", 8, now=0.5).permits == 0  # b's share is 2, but a holds all 4
    assert session.grant is not None
    assert a._hand_back(session.grant) == (2, 0)  # the renewal goes out ...
    assert a.runtime.limiter.limit == 2  # ... and until its answer no call starts on top of the two running
    answer = leases.renew(session.worker, 8, now=1.0, unused=2)
    b = leases.renew("b", 8, now=1.0)  # the book grants what a handed back at once
    assert b.permits == 2
    assert a.runtime.limiter.limit + b.permits <= leases.target
    granted(a, session, answer)
    assert a.runtime.limiter.limit == answer.permits == 2
    for _ in range(2):
        a.runtime.limits.release()  # type: ignore[attr-defined]
    assert a._hand_back(answer) == (2, 0) and a.admission.closed  # nothing running: nothing starts until the answer


# -- the worker's runtime under a grant ---------------------------------------------------------------------------
def test_a_lease_sets_the_workers_limits_and_its_published_state() -> None:
    """The worker's runtime under a grant (no Ray needed): the grant is the limit, a grant of no tokens still lets
    one weighted call through (the limiter's least budget), and the published state says whose lease it is."""
    runtime = ModelRuntime(None, name="leased")
    assert runtime.lease(LeaseView("j", 3, tokens=0, job_target=6)) == 3
    assert (runtime.limiter.limit, runtime.current_budget(), runtime.leased()) == (3, 1, True)
    state = runtime.state()
    assert (state.job, state.grant, state.job_target, state.lease_lapsed, state.current_target) == ("j", 3, 6, False, 3)
    runtime.lease(LeaseView("j", None, job_target=6), start=5)  # lapsed: the runtime decides alone again
    state = runtime.state()
    assert (runtime.leased(), state.grant, state.lease_lapsed, runtime.current_budget()) == (False, None, True, None)


# -- workers from different configurations -----------------------------------------------------------------------
def test_workers_with_another_floor_or_ceiling_are_refused_naming_both() -> None:
    leases = book()
    leases.request("w0", 2, now=0.0, config=CONFIG)
    for other in (LeaseConfig(8, 4, "adaptive"), LeaseConfig(4, 64, "adaptive"), LeaseConfig(4, 4, "aimd")):
        with pytest.raises(LeaseConfigError) as refused:
            leases.request("w1", 2, now=0.0, config=other)
        message = str(refused.value)
        assert repr(other) in message and repr(CONFIG) in message and "'w1'" in message
    assert leases.held() == {"w0": 2}  # a refusal takes nothing


def test_a_process_that_asks_for_a_job_with_another_ceiling_is_refused_naming_both() -> None:
    runtime = ModelRuntime(None, name="two-configs")
    try:
        _client("two-configs-job", runtime, None, CONFIG)  # type: ignore[arg-type]
        with pytest.raises(LeaseConfigError) as refused:
            _client("two-configs-job", runtime, None, LeaseConfig(4, 64, "adaptive"))  # type: ignore[arg-type]
    finally:
        _clients.pop(("two-configs-job", runtime.name), None)
    message = str(refused.value)
    assert "ceiling=4," in message and "ceiling=64," in message and "'two-configs-job'" in message
