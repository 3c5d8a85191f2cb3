"""A job's clients in the lab: one runtime decides for them all and a lease book shares its target, as in Ray.

``[clients] job`` (lab/scenario.py) makes clients the workers of one job. A :class:`SimJob` is the simulated twin
of :class:`~model_concurrency.ray_coordinator.JobCoordinator` on the SimPy clock, built from the same parts: one
:class:`~model_concurrency.runtime.ModelRuntime` with the job's policy, whose limits and call recorder are the
coordinator's own (the outstanding grants as its in-flight count, the workers' summed reports as its calls), and a
:class:`~model_concurrency.lease.LeaseBook` told the new target after every poll. It polls when its core schedules
it, one snapshot of the engine per poll for the whole job, and takes back expired leases first, as the actor does.

Each client is a worker as ray_job.py runs one: it requests a grant before its first item, with the calls it
already runs; it renews when its grant says (:func:`~model_concurrency.lease.renewal_due`: once per renewal
interval, sooner while its split is unsettled) with its demand (its items left, at most the job's ceiling), the
permits it does not use and its calls since the last renewal; its own runtime's limiter follows the grant
(:meth:`~model_concurrency.runtime.ModelRuntime.lease`), and a grant of 0 holds its items before they start
(:meth:`~model_concurrency.lab.client.SimClient.admit`, as ray_job.py's admission). Nothing here decides, splits or
times, so the lab measures the rule that ships.

A job's floor and ceiling are its clients' summed (``floor × clients``), so a scenario run as a job and run as
independent clients start at the same total and may reach the same total: the two runs differ in the rule alone.
Left to tests/test_ray_job.py, against a real Ray: a lost coordinator, a lapsed lease, the round trip to the actor
(a renewal here is answered at the instant it is sent).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from model_concurrency.lab.client import SimClient
from model_concurrency.lab.scenario import Clients
from model_concurrency.lease import Grant, LeaseBook, LeaseConfig, UnknownWorker, add_stats, renewal_due
from model_concurrency.lease_runtime import BookCalls, BookLimits
from model_concurrency.observation import EngineSnapshot
from model_concurrency.policies.base import Policy, uses_engine_signals
from model_concurrency.ray_coordinator import MIN_LEASE_S, decide_in
from model_concurrency.runtime import LeaseView, ModelRuntime
from model_concurrency.signals.interval import IntervalMeter

__all__ = ["SimJob", "job_groups", "jobs_for"]

Lease = Callable[[SimClient], Generator[Any, Any, None]]


def job_groups(clients: Clients) -> dict[str, list[int]]:
    """Each job's name and its clients' indices, in the clients' order; empty when every client is on its own."""
    names = (clients.job,) * clients.count if isinstance(clients.job, str) else clients.job or ()
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        if name:
            groups.setdefault(name, []).append(index)
    return groups


class SimJob:
    """One job of the lab: the coordinator's runtime and lease book on ``env.now``, and its workers' renewals.

    ``polls`` and ``scrapes`` count the job's polls and its reads of the engine, as the actor's ``state()`` does."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        policy: Policy,
        *,
        floor: int,
        ceiling: int,
        jitter_rng: np.random.Generator | None = None,
        first_poll_s: float = 0.0,
    ) -> None:
        self.env, self.name, self.policy, self.jitter_rng = env, name, policy, jitter_rng
        self.first_poll_s = first_poll_s
        self.config = LeaseConfig(floor=floor, ceiling=ceiling, policy=type(policy).__name__)
        self.runtime: ModelRuntime | None = None  # built with the first worker, from the knobs its runtime runs
        self.book: LeaseBook | None = None
        self.polls = self.scrapes = 0
        self.poll_times: list[float] = []
        self.poll_targets: list[int] = []
        self._source: SimClient | None = None
        self._meter = IntervalMeter()
        self._limits: BookLimits | None = None

    def member(self) -> Lease:
        """A worker's lease process, for :class:`SimClient`'s ``lease``. Its renewals follow its grants
        (:func:`renewal_due`), so the workers of a job, which all join at the start, renew on one grid, as a Ray job's
        workers started together do."""

        def lease(client: SimClient) -> Generator[Any, Any, None]:
            if self.runtime is None:
                self._start(client)
            return self._worker(client)

        return lease

    # -- the coordinator -----------------------------------------------------------------------------------
    def _start(self, first: SimClient) -> None:
        """The job's runtime on the first worker's clock and knobs (every worker runs the same ones), and its poll
        process, which polls before the first worker's request, as the actor's poll thread starts when it is built
        (beside other processes, at its first poll's phase: :func:`jobs_for`)."""
        env, settings = self.env, first.runtime.settings
        assert settings is not None  # a lab client's knobs are fixed
        lease_s = max(2 * settings.poll_s, MIN_LEASE_S)
        book = self.book = LeaseBook(self.name, "model", self.config, lease_s=lease_s)  # the lab serves one model
        lock = threading.RLock()
        self._limits = BookLimits(book, lock, lambda: env.now)
        self.runtime = ModelRuntime(
            None,
            name=f"job-{self.name}",
            policy=self.policy,
            clock=lambda: env.now,
            floor=self.config.floor,
            limiter=self._limits,
            settings=dataclasses.replace(settings, ceiling=self.config.ceiling),
            publish=False,
            stated_limits=getattr(first.target, "stated_limits", None),
            recorder=BookCalls(book, lock),
        )
        if self.jitter_rng is not None:
            self.runtime.core.jitter_rng = self.jitter_rng
        self._source = first
        env.process(self._poll())

    def _poll(self) -> Generator[Any, Any, None]:
        env, runtime, book, limits = self.env, self.runtime, self.book, self._limits
        assert runtime is not None and book is not None and limits is not None
        if self.first_poll_s > 0:
            yield env.timeout(self.first_poll_s)
        while True:
            book.expire(env.now)
            limits.note()
            self.poll_times.append(env.now)
            self.poll_targets.append(runtime.poll_with(self._read, "metrics unavailable"))
            self.polls += 1
            book.set_target(
                runtime.current(), runtime.current_budget(), now=env.now, decide_in=decide_in(runtime, env.now)
            )
            limits.note()
            yield env.timeout(max(0.0, runtime.core.next_poll_at - env.now))

    def _read(self) -> EngineSnapshot | None:
        """The job's one read of the engine, through the workers' shared target (a lab client's own read, once)."""
        source = self._source
        assert source is not None
        if not uses_engine_signals(self.policy):
            return EngineSnapshot()
        if not source.metrics_up():
            return None
        self.scrapes += 1
        try:
            return self._meter.advance(source.target.snapshot())
        except ConnectionError:
            return None

    # -- a worker --------------------------------------------------------------------------------------------
    def _demand(self, client: SimClient) -> int:
        """Its items not finished yet, at most the job's ceiling (an endless stream asks for the ceiling)."""
        if client.items is None:
            return self.config.ceiling
        return max(0, min(client.items - client.completed - client.rejected, self.config.ceiling))

    def _worker(self, client: SimClient) -> Generator[Any, Any, None]:
        """Renewals as ray_job.py times them; a call here is answered at the instant it is sent."""
        env, book, limits = self.env, self.book, client.runtime.limits
        assert book is not None
        backlog = None
        grant = self._request(client)
        while True:
            yield env.timeout(max(0.0, renewal_due(grant, sent_at=env.now, answered_at=env.now) - env.now))
            report = client.runtime.calls.drain()
            if backlog is not None:  # a request carries no report: the renewal after it does
                report, backlog = add_stats(backlog, report), None
            try:
                grant = book.renew(
                    client.name,
                    self._demand(client),
                    now=env.now,
                    unused=max(0, grant.held - self._running(client)),
                    unused_tokens=max(0, grant.held_tokens - limits.units()),
                    report=report,
                )
                self._granted(client, grant)
            except UnknownWorker:  # the book let the lease expire: rejoin with the calls in flight
                grant, backlog = self._request(client), report

    def _request(self, client: SimClient) -> Grant:
        assert self.book is not None
        limits = client.runtime.limits
        grant = self.book.request(
            client.name,
            self._demand(client),
            now=self.env.now,
            inflight=self._running(client),
            inflight_tokens=limits.units(),
            config=self.config,
        )
        self._granted(client, grant)
        return grant

    @staticmethod
    def _running(client: SimClient) -> int:
        """Its calls in flight; one parked by a grant of 0 is not one (ray_job.py counts the same)."""
        return client.runtime.limits.inflight() - (client.parked is not None)

    def _granted(self, client: SimClient, grant: Grant) -> None:
        assert self._limits is not None
        self._limits.note()
        client.poll_times.append(self.env.now)
        client.poll_targets.append(grant.permits)
        client.runtime.lease(LeaseView(self.name, grant.permits, grant.tokens, grant.job_target))
        client.admit(grant.permits)


def jobs_for(
    env: simpy.Environment, clients: Clients, policy_factory: Callable[[], Policy], seed: int
) -> dict[int, SimJob]:
    """The job each client of a job belongs to, by client index: one :class:`SimJob` per name, its floor and
    ceiling its clients' summed, its poll jitter drawn from a stream of its own (the scenario's seed).

    Beside other processes that poll (other jobs, independent clients), a job's first poll comes at a moment drawn
    in its first poll interval, as each independent client's does (lab/run.py): coordinators are separate
    processes too, and 100 of them polling in lock-step at the start would act on every ramp step together."""
    groups = job_groups(clients)
    alone = len(groups) + clients.count - sum(len(members) for members in groups.values()) <= 1
    by_client: dict[int, SimJob] = {}
    for number, (name, members) in enumerate(groups.items()):
        job = SimJob(
            env,
            name,
            policy_factory(),
            floor=clients.floor * len(members),
            ceiling=clients.ceiling * len(members),
            jitter_rng=np.random.default_rng([seed, number, 2]),
            first_poll_s=0.0 if alone else float(np.random.default_rng([seed, number, 3]).uniform(0, clients.poll_s)),
        )
        by_client.update(dict.fromkeys(members, job))
    return by_client
