"""``slot(model)``: one call of a fan-out this package does not run, counted and gated like the gate's own.

An application with its own pool, its own ``asyncio.gather`` or a framework's executor wraps each call::

    async with slot("bge-m3"):        # or: with slot("bge-m3"):
        await client.embeddings.create(...)

``slot(model, tokens=n)`` weighs the call by its tokens (prompt plus ``max_tokens``): it then waits while the
model's token budget is spent too (see docs/gate.md). Entering takes a permit from the model's limiter (waiting,
FIFO, while the target is reached), so the call is in
the in-flight count the policy reads; leaving releases it and records the call's latency and outcome (an
exception's HTTP status when it carries one, or the status a transport reported with :meth:`slot.set_status`)
for the next poll. A failed call is classified (gate/outcome.py) and its verdict applied (gate/rejections.py): a
refusal cuts the target once per flight, a delay it names holds the model's admissions (:mod:`.hold`), a refused
connection opens the outage hold (:mod:`.outage`); entering a slot waits for either hold, and a throttled call never
counts as a success.
While any slot is held the model's runtime polls on schedule. The sync form never blocks an event loop it is
not running on; used inside a running loop it would, so use ``async with`` there.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from model_concurrency.config import get_model
from model_concurrency.gate.hold import wait_hold, wait_hold_async
from model_concurrency.gate.model_limiter import ModelLimiter
from model_concurrency.gate.outcome import Outcome
from model_concurrency.gate.rejections import note_failure, note_success, outcome_of
from model_concurrency.gate.stats import status_of
from model_concurrency.gate.target import checked_tokens
from model_concurrency.hooks import check_registered, warn_unknown
from model_concurrency.runtime import ModelRuntime, runtime_for

__all__ = ["slot"]


class slot:
    """A context manager (sync and async) holding one permit of ``model``'s limiter for one call."""

    __slots__ = ("_outcome", "_runtime", "_sent_at", "_status", "model", "tokens")

    def __init__(
        self, model: str | None = None, *, tokens: float | None = None, allow_unregistered: bool = False
    ) -> None:
        # A name the registry does not know is the caller's error here, before any permit is taken; with
        # allow_unregistered the call runs at the floor (capacity 1) instead, with one warning per name.
        check_registered(model, allow_unregistered)
        self.model = model
        # Checked here, before any permit is taken: a bad weight is the caller's error, never a leaked slot.
        self.tokens = 0 if tokens is None else checked_tokens(tokens, " (slot tokens=)")
        self._runtime: ModelRuntime | None = None
        self._sent_at = 0.0
        self._status: int | None = None
        self._outcome: Outcome | None = None  # a response's verdict, applied when it arrived

    @property
    def runtime(self) -> ModelRuntime | None:
        """The model's runtime while the slot is held (None outside)."""
        return self._runtime

    def set_status(self, status: int, retry_after_s: float | None = None) -> None:
        """The call's HTTP status, for callers that get a response instead of an exception (a transport).

        A status >= 400 makes the call a failure, classified by the table (gate/outcome.py); ``retry_after_s``
        stands for a ``Retry-After`` header. :meth:`set_response` passes every header instead.
        """
        headers = {"retry-after": repr(float(retry_after_s))} if retry_after_s is not None else None
        self.set_response(status, headers)

    def set_response(self, status: int, headers: Mapping[str, str] | None = None) -> None:
        """The call's HTTP status and response headers: a failure's verdict (cut, hold, outage...) is applied when
        the slot is left, by the same rule as every other entry point (gate/rejections.py)."""
        self._status = status
        self._outcome = outcome_of(None, status, headers) if status >= 400 else None

    def _begin(self) -> ModelRuntime:
        if self._runtime is not None:
            raise RuntimeError("this slot is already held; make one slot(model) per call")
        if get_model(self.model) is None:
            warn_unknown(self.model)
        runtime = runtime_for(self.model)
        self._status, self._outcome = None, None
        runtime.enter()
        try:
            runtime.apply_limits()
        except BaseException:
            runtime.leave()
            raise
        self._runtime = runtime
        return runtime

    def _end(self, exc: BaseException | None) -> None:
        runtime, self._runtime = self._runtime, None
        assert runtime is not None
        latency = runtime.limiter.clock() - self._sent_at  # the runtime's clock, as the poll's intervals
        runtime.limiter.release(self.tokens)
        status, outcome = self._status, self._outcome
        if exc is None and (status is None or status < 400):
            runtime.calls.record(latency, ok=True, status=status)
            runtime.limiter.hold.accepted()
            note_success(runtime, self._sent_at)
        else:
            if outcome is None:  # no response reported: the exception says what happened
                outcome = outcome_of(exc, status, None)
                status = status_of(exc) if status is None and exc is not None else status
            runtime.calls.record(latency, ok=False, status=status, throttled=outcome.throttled)
            note_failure(runtime, outcome, self._sent_at, answered=status is not None)
        runtime.leave()

    def _abandon(self, limiter: ModelLimiter | None = None) -> None:
        """Entering failed: give back the slot (if ``limiter``'s was granted) and leave the runtime."""
        if limiter is not None:
            limiter.release(self.tokens)
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.leave()

    def _started(self, limiter: ModelLimiter) -> slot:
        self._sent_at = limiter.clock()
        return self

    def __enter__(self) -> slot:
        limiter = self._begin().limiter
        granted = None
        try:
            wait_hold(limiter.hold, limiter.clock)
            waiter = limiter.acquire_or_enqueue_thread(self.tokens)
            if waiter is not None:
                try:
                    waiter.wait()
                except BaseException:
                    if not limiter.withdraw(waiter):
                        limiter.release(self.tokens)
                    raise
            granted = limiter
            wait_hold(limiter.hold, limiter.clock)  # granted by a release during the hold
        except BaseException:
            self._abandon(granted)
            raise
        return self._started(limiter)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end(exc)

    async def __aenter__(self) -> slot:
        limiter = self._begin().limiter
        granted = None
        try:
            await wait_hold_async(limiter.hold, limiter.clock)
            await limiter.acquire(self.tokens)
            granted = limiter
            await wait_hold_async(limiter.hold, limiter.clock)  # granted by a release during the hold
        except BaseException:
            self._abandon(granted)
            raise
        return self._started(limiter)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end(exc)
