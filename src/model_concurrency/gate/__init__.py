"""The fan-out gate: one resizable limiter per model behind map_concurrent and map_concurrent_sync.

Layers, bottom up: :mod:`.limiter` (pure bookkeeping, the invariant), :mod:`.model_limiter` (that core under a
lock, waking asyncio and thread waiters; one per model), :mod:`.pool` (one self-shrinking thread pool per model),
:mod:`.target` (a fan-out's hold on its model's runtime), :mod:`.fanout` (the bookkeeping both fan-outs share),
then the fronts :mod:`.aio`, :mod:`.threaded` and :mod:`.slot`. The limiters belong to the model runtimes
(:mod:`model_concurrency.runtime`); resetting those drops pools and stats through the hook registered here; calls
in flight keep the objects they hold.
"""

from __future__ import annotations

from model_concurrency.gate.aio import imap_concurrent, map_concurrent
from model_concurrency.gate.limiter import LimiterCore
from model_concurrency.gate.model_limiter import ModelLimiter
from model_concurrency.gate.outage import ModelUnreachable
from model_concurrency.gate.pool import WorkerPool, drop_pools, pool_for
from model_concurrency.gate.retries import RetryPolicy
from model_concurrency.gate.slot import slot
from model_concurrency.gate.stats import GateStats, gate_stats, reset_stats
from model_concurrency.gate.threaded import map_concurrent_sync
from model_concurrency.runtime import limiter_for, on_reset, registered_limiters

__all__ = [
    "GateStats",
    "LimiterCore",
    "ModelLimiter",
    "ModelUnreachable",
    "RetryPolicy",
    "WorkerPool",
    "gate_stats",
    "imap_concurrent",
    "limiter_for",
    "map_concurrent",
    "map_concurrent_sync",
    "pool_for",
    "registered_limiters",
    "slot",
]


def _drop_all() -> None:
    drop_pools()
    reset_stats()


on_reset(_drop_all)
