"""Fan-out clients on simulated time: the production model runtime's parts behind a SimPy front-end.

Nothing here re-implements a decision or a poll. A :class:`SimClient` is the simulated twin of ``map_concurrent``
on a :class:`~model_concurrency.runtime.ModelRuntime`: the same :class:`~model_concurrency.controller.ControllerCore`,
:class:`~model_concurrency.gate.limiter.LimiterCore`, :class:`~model_concurrency.gate.limiter.UsageMeter` and
:class:`~model_concurrency.controller.CallRecorder`, and the same poll step
(:func:`~model_concurrency.runtime.poll_step`: snapshot or error in, interval usage and calls drained, target
out). It supplies only what differs in a simulation: the clock (``env.now``), the schedule (a SimPy process
every ``poll_s`` seconds, like the live poller thread) and the I/O (the fleet's snapshot, and requests submitted
to the engine model).

The limiter's SimPy front-end is a few lines: a waiter is a SimPy event, the waiters the core hands back on
``release``/``resize`` are succeeded, and every change of the count is noted in the usage meter. One dispatcher
process per client pulls items while the limiter grants slots, so a client costs one process, not one per item.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

import numpy as np
import simpy

from model_concurrency.controller import CallRecorder, ControllerCore
from model_concurrency.engine.request import Request
from model_concurrency.gate.limiter import LimiterCore, UsageMeter
from model_concurrency.observation import EngineSnapshot
from model_concurrency.policies.base import Policy
from model_concurrency.runtime import poll_step

__all__ = ["ScheduledLimit", "SimClient", "SubmitTarget", "request_stream"]


class SubmitTarget(Protocol):
    """What a client talks to: a server, a fleet behind a balancer, or a single engine."""

    def submit_callback(self, request: Request, on_finish: Callable[[Request], None]) -> None: ...

    def snapshot(self) -> EngineSnapshot: ...


def request_stream(
    rng: np.random.Generator,
    prompt_tokens: int,
    output_tokens: int,
    prompt_sigma: float = 0.0,
    output_sigma: float = 0.0,
    embedding: bool = False,
    tag: Any = None,
) -> Iterator[Request]:
    """An endless stream of requests with lognormal sizes around the given means (sigma 0 = fixed sizes)."""

    def draw(mean: int, sigma: float, size: int) -> np.ndarray:
        if sigma <= 0:
            return np.full(size, mean, dtype=np.int64)
        # Lognormal with the requested mean: mu = ln(mean) - sigma²/2.
        values = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size)
        return np.maximum(1, np.rint(values)).astype(np.int64)

    while True:
        prompts = draw(prompt_tokens, prompt_sigma, 1024)
        outputs = draw(output_tokens, output_sigma, 1024)
        for p, o in zip(prompts, outputs, strict=True):
            yield Request(int(p), int(o), embedding=embedding, tag=tag)


class ScheduledLimit:
    """The oracle's "policy": a limit that follows a known schedule of (time, limit) instead of signals."""

    def __init__(self, schedule: list[tuple[float, int]]) -> None:
        self.schedule = sorted(schedule)

    def limit_at(self, t: float) -> int:
        limit = self.schedule[0][1]
        for at, value in self.schedule:
            if at <= t:
                limit = value
        return max(1, limit)


class SimClient:
    """One closed-loop fan-out client: limiter, controller core, poller, dispatcher, and its statistics."""

    def __init__(
        self,
        env: simpy.Environment,
        target: SubmitTarget,
        requests: Iterator[Request],
        *,
        policy: Policy | None = None,
        schedule: ScheduledLimit | None = None,
        floor: int = 4,
        ceiling: int = 512,
        poll_s: float = 12.0,
        grace_polls: int = 3,
        first_poll_s: float = 0.0,
        poll_jitter: float = 0.0,
        jitter_rng: np.random.Generator | None = None,
        items: int | None = None,
        metrics_up: Callable[[], bool] = lambda: True,
        name: str = "client",
        shared_records: tuple[array[float], array[float], array[float]] | None = None,
    ) -> None:
        if (policy is None) == (schedule is None):
            raise ValueError("give a SimClient either a policy or a schedule")
        self.env = env
        self.target = target
        self.requests = requests
        self.name = name
        self.items = items
        self.metrics_up = metrics_up
        self.schedule = schedule
        if poll_jitter and jitter_rng is None:
            raise ValueError("poll_jitter needs a jitter_rng (runs are reproducible from their seed)")
        self.poll_jitter = poll_jitter
        self.jitter_rng = jitter_rng
        self.core = ControllerCore(
            policy=policy if policy is not None else _Hold(),
            floor=floor,
            ceiling=ceiling,
            grace_polls=grace_polls,
            poll_interval_s=poll_s,
        )
        start = schedule.limit_at(0.0) if schedule is not None else self.core.target
        self.limiter: LimiterCore[simpy.Event] = LimiterCore(start)
        self.usage = UsageMeter(env.now)
        self.calls = CallRecorder()
        self.started = 0
        self.completed = 0
        self.errors = 0
        self.retry: list[Request] = []
        # Typed arrays, not lists of floats: a fleet run finishes millions of requests (8 bytes each, not 32).
        # ``shared_records`` (queue times, latencies, finish times) lets every client of a run append to the same
        # three arrays, which the trace then reads without a copy.
        self.queue_times, self.latencies, self.finish_times = shared_records or (array("d"), array("d"), array("d"))
        self.poll_times: list[float] = []
        self.poll_targets: list[float] = []
        self._dispatching = True
        env.process(self._dispatch())
        if schedule is not None:
            env.process(self._follow_schedule())
        else:
            env.process(self._poll(first_poll_s))

    @property
    def limit(self) -> int:
        return self.limiter.limit

    @property
    def inflight(self) -> int:
        return self.limiter.inflight

    # -- the limiter's SimPy front-end ------------------------------------------------------------------
    def _wake(self, granted: list[simpy.Event]) -> None:
        self.usage.note(self.limiter.inflight, self.env.now)
        for event in granted:
            event.succeed()

    def _resize(self, limit: int) -> None:
        self._wake(self.limiter.resize(max(1, int(limit))))

    # -- processes ------------------------------------------------------------------------------------------
    def _dispatch(self) -> Generator[Any, Any, None]:
        env = self.env
        while self.items is None or self.started < self.items or self.retry:
            slot = env.event()
            if self.limiter.acquire_or_enqueue(slot):
                self.usage.note(self.limiter.inflight, env.now)
            else:
                yield slot
            if self.retry:
                request = self.retry.pop()
            else:
                request = next(self.requests)
                self.started += 1
            request.arrival_time = None
            self.target.submit_callback(request, self._finished)
        self._dispatching = False

    def _finished(self, request: Request) -> None:
        now = self.env.now
        latency = request.latency if request.latency is not None else 0.0
        if request.ok:
            self.completed += 1
            self.finish_times.append(now)
            self.latencies.append(latency)
            queue = request.queue_time
            if queue is not None:
                self.queue_times.append(queue)
            self.calls.record(latency, ok=True)
        else:
            # Aborted (its replica was lost): the item is retried, as an ingestion job would.
            self.errors += 1
            self.calls.record(latency, ok=False, status=503)
            self.retry.append(
                Request(
                    request.prompt_tokens, max(1, request.output_tokens), embedding=request.embedding, tag=request.tag
                )
            )
        self._wake(self.limiter.release())

    def _poll(self, first_poll_s: float) -> Generator[Any, Any, None]:
        env, core = self.env, self.core
        if first_poll_s > 0:
            yield env.timeout(first_poll_s)
        while True:
            now = env.now
            core.begin_poll(now)
            snapshot = None
            if self.metrics_up():
                try:
                    snapshot = self.target.snapshot()
                except ConnectionError:
                    snapshot = None
            poll_step(core, self.calls.drain(), self.usage.take(now), now, snapshot, "metrics unavailable")
            self.poll_times.append(now)
            self.poll_targets.append(core.target)
            self._resize(core.target)
            wait = core.poll_interval_s
            if self.jitter_rng is not None and self.poll_jitter:
                wait *= 1.0 + self.poll_jitter * (2.0 * self.jitter_rng.random() - 1.0)
            yield env.timeout(wait)

    def _follow_schedule(self) -> Generator[Any, Any, None]:
        assert self.schedule is not None
        for at, limit in self.schedule.schedule:
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            self._resize(limit)
            self.poll_times.append(self.env.now)
            self.poll_targets.append(limit)


class _Hold:
    """Placeholder policy for scheduled clients, whose core is never updated."""

    def next_target(self, target: float, obs: object) -> float:
        return target
