"""The thread gate's parts: the worker pool's FIFO hand-off and a call's ``capacity=`` permits."""

from __future__ import annotations

import threading

from fault_servers import wait_until
from model_concurrency.gate.pool import WorkerPool
from model_concurrency.gate.threaded import _Permits


def test_a_queued_job_never_waits_behind_a_blocked_one() -> None:
    """Every submitted job gets a thread on its way: a job stuck in its call does not hold the next one back."""
    pool = WorkerPool("pooltest-block", idle_timeout_s=0.05)
    release = threading.Event()
    ran: list[int] = []

    def blocked() -> None:
        release.wait(15)
        ran.append(0)

    pool.submit(blocked)
    for i in range(1, 4):
        pool.submit(lambda i=i: ran.append(i))
    assert wait_until(lambda: sorted(ran) == [1, 2, 3])
    release.set()
    assert wait_until(lambda: sorted(ran) == [0, 1, 2, 3])
    assert wait_until(lambda: pool.threads == 0)  # idle threads time out and exit


def test_many_fast_jobs_all_run_on_few_threads_and_a_raising_job_does_not_kill_its_thread() -> None:
    pool = WorkerPool("pooltest-fast", idle_timeout_s=0.05)
    done = threading.Semaphore(0)
    lock = threading.Lock()
    count = [0]

    def job() -> None:
        with lock:
            count[0] += 1
        done.release()

    def bad() -> None:
        done.release()
        raise RuntimeError("a bug in a job")

    for i in range(2_000):
        pool.submit(bad if i == 7 else job)
    for _ in range(2_000):
        assert done.acquire(timeout=15)
    assert count[0] == 1_999
    assert wait_until(lambda: pool.threads == 0)


def test_permits_count_hand_over_and_survive_a_timed_out_wait() -> None:
    permits = _Permits(2)
    assert permits.try_acquire() and permits.acquire(0.0)
    assert not permits.try_acquire()
    assert not permits.acquire(0.01)  # none came: withdrawn, nothing taken
    permits.release()
    assert permits.free == 1 and permits.try_acquire()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(permits.acquire(15.0)))
    waiter.start()
    assert wait_until(lambda: permits._waiting)
    permits.release()  # handed straight to the waiting driver, not counted as free
    waiter.join()
    assert got == [True] and permits.free == 0
    permits.release()
    permits.release()
    assert permits.free == 2
