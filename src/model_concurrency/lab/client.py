"""Fan-out clients on simulated time: the production model runtime on a SimPy clock.

(Over 400 lines: the simulated twin of map_concurrent, slot and the call recorder in one place, so the lab's client
cannot drift from the live path piece by piece.)

Nothing here re-implements a decision or a poll. A :class:`SimClient` is the simulated twin of ``map_concurrent``
on a :class:`~model_concurrency.runtime.ModelRuntime`, and it *is* one: a runtime built on the SimPy clock
(``clock=lambda: env.now``), with an injected limiter (:class:`SimLimits`: a
:class:`~model_concurrency.gate.limiter.LimiterCore` and :class:`~model_concurrency.gate.limiter.UsageMeter` whose
waiters are SimPy events), the scenario's knobs as fixed :class:`~model_concurrency.runtime.RuntimeSettings`, and
``publish=False`` (no telemetry or export, health judged without log lines). From a snapshot to the resized
limiter it runs the runtime's own poll path (``poll_with``: the poll step, the health judgement, ``apply_limits``),
and a 429 goes through the runtime's ``note_throttled``. The client supplies only what differs in a simulation:
the schedule (a SimPy process that calls ``poll_with`` when the core's ``next_poll_at`` comes, like the live
poller thread: every ``poll_s`` seconds, sooner while the policy ramps, each wait jittered by the core from the
stream it is given: seeded, so a run is reproducible) and the I/O (the fleet's snapshot, and requests submitted
to the engine model).

A rate-limited target (:class:`~model_concurrency.lab.ratelimit.RateLimitedFront`) may refuse a call with a
Retry-After: the call is recorded as throttled (status 429, never a success), the delay goes into an
:class:`~model_concurrency.gate.hold.AdmissionHold` (the rule the live gate applies) and the item is retried once
the hold has passed.

The limiter's SimPy front-end (:class:`SimLimits`) is a few lines: a waiter is a SimPy event, the waiters the core
hands back on ``release``/``resize`` are succeeded, and every change of the count is noted in the usage meter.
Each request is weighed by its tokens (prompt plus output, what ``map_concurrent(..., weight=)`` passes), so a
policy that answers a token budget is obeyed exactly as production obeys it; a count-only policy leaves the
budget unenforced. One dispatcher process per client pulls items while the limiter grants slots, so a client
costs one process, not one per item.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

import numpy as np
import simpy
from simpy.events import Event, Timeout

from model_concurrency import config
from model_concurrency.controller import check_poll_jitter
from model_concurrency.engine.engine import RequestTooLargeError
from model_concurrency.engine.request import ABORT, Request
from model_concurrency.gate.hold import AdmissionHold
from model_concurrency.gate.limiter import CoreReadings, LimiterCore, Usage, UsageMeter
from model_concurrency.observation import EngineSnapshot
from model_concurrency.policies.base import Policy, uses_engine_signals
from model_concurrency.runtime import ModelRuntime, RuntimeSettings
from model_concurrency.signals.interval import IntervalMeter
from model_concurrency.signals.limits import StatedLimits

__all__ = ["REJECTION_LATENCY_S", "ScheduledLimit", "SimClient", "SimLimits", "SubmitTarget", "request_stream"]

#: The round trip of a call the engine refuses outright (vLLM's HTTP 400 for a prompt it can never take): the slot
#: is held this long, so a stream of such items cannot spin the dispatcher at one simulated instant.
REJECTION_LATENCY_S = 0.005
#: The status a refused item's call is recorded with (the gate records the same for a live 400).
REJECTED_STATUS = 400


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
    *,
    long_fraction: float = 0.0,
    long_prompt_tokens: int = 0,
    long_output_tokens: int = 0,
    long_burst: int = 1,
    priority: int = 0,
) -> Iterator[Request]:
    """An endless stream of requests with lognormal sizes around the given means (sigma 0 = fixed sizes).

    With ``long_fraction > 0`` a heavy tail is mixed in: that share of the items is long (``long_prompt_tokens``
    minus up to 5 %, answering ``long_output_tokens``), and long items come in runs of ``long_burst`` consecutive
    items, as the long documents of a corpus sit together. Without it the stream draws exactly what it always did.
    """

    def draw(mean: int, sigma: float, size: int) -> np.ndarray:
        if sigma <= 0:
            return np.full(size, mean, dtype=np.int64)
        # Lognormal with the requested mean: mu = ln(mean) - sigma²/2.
        values = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size)
        return np.maximum(1, np.rint(values)).astype(np.int64)

    run = 0
    while True:
        prompts = draw(prompt_tokens, prompt_sigma, 1024)
        outputs = draw(output_tokens, output_sigma, 1024)
        if long_fraction <= 0:
            for p, o in zip(prompts, outputs, strict=True):
                yield Request(int(p), int(o), embedding=embedding, tag=tag, priority=priority)
            continue
        starts = rng.random(1024) < long_fraction / long_burst
        longs = np.rint(long_prompt_tokens * (1 - 0.05 * rng.random(1024))).astype(np.int64)
        for p, o, start, long_p in zip(prompts, outputs, starts, longs, strict=True):
            if run == 0 and start:
                run = long_burst
            if run > 0:
                run -= 1
                yield Request(int(long_p), long_output_tokens, embedding=embedding, tag=tag, priority=priority)
            else:
                yield Request(int(p), int(o), embedding=embedding, tag=tag, priority=priority)


class ScheduledLimit:
    """The oracle's "policy": a limit that follows a known schedule of (time, limit) instead of signals.

    ``budgets`` is an optional schedule of (time, token budget) followed the same way (None: not enforced)."""

    def __init__(
        self, schedule: list[tuple[float, int]], budgets: list[tuple[float, int | None]] | None = None
    ) -> None:
        self.schedule = sorted(schedule)
        self.budgets = sorted(budgets or [], key=lambda b: b[0])

    def limit_at(self, t: float) -> int:
        limit = self.schedule[0][1]
        for at, value in self.schedule:
            if at <= t:
                limit = value
        return max(1, limit)

    def budget_at(self, t: float) -> int | None:
        budget = None
        for at, value in self.budgets:
            if at <= t:
                budget = value
        return budget

    def times(self) -> list[float]:
        return sorted({at for at, _ in self.schedule} | {at for at, _ in self.budgets})


class SimLimits(CoreReadings[simpy.Event]):
    """The limiter's SimPy front-end, the runtime's :class:`~model_concurrency.runtime.Limits` on ``env.now``.

    A waiter is a SimPy event: those the core hands back are succeeded, and every change of the count is noted in
    the usage meter (even one that admits nobody: the same notes, so the same interval figures, as before the
    client was a runtime). Its readings are :class:`~model_concurrency.gate.limiter.CoreReadings`; the client's
    hot path (acquire, release) works :attr:`core` and :attr:`meter` directly."""

    __slots__ = ("_core", "env", "hold", "meter")

    def __init__(self, env: simpy.Environment, limit: int, budget: int | None, hold: AdmissionHold) -> None:
        self.env = env
        self._core: LimiterCore[simpy.Event] = LimiterCore(limit, budget)
        self.meter = UsageMeter(env.now)
        self.hold = hold

    @property
    def core(self) -> LimiterCore[simpy.Event]:
        """The core itself, for the client's hot path (acquire, release), which works it directly."""
        return self._core

    def take_usage(self) -> Usage:
        return self.meter.take(self.env.now)

    def wake(self, granted: list[simpy.Event]) -> None:
        core = self._core
        self.meter.note(core.inflight, self.env.now, core.units)
        for event in granted:
            event.succeed()

    def resize(self, limit: int) -> None:
        self.wake(self._core.resize(limit))

    def set_budget(self, budget: int | None) -> None:
        self.wake(self._core.set_budget(budget))


class SimClient:
    """One closed-loop fan-out client: a :class:`~model_concurrency.runtime.ModelRuntime` on ``env.now``, its
    SimPy limiter, poller and dispatcher, and its statistics."""

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
        ramp_poll_divisor: float | None = None,
        poll_jitter: float | None = None,
        jitter_rng: np.random.Generator | None = None,
        items: int | None = None,
        metrics_up: Callable[[], bool] = lambda: True,
        guard: bool = True,
        outage_handover: bool = True,
        name: str = "client",
        shared_records: tuple[array[float], array[float], array[float]] | None = None,
        stated_limits: StatedLimits | None = None,
        lease: Callable[[SimClient], Generator[Any, Any, None]] | None = None,
    ) -> None:
        """``stated_limits``: the engines' limits the client was told, as an operator states them in a spec
        (default: the target's ``stated_limits``, which lab/world.py's front carries when the scenario says so);
        the runtime merges them into every poll's Observation by the live rule. ``lease``: the client is a job's
        worker, and this process (lab/job.py) leases its limit in place of its own polls."""
        if (policy is None) == (schedule is None):
            raise ValueError("give a SimClient either a policy or a schedule")
        self.env = env
        self.target = target
        self.requests = requests
        self.name = name
        self.items = items
        self.metrics_up = metrics_up
        self.schedule = schedule
        # The production knob unless the scenario sets one, read as the live runtime reads it.
        jitter = poll_jitter if poll_jitter is not None else config.setting(*config.POLL_JITTER)
        if policy is not None and jitter and jitter_rng is None:
            raise ValueError("poll_jitter needs a jitter_rng (runs are reproducible from their seed)")
        check_poll_jitter(jitter)
        settings = RuntimeSettings(
            poll_s=poll_s,
            # The production knob, read as the live runtime reads it, so the lab measures what ships.
            ramp_poll_divisor=(
                ramp_poll_divisor if ramp_poll_divisor is not None else config.setting(*config.RAMP_POLL_DIVISOR)
            ),
            poll_jitter=jitter,
            grace_polls=grace_polls,
            growth_guard=guard,
            outage_handover=outage_handover,
            ceiling=ceiling,
        )
        self.hold = AdmissionHold()
        # The limiter starts at the floor, where a runtime's core starts (or at the schedule's first limit).
        start = schedule.limit_at(0.0) if schedule is not None else max(1, int(floor))
        self.limits = SimLimits(env, start, schedule.budget_at(0.0) if schedule else None, self.hold)
        # The production runtime, on this clock and this limiter, with the scenario's knobs, publishing nothing;
        # its decision lines (-v) say which client decided. The poll below times it (poll_with).
        self.runtime = ModelRuntime(
            None,
            name=name,
            policy=policy if policy is not None else _Hold(),
            clock=lambda: env.now,
            floor=floor,
            limiter=self.limits,
            settings=settings,
            publish=False,
            stated_limits=stated_limits if stated_limits is not None else getattr(target, "stated_limits", None),
        )
        self.core = self.runtime.core
        if jitter_rng is not None:
            self.core.jitter_rng = jitter_rng
        # A client-side policy is given no engine signal, as production gives it ClientOnlySource.
        self.engine_signals = policy is not None and uses_engine_signals(policy)
        self.limiter = self.limits.core
        self.usage = self.limits.meter
        self._units: dict[int, int] = {}  # id(request) -> the units it holds
        self.calls = self.runtime.calls
        # This client's previous reading: the interval since its last poll, as a live source keeps it.
        self.meter = IntervalMeter()
        self.started = 0
        self.completed = 0
        self.errors = 0
        self.throttled = 0
        # Items the engine refused (too long for it): each failed for good, never retried, as vLLM's 400 is final.
        self.rejected = 0
        self.throttle_times: list[float] = []
        self.retry: list[Request] = []
        # Typed arrays, not lists of floats: a fleet run finishes millions of requests (8 bytes each, not 32).
        # ``shared_records`` (queue times, latencies, finish times) lets every client of a run append to the same
        # three arrays, which the trace then reads without a copy.
        self.queue_times, self.latencies, self.finish_times = shared_records or (array("d"), array("d"), array("d"))
        self.poll_times: list[float] = []
        self.poll_targets: list[float] = []
        self._dispatching = True
        self._waiting: tuple[Request, int] | None = None  # the item waiting for its slot or for a hold to pass
        # A job's grant of 0 permits closes admission, as ray_job.py's ``_Admission`` does: items wait before they
        # take a slot (``_stalled``: the dispatcher stopped there), and one granted a slot just then waits in it.
        self._closed = False
        self._stalled = False
        self.parked: tuple[Request, int] | None = None
        self._submit_limited = getattr(target, "submit_limited", None)
        # The poll first, as production's fan-out polls when it starts, before its first item: a poll at t=0
        # sees nothing in flight yet (lab/conformance.py measures the difference the other order made).
        self.lease = lease
        if schedule is not None:
            env.process(self._follow_schedule())
        elif lease is not None:
            env.process(lease(self))
        else:
            env.process(self._poll(first_poll_s))
        env.process(self._dispatch())

    @property
    def limit(self) -> int:
        return self.limiter.limit

    @property
    def inflight(self) -> int:
        return self.limiter.inflight

    # -- the limiter's SimPy front-end ------------------------------------------------------------------
    def _wake(self, granted: list[simpy.Event]) -> None:
        self.limits.wake(granted)

    def _resize(self, limit: int, budget: int | None = None) -> None:
        """A scheduled client's limits (the oracle's): set on the limiter, as the runtime's apply_limits does."""
        self.limits.resize(max(1, int(limit)))
        self.limits.set_budget(budget)

    # -- processes ------------------------------------------------------------------------------------------
    def _dispatch(self) -> Generator[Any, Any, None]:
        """The dispatcher's start, as a process (its first step runs where a process's would); then callbacks."""
        self._pump()
        return
        yield  # a generator, for env.process

    # The dispatcher runs once per request of the whole run (millions at fleet scale). It was one SimPy process
    # looping over ``yield slot``; it is now the same loop as callbacks on the same events (the slot event the
    # limiter grants, the Retry-After hold's timeout), created at the same moments, so every event keeps its place
    # in the queue and the run is the same bits, without a generator resumed per request.
    def _pump(self, _event: object = None) -> None:
        """Take items while the limiter grants slots now; leave a callback on what the next one waits for."""
        env = self.env
        limiter, usage, hold, retry, requests = self.limiter, self.usage, self.hold, self.retry, self.requests
        items = self.items
        while items is None or self.started < items or retry:
            if self._closed:
                self._stalled = True
                return
            if hold.until > env.now:  # the Retry-After rule, as in gate/hold.py (remaining() > 0)
                Timeout(env, hold.remaining(env.now)).callbacks.append(self._pump)
                return
            if retry:
                request = retry.pop()
            else:
                request = next(requests)
                self.started += 1
            units = request.prompt_tokens + request.output_tokens
            if limiter.try_acquire(units):
                usage.note(limiter.inflight, env.now, limiter.units)
            else:
                slot = Event(env)
                slot.callbacks.append(self._granted)
                self._waiting = (request, units)
                limiter.acquire_or_enqueue(slot, units)  # queues it: the slot was just refused
                return
            if not self._start(request, units):
                return
        self._dispatching = False

    def _granted(self, _event: object) -> None:
        request, units = self._waiting  # type: ignore[misc]
        self._waiting = None
        if self._closed:
            self.parked = (request, units)
            return
        if self._start(request, units):
            self._pump()

    def admit(self, permits: int | None) -> None:
        """The job's grant in force (None: no grant, every call may start): 0 closes admission; reopening starts the
        parked call, or the dispatcher where it stopped."""
        was, self._closed = self._closed, permits == 0
        if not was or self._closed:
            return
        parked, self.parked = self.parked, None
        if parked is not None:
            if self._start(*parked):
                self._pump()
        elif self._stalled:
            self._stalled = False
            self._pump()

    def _start(self, request: Request, units: int) -> bool:
        """Submit a request that holds its slot; False: a hold defers it (a callback submits it and goes on)."""
        self._units[id(request)] = units
        env = self.env
        hold = self.hold
        if hold.until > env.now:  # granted during a hold: start only after it
            self._waiting = (request, units)
            Timeout(env, hold.remaining(env.now)).callbacks.append(self._held)
            return False
        self._submit(request)
        return True

    def _held(self, _event: object) -> None:
        request, _units = self._waiting  # type: ignore[misc]
        if self.hold.until > self.env.now:  # held again meanwhile
            Timeout(self.env, self.hold.remaining(self.env.now)).callbacks.append(self._held)
            return
        self._waiting = None
        self._submit(request)
        self._pump()

    def _submit(self, request: Request) -> None:
        request.arrival_time = None
        submit_limited = self._submit_limited
        try:
            if submit_limited is not None:
                submit_limited(request, self._finished, self._refused)
            else:
                self.target.submit_callback(request, self._finished)
        except RequestTooLargeError:
            Timeout(self.env, REJECTION_LATENCY_S, request).callbacks.append(self._rejected)

    def _rejected(self, event: Event) -> None:
        """A call the engine refused (HTTP 400): that item fails, its slot is freed, the run goes on."""
        request: Request = event.value  # type: ignore[assignment]  # the timeout was given the request
        self.rejected += 1
        self.errors += 1
        self.calls.record(REJECTION_LATENCY_S, ok=False, status=REJECTED_STATUS)
        self._wake(self.limiter.release(self._units.pop(id(request))))

    def unaccounted(self) -> int:
        """Items taken from the stream and neither completed, failed, in flight nor waiting to be sent: always 0.

        The ledger a property test checks: each item drawn is completed once, refused once (failed for good), or
        still here (holding a slot, in the retry list, or waiting for its slot)."""
        waiting = self._waiting is not None and id(self._waiting[0]) not in self._units
        here = len(self._units) + len(self.retry) + int(waiting)
        return self.started - self.completed - self.rejected - here

    def _finished(self, request: Request) -> None:
        now = self.env.now
        # Request.latency, .ok and .queue_time written out: this runs for every request of the run.
        arrival, finish = request.arrival_time, request.finish_time
        latency = finish - arrival if finish is not None and arrival is not None else 0.0
        reason = request.finished_reason
        if reason is not None and reason != ABORT:
            self.completed += 1
            self.finish_times.append(now)
            self.latencies.append(latency)
            scheduled, queued = request.first_scheduled_time, request.queued_time
            if scheduled is not None and queued is not None:
                self.queue_times.append(scheduled - queued)
            self.calls.record(latency, ok=True)
            self.hold.accepted()
        else:
            # Aborted (its replica was lost): the item is retried, as an ingestion job would. A client sees the
            # connection drop (no HTTP status): an error, not a refusal, so no throttle rule reads it as a limit.
            self.errors += 1
            self.calls.record(latency, ok=False)
            self.retry.append(
                Request(
                    request.prompt_tokens,
                    max(1, request.output_tokens),
                    embedding=request.embedding,
                    tag=request.tag,
                    priority=request.priority,
                )
            )
        limiter = self.limiter
        granted = limiter.release(self._units.pop(id(request)))
        self.usage.note(limiter.inflight, now, limiter.units)  # _wake, written out
        for event in granted:
            event.succeed()

    def _refused(self, request: Request, retry_after_s: float) -> None:
        """A 429: throttled (not a success), hold admissions for the Retry-After, retry the item afterwards."""
        now = self.env.now
        self.throttled += 1
        self.throttle_times.append(now)
        self.calls.record(float(getattr(self.target, "refusal_latency_s", 0.0)), ok=False, status=429)
        # The hold before the slot is handed on, so the waiter it wakes starts after it.
        if self.schedule is None:  # the production rules, applied by the production runtime on this clock and hold
            self.runtime.note_retry_after(retry_after_s)  # with the backoff at the floor
        else:  # a schedule (the oracle): the hold as named
            self.hold.note(retry_after_s, now)
        self.retry.append(request)
        self._wake(self.limiter.release(self._units.pop(id(request))))
        if self.schedule is None:
            self.runtime.note_throttled()

    def _read(self) -> EngineSnapshot | None:
        """The signal source: the fleet's page through this client's interval meter (None while it is down); an
        empty snapshot for a client-side policy, as production's ClientOnlySource gives one."""
        if not self.engine_signals:
            return EngineSnapshot()
        if not self.metrics_up():
            return None
        try:
            return self.meter.advance(self.target.snapshot())
        except ConnectionError:
            return None

    def _poll(self, first_poll_s: float) -> Generator[Any, Any, None]:
        """The poller: the runtime's own poll path at the moments its core schedules (``next_poll_at``)."""
        env, core, runtime, read = self.env, self.core, self.runtime, self._read
        if first_poll_s > 0:
            yield env.timeout(first_poll_s)
        while True:
            self.poll_times.append(env.now)
            self.poll_targets.append(runtime.poll_with(read, "metrics unavailable"))
            yield env.timeout(max(0.0, core.next_poll_at - env.now))

    def _follow_schedule(self) -> Generator[Any, Any, None]:
        schedule = self.schedule
        assert schedule is not None
        for at in schedule.times():
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            limit = schedule.limit_at(at)
            self._resize(limit, schedule.budget_at(at))
            self.poll_times.append(self.env.now)
            self.poll_targets.append(limit)


class _Hold:
    """Placeholder policy for scheduled clients, whose core is never updated."""

    def next_target(self, target: float, obs: object) -> float:
        return target
