"""One job, many Ray workers, one budget: a coordinator actor per (job, model) and its workers' leases.

(Over 400 lines: a worker's whole side of the lease in one place, its session, renewal thread, fall-back and
rejoin, the admission that holds items back at a grant of 0, and the entry points the fan-outs call; the
bookkeeping is lease.py's, the coordinator ray_coordinator.py's.)

Without a job every Ray worker is an independent client (docs/scale-out.md). With ``FanOut(..., job="name")`` the
workers of that job share one :class:`~model_concurrency.runtime.ModelRuntime` per model, owned by a
:class:`JobCoordinator` actor: only it polls the engine (one scrape per poll for the whole job), its policy and
growth guard decide the job's target, and a :class:`~model_concurrency.lease.LeaseBook` splits that target among
the workers with items to run. A worker never calls the coordinator per item: a thread renews its lease when the
grant says (once per renewal interval, half the lease, and sooner while the split is unsettled:
:func:`~model_concurrency.lease.renewal_due`), handing back what it does not use and reporting its calls, and
resizes the worker's own limiter to the grant through the worker's runtime (:meth:`ModelRuntime.lease`, the
limiter's only writer still). A grant of 0 permits holds the worker's items back before they take a slot
(:class:`_Admission`): the limiter's least is one call.

The coordinator is a detached, named actor in the Ray namespace :data:`NAMESPACE`, created by whichever worker
asks first (``get_if_exists``: no race), and it ends itself once no worker has held a lease for a while. If it
dies, each worker keeps its grant until the lease's deadline, then runs on its own runtime from its last grant
(:meth:`~model_concurrency.lease.Fallback.start_target`, never the ceiling) and keeps asking; the next ask
creates a new coordinator, and the worker rejoins with the calls it has in flight. A worker that dies stops
renewing: its permits come back when its lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from model_concurrency.extras import require
from model_concurrency.gate.fanout import is_async_callable
from model_concurrency.lease import (
    Fallback,
    Grant,
    LeaseConfig,
    LeaseConfigError,
    UnknownWorker,
    add_stats,
    renewal_due,
)
from model_concurrency.observation import CallStats
from model_concurrency.ray_coordinator import (
    NAMESPACE,
    Configurable,
    coordinator,
    coordinator_name,
    job_name,
    lease_config_for,
    lease_seconds,
)
from model_concurrency.runtime import LeaseView, ModelRuntime, runtime_for

__all__ = ["NAMESPACE", "coordinator_name", "prepare_job", "run_in_job"]

log = logging.getLogger("model_concurrency")

# How long a worker's first fan-out of a job waits for its first grant (it may be creating the coordinator, which
# starts a Ray worker process) before it runs on its own from the floor and keeps asking.
JOIN_WAIT_S = 30.0
# A worker with no fan-out of the job running for this many renewal intervals (half-leases) leaves the job.
LINGER_RENEWALS = 10
# How often an ``async def`` item held back by a grant of 0 looks at the grant again (a thread is woken instead).
ADMISSION_STEP_S = 0.05


class _Admission:
    """Whether this worker may start a call of the job: not while its grant is 0 permits.

    The limiter's least is one call (at 0 a fan-out would have nothing to wake it), so a grant of 0 alone would
    still let each such worker run one call past the job's target. A grant is 0 when the target is split among
    others, or while what this worker was given is still held by workers whose share fell. Its items then wait
    here, before they take a slot, while its renewals state its demand; the shares are split again at every change
    of demand, so it waits for the others' calls to end, never for its own."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        # Calls that took a slot just as the grant fell to 0 and wait in it: not running, so not counted as in use.
        self.parked = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def set(self, permits: int | None) -> None:
        """The grant in force; None (no grant: the worker runs alone, or left the job) lets every call start."""
        with self._cond:
            self._closed = permits == 0
            if not self._closed:
                self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)

    async def wait_async(self) -> None:
        while self._closed:
            await asyncio.sleep(ADMISSION_STEP_S)

    def items(self, items: Sequence[Any], on_a_loop: bool) -> Iterable[Any] | AsyncIterable[Any]:
        """``items``, each handed to the fan-out once a call may start (on a loop without blocking it)."""

        def held_back() -> Iterator[Any]:
            for item in items:
                if self._closed:
                    self.wait()
                yield item

        async def held_back_async() -> AsyncIterator[Any]:
            for item in items:
                await self.wait_async()
                yield item

        return held_back_async() if on_a_loop else held_back()

    def calls(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn``, held back in its slot if the grant fell to 0 after its item was handed over (rare: the item's
        wait for a slot outlasted a renewal that left nothing running)."""
        if is_async_callable(fn):

            async def acall(item: Any) -> Any:
                if self._closed:
                    with self._parking():
                        await self.wait_async()
                return await fn(item)

            return acall

        def call(item: Any) -> Any:
            if self._closed:
                with self._parking():
                    self.wait()
            return fn(item)

        return call

    @contextmanager
    def _parking(self) -> Iterator[None]:
        with self._cond:
            self.parked += 1
        try:
            yield
        finally:
            with self._cond:
                self.parked -= 1


class _Session:
    """One worker's membership of a job, from its first fan-out until it leaves: its id, grant and renewals."""

    def __init__(self, lease_config: LeaseConfig) -> None:
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_s = lease_seconds()
        self.interval = self.lease_s / 2
        self.fallback = Fallback(lease_config, lease_s=self.lease_s, started_at=time.monotonic())
        self.grant: Grant | None = None  # the book holds this worker with this grant; None: request (again)
        self.alone = False
        self.pending: tuple[Any, float, CallStats] | None = None  # one call to the coordinator at a time
        self.sent_at = time.monotonic()  # when the last call to the coordinator went out
        self.due: float | None = None  # when to renew, from the last grant; None: an interval after sent_at
        self.backlog = CallStats()  # reports a coordinator has not taken
        self.idle_since: float | None = None  # since when no fan-out of the job runs here
        self.ended = False


class _JobClient:
    """This process's side of one (job, model): the items its fan-outs still have to run (its demand), the session,
    and the renewal thread. The thread makes every call to the coordinator after the first, one at a time."""

    def __init__(self, job: str, runtime: ModelRuntime, creator: Configurable, lease_config: LeaseConfig) -> None:
        self.job, self.runtime, self.creator, self.config = job, runtime, creator, lease_config
        self.handle: Any = None
        self.remaining = 0  # items not finished in this process's running fan-outs of the job
        self.active = 0
        self.session: _Session | None = None
        self.admission = _Admission()
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def demand(self) -> int:
        return min(self.remaining, self.config.ceiling)

    @contextmanager
    def fan_out(self, count: int) -> Iterator[Callable[[], None]]:
        """One fan-out of ``count`` items in this process: its items count in the demand until each finishes."""
        left = [count]

        def tick() -> None:
            with self._lock:
                if left[0] > 0:
                    left[0] -= 1
                    self.remaining -= 1

        self._begin(count)
        try:
            yield tick
        finally:
            with self._lock:
                self.active -= 1
                self.remaining -= left[0]
                left[0] = 0

    def _begin(self, count: int) -> None:
        with self._lock:
            self.active += 1
            was, self.remaining = self.remaining, self.remaining + count
            session = self.session
            if session is None:
                session = self.session = _Session(self.config)
            else:
                session.idle_since = None
                if was == 0 and count > 0:
                    self._wake.set()  # a demand that was 0 is re-split at once, not at the next renewal
                return
        try:
            self._join(session)
        except LeaseConfigError:
            with self._lock:
                self.active -= 1
                self.remaining -= count
                self.session = None
            raise
        threading.Thread(
            target=self._run, args=(session,), name=f"model-concurrency-lease-{self.job}", daemon=True
        ).start()

    def _join(self, session: _Session) -> None:
        """The first grant, waited for: the worker starts from a grant, not from its own floor."""
        ray = require("ray", "ray", "model_concurrency.ray_job")
        try:
            self.handle = coordinator(self.job, self.runtime.name, self.creator, self.config)
            # Timed from when the coordinator is up: creating it (a worker process) is not part of the lease.
            ray.get(self.handle.__ray_ready__.remote(), timeout=JOIN_WAIT_S)
            sent_at = session.sent_at = time.monotonic()
            grant = ray.get(self._request(session), timeout=JOIN_WAIT_S)
        except LeaseConfigError as exc:
            raise LeaseConfigError(str(getattr(exc, "cause", None) or exc)) from None
        except Exception as exc:
            log.warning("job %s, model %s: no coordinator answered (%s); running alone meanwhile", self.job,
                        self.runtime.name, type(exc).__name__)  # fmt: skip
            self.handle = None
            self._go_alone(session)
        else:
            self._granted(session, grant, sent_at)

    def _request(self, session: _Session) -> Any:
        running, units = self._running()
        last = session.fallback.last
        return self.handle.request.remote(
            session.worker,
            self.demand(),
            inflight=running,
            inflight_tokens=units,
            config=self.config,
            last_target=last.job_target if last is not None else None,
        )

    def _running(self) -> tuple[int, int]:
        """The calls (and tokens) this worker has in flight; a call parked by :class:`_Admission` is not one."""
        limits = self.runtime.limits
        return max(0, limits.inflight() - self.admission.parked), limits.units()

    def _apply(self, view: LeaseView | None, start: int | None = None) -> None:
        """The runtime's limits and the admission, from one view: closed before the limiter moves, opened after."""
        if view is not None and view.permits == 0:
            self.admission.set(0)
        self.runtime.lease(view, start=start)
        self.admission.set(None if view is None else view.permits)

    def _granted(self, session: _Session, grant: Grant, sent_at: float) -> None:
        if time.monotonic() > sent_at + grant.lease_s:  # answered after its own deadline: stale, ask again
            session.grant = None
            self._go_alone(session)
            return
        session.grant, session.alone = grant, False
        session.fallback.granted(grant, sent_at=sent_at)
        session.lease_s, session.interval = grant.lease_s, grant.lease_s / 2
        session.due = renewal_due(grant, sent_at=sent_at, answered_at=time.monotonic())
        self._apply(LeaseView(self.job, grant.permits, grant.tokens, grant.job_target))

    def _go_alone(self, session: _Session) -> None:
        if session.alone:
            return
        session.alone = True
        last = session.fallback.last
        view = LeaseView(self.job, None, None, last.job_target if last is not None else None)
        start = session.fallback.start_target()
        log.warning("job %s, model %s: the lease lapsed; running alone from %d until a coordinator answers",
                    self.job, self.runtime.name, start)  # fmt: skip
        self._apply(view, start=start)

    # -- the renewal thread --------------------------------------------------------------------------------
    def _run(self, session: _Session) -> None:
        while True:
            if session.pending is None:
                # When the last grant said; without one, an interval after the last call went out, not after its
                # answer: a grant lasts lease_s from its sending, so a late answer must not also delay the next.
                due = session.due if session.due is not None else session.sent_at + session.interval
                self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            with self._lock:
                now = time.monotonic()
                if self.active:
                    session.idle_since = None
                elif session.idle_since is None:
                    session.idle_since = now
                idle = session.idle_since is not None and now - session.idle_since > LINGER_RENEWALS * session.interval
                if idle and session.pending is None:
                    self.session, session.ended = None, True
            if session.ended:
                self._leave(session)
                return
            try:
                self._cycle(session)
            except Exception:  # the thread must outlive any one failure: the worker's calls depend on it
                log.exception("job %s, model %s: a lease renewal failed", self.job, self.runtime.name)

    def _cycle(self, session: _Session) -> None:
        ray = require("ray", "ray", "model_concurrency.ray_job")
        if session.pending is None:
            session.pending = self._send(session)
        if session.pending is not None:
            ref, sent_at, report = session.pending
            # Until the grant's deadline (a lapse is noticed on time), then an interval at a time.
            left = session.fallback.deadline - time.monotonic()
            ready, _ = ray.wait([ref], timeout=left if left > 0 else session.interval)
            if ready:
                session.pending = None
                self._answer(session, ref, sent_at, report)
        if not session.alone and session.fallback.lapsed(time.monotonic()):
            session.grant = None
            self._go_alone(session)

    def _send(self, session: _Session) -> tuple[Any, float, CallStats] | None:
        sent_at = session.sent_at = time.monotonic()
        session.due = None  # until this call's answer names the next renewal
        report = session.backlog
        if not session.alone:  # alone, the runtime's own polls read its calls
            report = add_stats(report, self.runtime.calls.drain())
        session.backlog = CallStats()
        try:
            if self.handle is None:
                self.handle = coordinator(self.job, self.runtime.name, self.creator, self.config)
            if session.grant is None:
                session.backlog = report  # a request carries no report: the next renewal does
                return self._request(session), sent_at, CallStats()
            unused, unused_tokens = self._hand_back(session.grant)
            ref = self.handle.renew.remote(
                session.worker, self.demand(), unused=unused, unused_tokens=unused_tokens, report=report
            )
            return ref, sent_at, report
        except Exception as exc:
            log.debug("job %s: no coordinator reached: %s", self.job, exc)
            self.handle, session.backlog = None, report
            return None

    def _hand_back(self, grant: Grant) -> tuple[int, int]:
        """What a renewal hands back: the permits (and tokens) not in use. Until its answer they are no longer this
        worker's (the book may grant them to another at once), so no call starts on top of those running."""
        running, units = self._running()
        unused, unused_tokens = max(0, grant.held - running), max(0, grant.held_tokens - units)
        tokens = None if grant.tokens is None else min(grant.tokens, grant.held_tokens - unused_tokens)
        self._apply(LeaseView(self.job, min(grant.permits, grant.held - unused), tokens, grant.job_target))
        return unused, unused_tokens

    def _answer(self, session: _Session, ref: Any, sent_at: float, report: CallStats) -> None:
        ray = require("ray", "ray", "model_concurrency.ray_job")
        try:
            grant = ray.get(ref)
        except UnknownWorker:  # the book let the lease expire: rejoin with the calls in flight
            session.grant, session.backlog = None, add_stats(session.backlog, report)
        except LeaseConfigError as exc:  # a new coordinator created from another configuration: stay alone
            log.error("job %s: %s", self.job, getattr(exc, "cause", exc))
            session.grant = None
            self._go_alone(session)
        except Exception as exc:  # the coordinator died (or the call failed): a new one is asked for next time
            log.debug("job %s: the coordinator did not answer: %s", self.job, exc)
            self.handle, session.grant = None, None
        else:
            self._granted(session, grant, sent_at)

    def _leave(self, session: _Session) -> None:
        """No fan-out of the job for a while: hand everything back and let the runtime decide alone again."""
        if self.handle is not None and session.grant is not None:
            report = add_stats(session.backlog, self.runtime.calls.drain())
            try:
                self.handle.leave.remote(session.worker, report)
            except Exception as exc:
                log.debug("job %s: leaving failed: %s (the lease expires instead)", self.job, exc)
        with self._lock:
            if self.session is None:  # no new session started meanwhile: the runtime is this session's to reset
                self._apply(None, start=session.fallback.start_target())


_clients: dict[tuple[str, str], _JobClient] = {}
_clients_lock = threading.Lock()


def _client(job: str, runtime: ModelRuntime, creator: Configurable, lease_config: LeaseConfig) -> _JobClient:
    key = (job, runtime.name)
    with _clients_lock:
        client = _clients.get(key)
        if client is None or client.runtime is not runtime:  # the model was re-registered: a new runtime
            client = _clients[key] = _JobClient(job, runtime, creator, lease_config)
        elif client.config != lease_config:
            raise LeaseConfigError(
                f"job {job!r}, model {runtime.name!r}: this process joined with {client.config}, now asked with "
                f"{lease_config}; every fan-out of a job must share one configuration"
            )
        return client


def counted(fn: Callable[[Any], Any], tick: Callable[[], None]) -> Callable[[Any], Any]:
    """``fn`` that ticks when each call ends, whatever its outcome (an ``async def`` stays one)."""
    if is_async_callable(fn):

        async def acall(item: Any) -> Any:
            try:
                return await fn(item)
            finally:
                tick()

        return acall

    def call(item: Any) -> Any:
        try:
            return fn(item)
        finally:
            tick()

    return call


def run_in_job(
    job: str,
    creator: Configurable,
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    run: Callable[[Iterable[Any] | AsyncIterable[Any], Callable[[Any], Any]], list[Any]],
) -> list[Any]:
    """``run(items, fn)`` as a worker of ``job``: under the worker's lease from the (job, model) coordinator.

    ``creator`` is what the coordinator is built from if this worker is the first to ask (the fan-out without its
    per-item function). Refused with :class:`~model_concurrency.lease.LeaseConfigError` when this worker's floor,
    ceiling or policy differ from the job's."""
    runtime = runtime_for(creator.model)
    if runtime.spec is None:
        raise ValueError(f"model {creator.model!r} is not registered in this worker")
    client = _client(job_name(job), runtime, creator, lease_config_for(runtime.spec))
    admission = client.admission
    with client.fan_out(len(items)) as tick:
        return run(admission.items(items, is_async_callable(fn)), counted(admission.calls(fn), tick))


def prepare_job(job: str, creator: Configurable) -> None:
    """Find or create the (job, model) coordinator now, before any item: an actor or a Data pool calls this when
    it is built, so its first batch does not wait for the coordinator's process to start. Joining waits for the
    first fan-out; a coordinator that cannot be reached now is only logged (the first fan-out asks again)."""
    ray = require("ray", "ray", "model_concurrency.ray_job")
    runtime = runtime_for(creator.model)
    if runtime.spec is None:
        raise ValueError(f"model {creator.model!r} is not registered in this worker")
    handle = coordinator(job_name(job), runtime.name, creator, lease_config_for(runtime.spec))
    try:
        ray.get(handle.__ray_ready__.remote(), timeout=JOIN_WAIT_S)
    except Exception as exc:
        log.warning("job %s, model %s: the coordinator is not up yet (%s)", job, runtime.name, type(exc).__name__)
