"""One worker-thread pool per model that grows with demand and shrinks when threads sit idle.

Why not ``ThreadPoolExecutor``: its threads never exit until shutdown, so a gate that made one per capacity value
would keep every pool a worker whose target moved had ever made. Here a job is only submitted while its
caller holds a slot of the model's limiter, so the number of busy threads is bounded by the model's in-flight
count (the target); an idle thread waits ``idle_timeout_s`` for another job and then exits. Idle threads are
reused last-in-first-out, so after a shrink the surplus ones are the ones left to time out.

Jobs are plain callables that must not raise (the gate wraps ``fn``); a job that raises anyway is logged and the
thread lives on. Threads are daemons: a pool never holds interpreter exit hostage to an idle timeout.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from model_concurrency._fork import reset_in_forked_child
from model_concurrency.config import THREAD_IDLE_S, setting

__all__ = ["WorkerPool", "drop_pools", "pool_for"]

log = logging.getLogger("model_concurrency")

# How long an idle worker thread waits for a job before exiting. Read when a model's pool is created.

Job = Callable[[], None]


class _Slot:
    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()


class WorkerPool:
    """Threads for one model's sync calls: started on demand, exiting after ``idle_timeout_s`` without work.

    Jobs wait in a FIFO that threads drain between jobs. ``_ready`` counts the threads that will look at the FIFO
    before they next sleep (one that just finished a job, or one woken for a job); a submit wakes an idle thread
    (or starts one) only when the FIFO holds more jobs than that, so every job has a thread on its way and no job
    waits behind another's call. Why: with fast calls, a hand-off to a sleeping thread per job costs two context
    switches per item, which is most of a thread fan-out's overhead (docs/gate.md); a thread that finds the next
    job waiting runs it without sleeping, as ``ThreadPoolExecutor``'s do.
    """

    def __init__(self, name: str, idle_timeout_s: float) -> None:
        self.name = name
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []
        self._jobs: deque[Job] = deque()
        self._ready = 0
        self.threads = 0

    def submit(self, job: Job) -> None:
        """Run ``job`` on a thread that is between jobs, an idle one, or a new one, in that order."""
        with self._lock:
            self._jobs.append(job)
            if len(self._jobs) <= self._ready:
                return
            self._ready += 1
            if self._idle:
                self._idle.pop().wake.release()
                return
            self.threads += 1
        try:
            threading.Thread(target=self._serve, name=f"model-concurrency-{self.name}", daemon=True).start()
        except BaseException:
            with self._lock:
                self.threads -= 1
                self._ready -= 1
                try:
                    self._jobs.remove(job)
                except ValueError:  # a thread between jobs took it meanwhile: it runs, so the submit succeeded
                    return
            raise

    def _serve(self) -> None:
        slot = _Slot()
        jobs = self._jobs
        while True:
            with self._lock:
                self._ready -= 1
                job = jobs.popleft() if jobs else None
                if job is None:
                    self._idle.append(slot)
            if job is not None:
                try:
                    job()
                except BaseException:  # the gate's jobs do not raise; a bug there must not kill the thread
                    log.exception("model %s: a gate job raised", self.name)
                with self._lock:
                    self._ready += 1
                continue
            if not slot.wake.acquire(timeout=self.idle_timeout_s):
                with self._lock:
                    if any(idle is slot for idle in self._idle):
                        self._idle.remove(slot)
                        self.threads -= 1
                        return
                # A submitter woke this slot between the timeout and the lock: a job is on the way.
                slot.wake.acquire()

    def __repr__(self) -> str:
        return f"WorkerPool({self.name!r}, threads={self.threads}, idle={len(self._idle)}, queued={len(self._jobs)})"


_pools: dict[str, WorkerPool] = {}
_pools_lock = threading.Lock()


def pool_for(key: str) -> WorkerPool:
    pool = _pools.get(key)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = WorkerPool(key, max(0.0, setting(*THREAD_IDLE_S)))
    return pool


def drop_pools() -> None:
    """Forget every pool; their threads finish what they run and exit once idle."""
    with _pools_lock:
        _pools.clear()


# A child starts without the parent's pools: their threads did not come with it.
reset_in_forked_child(globals(), "_pools_lock", threading.Lock, _pools)
