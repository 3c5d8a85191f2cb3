"""The coordinator of one (job, model) inside Ray: the model's runtime for the whole job, and its lease book.

A job's workers (:mod:`model_concurrency.ray_job`) lease permits from this actor instead of each polling the
engine and deciding alone. It owns a :class:`~model_concurrency.runtime.ModelRuntime` whose limits are the book's
(in flight: the sum of the outstanding grants) and whose call recorder reads the workers' summed reports, so the
runtime's policy, growth guard and poll schedule run unchanged on the job's figures; it polls on that schedule,
one scrape per poll for the whole job, and tells the book the new target each time.

It is a detached, named actor in the Ray namespace :data:`NAMESPACE` (:func:`coordinator_name`), created by
whichever worker asks first (``get_if_exists``, so two first askers get the same one), and it ends itself once no
worker has held a lease for a while.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Protocol

from model_concurrency import config
from model_concurrency.config import ModelSpec, get_model, setting
from model_concurrency.extras import require
from model_concurrency.lease import Grant, LeaseBook, LeaseConfig
from model_concurrency.lease_runtime import BookCalls, BookLimits
from model_concurrency.observation import CallStats
from model_concurrency.runtime import ModelRuntime, RuntimeSettings, adaptive_enabled

__all__ = [
    "NAMESPACE",
    "Configurable",
    "JobCoordinator",
    "coordinator",
    "coordinator_name",
    "decide_in",
    "job_name",
    "lease_config_for",
    "lease_seconds",
]

log = logging.getLogger("model_concurrency")

NAMESPACE = "model_concurrency"
# A lease outlives two polls; never shorter than this, so a poll interval of 0 still gives a worker time to renew.
MIN_LEASE_S = 0.1
# A coordinator with no worker for this long ends itself (it is detached, so nothing else would end it).
IDLE_S = 120.0


def coordinator_name(job: str, model: str) -> str:
    """The name of the (job, model) coordinator actor in the namespace :data:`NAMESPACE`; ``model`` is the
    configured model's name (a role resolves to it in the workers)."""
    return f"{job_name(job)}/{model}"


def job_name(job: object) -> str:
    if not isinstance(job, str) or not job:
        raise ValueError(f"job must be a non-empty string naming the fan-out's job, got {job!r}")
    return job


def lease_config_for(spec: ModelSpec) -> LeaseConfig:
    """What every worker of a job must share: the floor (the whole job's under a coordinator), the ceiling, and the
    policy's name, as this worker's configuration and environment give them."""
    policy = spec.policy if spec.policy is not None else setting(*config.POLICY)
    name = policy if isinstance(policy, str) else type(policy).__name__
    return LeaseConfig(floor=spec.static_capacity, ceiling=int(setting(*config.MAX_CONCURRENCY)), policy=name)


def lease_seconds() -> float:
    """Two poll intervals: a worker renews every half of it, so one late renewal never costs its grant."""
    return max(2 * float(setting(*config.POLL_S)), MIN_LEASE_S)


def decide_in(runtime: ModelRuntime, now: float) -> float | None:
    """Seconds to the job runtime's next poll while its first ramp polls faster than the workers renew, else None:
    what ``LeaseBook.set_target`` times the renewals by (lease.py). Only then: renewals timed to every poll would
    have every job sharing a fleet act on each target in one step, keeping the fleet queued."""
    core = runtime.core
    return core.next_poll_at - now if core.polling_fast else None


class Configurable(Protocol):
    """What the coordinator needs of a fan-out: register its models in the coordinator's process."""

    @property
    def model(self) -> str: ...

    def configure(self) -> tuple[ModelSpec, ...]: ...


# -- the coordinator ---------------------------------------------------------------------------------------------
class JobCoordinator:
    """The actor of one (job, model): the model's runtime for the whole job, its lease book, and the poll.

    Each poll: leases past their deadline are taken back, the runtime polls (one scrape, the workers' summed reports
    as its calls, the outstanding grants as its in-flight count), and the book is told the new target. Threaded
    (``max_concurrency``): renewals are served while a poll reads the engine; the book is behind one lock."""

    def __init__(self, job: str, fan_out: Configurable, lease_config: LeaseConfig) -> None:
        fan_out.configure()
        spec = get_model(fan_out.model)
        if spec is None:
            raise ValueError(f"model {fan_out.model!r} is not in the job's configuration")
        self.clock = time.monotonic
        self._lock = threading.RLock()
        self.lease_s = lease_seconds()
        self.book = LeaseBook(job, spec.name, lease_config, lease_s=self.lease_s)
        self.limits = BookLimits(self.book, self._lock, self.clock)
        settings = RuntimeSettings(
            poll_s=float(setting(*config.POLL_S)),
            ramp_poll_divisor=setting(*config.RAMP_POLL_DIVISOR),
            poll_jitter=setting(*config.POLL_JITTER),
            grace_polls=setting(*config.GRACE_POLLS),
            growth_guard=setting(*config.GROWTH_GUARD),
            outage_handover=setting(*config.OUTAGE_HANDOVER),
            ceiling=lease_config.ceiling,
            adaptive=adaptive_enabled(),
        )
        self.runtime = ModelRuntime(
            spec,
            floor=lease_config.floor,
            limiter=self.limits,
            recorder=BookCalls(self.book, self._lock),
            settings=settings,
            publish=False,
        )
        self.polls = self.scrapes = 0
        self._idle_since: float | None = self.clock()
        self._stop = threading.Event()
        self._resuming = threading.Lock()
        self._named = 0  # the largest job target the rejoining workers' last grants named
        self.started_at = self.clock()  # built: the workers' queued calls come in from here
        threading.Thread(target=self._poll_loop, name=f"model-concurrency-job-{job}", daemon=True).start()

    # -- the protocol, as remote methods -------------------------------------------------------------------
    def request(
        self,
        worker: str,
        demand: int,
        *,
        inflight: int = 0,
        inflight_tokens: int = 0,
        config: LeaseConfig | None,
        last_target: int | None = None,
    ) -> Grant:
        with self._lock:
            grant = self.book.request(
                worker, demand, now=self.clock(), inflight=inflight, inflight_tokens=inflight_tokens, config=config
            )
            self.limits.note()
        if inflight and last_target is not None and self.clock() - self.started_at <= self.lease_s:
            self._resume(last_target)
        return grant

    def _resume(self, last_target: int) -> None:
        """A coordinator that replaces one that died: its workers rejoin within a lease of its start, each with the
        calls it ran alone meanwhile and the job's target its last grant named. The job goes on from those calls, not
        from the floor, and no higher than the largest target named (alone, each worker runs at least the job's
        floor, so their sum can exceed what the job ran). One rejoin at a time, each reading the book afresh; the
        runtime's lock before the book's, as a poll takes them."""
        with self._resuming:
            self._named = max(self._named, last_target)
            with self._lock:
                running = self.book.inflight()
            runtime = self.runtime
            start = min(running, self._named)
            if start > runtime.current():
                runtime.resume_from(start)
                with self._lock:
                    self.book.set_target(runtime.current(), runtime.current_budget(), now=self.clock())
                    self.limits.note()

    def renew(self, worker: str, demand: int, *, unused: int, unused_tokens: int, report: CallStats | None) -> Grant:
        with self._lock:
            grant = self.book.renew(
                worker, demand, now=self.clock(), unused=unused, unused_tokens=unused_tokens, report=report
            )
            self.limits.note()
            return grant

    def leave(self, worker: str, report: CallStats | None = None) -> int:
        with self._lock:
            handed_back = self.book.leave(worker, now=self.clock(), report=report)
            self.limits.note()
            return handed_back

    def state(self) -> dict[str, Any]:
        """The job's view: target, shares, holdings, the ledger, and how often the engine was read for it."""
        runtime = self.runtime.state().as_dict()  # outside the book's lock: a poll takes the two the other way
        with self._lock:
            book = self.book
            return {
                "job": book.job,
                "model": book.model,
                "pid": os.getpid(),
                "config": book.config,
                "target": book.target,
                "token_target": book.token_target,
                "inflight": book.inflight(),
                "shares": book.shares(),
                "held": book.held(),
                "ledger": book.ledger(),
                "lease_s": self.lease_s,
                "polls": self.polls,
                "scrapes": self.scrapes,
                "runtime": runtime,
            }

    # -- the poll ------------------------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            wait = self.runtime.core.next_poll_at - self.clock()
            if wait > 0:
                self._stop.wait(wait)
                continue
            try:
                self._poll()
            except Exception:  # a bug must cost one poll, never the job's leases
                log.exception("job %s, model %s: the coordinator's poll failed", self.book.job, self.book.model)
            if self._idle():
                self._end()
                return
            self._stop.wait(0.005)

    def _poll(self) -> None:
        runtime = self.runtime
        with self._lock:
            self.book.expire(self.clock())
            self.limits.note()
        if runtime.adaptive and runtime.source is not None:
            runtime.poll_with(self._read)
        else:  # the floor, with no scrape: only the schedule moves
            runtime.core.begin_poll(self.clock())
        with self._lock:
            self.polls += 1
            now = self.clock()
            self.book.set_target(
                runtime.current(), runtime.current_budget(), now=now, decide_in=decide_in(runtime, now)
            )
            self.limits.note()

    def _read(self) -> Any:
        source = self.runtime.source
        assert source is not None
        self.scrapes += 1
        return source.read()

    def _idle(self) -> bool:
        with self._lock:
            if self.book.shares():
                self._idle_since = None
                return False
            now = self.clock()
            if self._idle_since is None:
                self._idle_since = now
            return now - self._idle_since > max(IDLE_S, 10 * self.lease_s)

    def _end(self) -> None:
        """No worker for a long while: end this detached actor (a later ask creates a new one)."""
        ray = require("ray", "ray", "model_concurrency.ray_job")
        log.info("job %s, model %s: no worker for a while; the coordinator ends", self.book.job, self.book.model)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


_actor_class: Any = None


def coordinator(job: str, model: str, creator: Configurable, lease_config: LeaseConfig) -> Any:
    """The (job, model) coordinator's handle: the existing one, or one created now (get-or-create by name)."""
    global _actor_class
    ray = require("ray", "ray", "model_concurrency.ray_job")
    if _actor_class is None:
        _actor_class = ray.remote(JobCoordinator)
    return _actor_class.options(
        name=coordinator_name(job, model),
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=16,
        max_restarts=0,
    ).remote(job, creator, lease_config)
