"""One worker-thread pool per model that grows with demand and shrinks when threads sit idle.

Why not ``ThreadPoolExecutor``: its threads never exit until shutdown, and the old gate made one per capacity
value, so a worker whose target moved kept every pool it had ever made. Here a job is only submitted while its
caller holds a slot of the model's limiter, so the number of busy threads is bounded by the model's in-flight
count (the target); an idle thread waits ``idle_timeout_s`` for another job and then exits. Idle threads are
reused last-in-first-out, so after a shrink the surplus ones are the ones left to time out.

Jobs are plain callables that must not raise (the gate wraps ``fn``); a job that raises anyway is logged and the
thread lives on. Threads are daemons: a pool never holds interpreter exit hostage to an idle timeout.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from model_concurrency.config import THREAD_IDLE_S, setting

__all__ = ["WorkerPool", "drop_pools", "pool_for"]

log = logging.getLogger("model_concurrency")

# How long an idle worker thread waits for a job before exiting. Read when a model's pool is created.

Job = Callable[[], None]


class _Slot:
    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.job: Job | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class WorkerPool:
    """Threads for one model's sync calls: started on demand, exiting after ``idle_timeout_s`` without work."""

    def __init__(self, name: str, idle_timeout_s: float) -> None:
        self.name = name
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []
        self.threads = 0

    def submit(self, job: Job) -> None:
        """Run ``job`` on an idle thread, or on a new one when none is idle."""
        with self._lock:
            if self._idle:
                slot = self._idle.pop()
                slot.job = job
                slot.wake.release()
                return
            self.threads += 1
        try:
            threading.Thread(
                target=self._serve, args=(job,), name=f"model-concurrency-{self.name}", daemon=True
            ).start()
        except BaseException:
            with self._lock:
                self.threads -= 1
            raise

    def _serve(self, job: Job) -> None:
        slot = _Slot()
        while True:
            try:
                job()
            except BaseException:  # the gate's jobs do not raise; a bug there must not kill the thread
                log.exception("model %s: a gate job raised", self.name)
            with self._lock:
                self._idle.append(slot)
            if not slot.wake.acquire(timeout=self.idle_timeout_s):
                with self._lock:
                    if any(idle is slot for idle in self._idle):
                        self._idle.remove(slot)
                        self.threads -= 1
                        return
                # A submitter took this slot between the timeout and the lock: its job is on the way.
                slot.wake.acquire()
            assert slot.job is not None
            job, slot.job = slot.job, None

    def __repr__(self) -> str:
        return f"WorkerPool({self.name!r}, threads={self.threads}, idle={len(self._idle)})"


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


def _after_fork_in_child() -> None:
    global _pools_lock
    _pools_lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
