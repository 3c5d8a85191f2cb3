"""What both fan-outs share: an item's place in the results, and the rules for failures, retries and the end.

``map_concurrent`` (gate/aio.py) and ``map_concurrent_sync`` (gate/threaded.py) differ only in how they wait: on
an event loop or on threads. The rest is one set of rules, kept here, free of I/O and of waiting:

* every item pulled gets a place in ``results`` (input order), filled once by its outcome; a late outcome (a
  timed-out item's call that ends after all) finds the place taken and is dropped;
* without ``return_exceptions`` the first failure stops new starts and is raised at the end, the later ones
  listed in its notes; with it, a failed item's exception stands in its place;
* a failure of the fan-out itself (the caller's iterable, a bug in a worker) stops it too and wins at the end;
* with ``retries=N`` an item is sent again after a rejection or an outage (gate/retries.py); a failed probe, sent
  while the model was already unreachable, costs no attempt.

Each side subclasses :class:`Fanout` and adds its waiting; the options every front takes are typed once, in
:class:`FanOptions`.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any, Generic, TypedDict, TypeVar

from model_concurrency.gate.hold import Outage
from model_concurrency.gate.model_limiter import HOLDING, ModelLimiter
from model_concurrency.gate.retries import RetryPolicy, retry_policy
from model_concurrency.gate.target import Target, check_args, check_registered, check_weight

__all__ = ["PENDING", "Attempts", "FanOptions", "Fanout", "call_holding", "is_async_callable", "raise_first"]

T = TypeVar("T")
R = TypeVar("R")

# The public fronts' typed signatures, spelled once (gate/aio.py, gate/threaded.py).
Items = Iterable[T] | AsyncIterable[T]
AsyncFn = Callable[[T], Awaitable[R]]
Fn = Callable[[T], R]

PENDING: Any = object()  # an item's place before its outcome


class FanOptions(TypedDict, Generic[T], total=False):
    """The keyword options of ``map_concurrent``, ``imap_concurrent`` and ``map_concurrent_sync`` but
    ``return_exceptions`` (which decides their result type); each front's docstring says what they do."""

    model: str | None
    capacity: int | None
    timeout: float | None
    weight: Callable[[T], float] | None
    allow_unregistered: bool
    retries: int | RetryPolicy


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """``async def`` functions, partials of them, and objects whose ``__call__`` is ``async def``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def raise_first(first: tuple[int, BaseException], more: list[tuple[int, BaseException]], where: str) -> None:
    """Raise the first failure itself (so ``except SomeError`` works) with the others listed in its notes."""
    index, exc = first
    exc.add_note(f"{where}: item {index} failed first; no new item started after it")
    if more:
        listed = "; ".join(f"item {i}: {type(e).__name__}: {e}" for i, e in more[:10])
        extra = f" (and {len(more) - 10} more)" if len(more) > 10 else ""
        exc.add_note(f"{where}: {len(more)} more item(s) failed while running ones finished: {listed}{extra}")
    raise exc


def call_holding(fn: Callable[[Any], Any], value: Any, holding: tuple[ModelLimiter, ...]) -> tuple[Any, Any]:
    """``fn(value)`` on a worker thread, with the fan-out's held limiters in context (so a fan-out started inside
    it runs nested): ``(result, None)``, or ``(None, the exception)``."""
    token = HOLDING.set(holding)
    try:
        return fn(value), None
    except BaseException as exc:
        return None, exc
    finally:
        HOLDING.reset(token)


class Attempts:
    """One item's attempts under ``retries=``: the wait before the next one, or None when its outcome stands."""

    __slots__ = ("count", "outage", "policy", "probe")

    def __init__(self, policy: RetryPolicy, outage: Outage) -> None:
        self.policy, self.outage, self.count = policy, outage, 0
        self.probe = outage.active

    def begin(self) -> None:
        """Another attempt is about to be sent: note whether it is a probe (the model is unreachable)."""
        self.probe = self.outage.active

    def delay(self, exc: BaseException | None) -> float | None:
        """Seconds before sending again after ``exc``, or None (it stands); counts the attempt unless it was a failed
        probe (``max_outage_s`` bounds those)."""
        delay = self.policy.delay(exc, self.count)
        if delay is not None and not (self.probe and self.outage.active):
            self.count += 1
        return delay


class Fanout:
    """One fan-out call's bookkeeping: arguments, results in input order, failures; no I/O, no waiting.

    The constructor checks every argument before anything runs (a keyword no front takes is a ``TypeError``
    here). A side then sets :attr:`target` (its first touch of the model's runtime) and calls :meth:`enter`,
    :meth:`attempts`, :meth:`settle`, :meth:`fail` and :meth:`results_in_order`."""

    target: Target

    def __init__(
        self,
        fn: Callable[[Any], Any],
        *,
        return_exceptions: bool,
        model: str | None = None,
        capacity: int | None = None,
        timeout: float | None = None,
        weight: Callable[[Any], float] | None = None,
        allow_unregistered: bool = False,
        retries: int | RetryPolicy = 0,
    ) -> None:
        check_registered(model, allow_unregistered, pinned=capacity is not None)
        check_args(capacity, timeout)
        check_weight(weight)
        self.retry = retry_policy(retries)
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        self.fn = fn
        self.is_async = is_async_callable(fn)
        self.model, self.capacity, self.weight = model, capacity, weight
        self.return_exceptions = return_exceptions
        self.timeout = timeout
        self.streaming = False  # imap_concurrent: outcomes go to its consumer, not to ``results``
        self.results: list[Any] = []
        self.stopped = False
        self.first_error: tuple[int, BaseException] | None = None
        self.more_errors: list[tuple[int, BaseException]] = []
        self.fatal: BaseException | None = None
        self.holding: tuple[ModelLimiter, ...] = ()

    def enter(self) -> bool:
        """Add the model's limiter to the limiters this context holds; True when it already held it (this call runs
        inside an item of the same model, so it must never queue behind its parents' slots)."""
        limiter = self.target.limiter
        outer = HOLDING.get()
        nested = limiter in outer
        self.holding = outer if nested else (*outer, limiter)
        return nested

    def attempts(self) -> Attempts | None:
        """A new item's attempt count; None without ``retries=`` (one attempt, the common case)."""
        return None if self.retry is None else Attempts(self.retry, self.target.limiter.hold.outage)

    def settle(self, index: int, result: Any, exc: BaseException | None) -> bool:
        """Account item ``index``'s outcome; True when a stream's consumer is to get it (imap_concurrent)."""
        if exc is not None and not self.return_exceptions:
            if self.first_error is None:
                self.first_error = (index, exc)
                self.stopped = True
            else:
                self.more_errors.append((index, exc))
            if not self.streaming:
                self.results[index] = exc  # its place is taken; it is raised (or listed), never returned
            return False
        if self.streaming:
            return True
        self.results[index] = exc if exc is not None else result
        return False

    def fail(self, exc: BaseException) -> None:
        """The fan-out itself failed (not an item): no new starts; the first such failure is raised at the end."""
        if self.fatal is None:
            self.fatal = exc
        self.stopped = True

    def raise_failure(self, where: str) -> None:
        """At the end: raise the fan-out's own failure, else the first item's (the later ones in its notes)."""
        if self.fatal is not None:
            raise self.fatal
        if self.first_error is not None:
            raise_first(self.first_error, self.more_errors, where)

    def results_in_order(self, where: str) -> list[Any]:
        """The outcomes in input order, once every item has ended; a failure is raised instead."""
        self.raise_failure(where)
        if any(r is PENDING for r in self.results):  # a safety net: never hand back a result not produced
            raise RuntimeError(f"{where}: an item finished without a result or an exception (a bug)")
        return self.results
