"""The one code path from a finished call to its model's runtime: the table's verdict applied.

Every entry point ends a call here (``map_concurrent``'s and ``map_concurrent_sync``'s workers through
:meth:`~.target.Target.record`, ``slot`` on exit, and so the httpx transports and the wrapped OpenAI client, whose
requests are slots), so a rejection means the same thing whichever way the call was made:

* *cut* / *gentle-cut* / *hold*: the target drops to 0.9 (gentle: √0.9) × the calls in flight
  (:meth:`~model_concurrency.runtime.ModelRuntime.note_throttled`); a capacity refusal (cut, gentle cut) at most
  once per flight (:class:`~.outcome.CutOncePerFlight`), a rate limit's 429 with a delay (hold) at each refusal as
  before; a delay the rejection named holds new calls until then
  (:meth:`~model_concurrency.runtime.ModelRuntime.note_retry_after`);
* *outage*: the outage rule (:mod:`.outage`): new calls wait, one probe at a time, with backoff;
* *no-information* / *error*: nothing beyond the call's own record.

A call sent since an outage opened that succeeds, or gets any HTTP answer other than a proxy's 502/504, ends the
outage: the model is reachable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from model_concurrency.config import setting
from model_concurrency.gate.outage import MAX_OUTAGE_S
from model_concurrency.gate.outcome import GENTLE_CUT_FACTOR, Kind, Outcome, classify, classify_exception
from model_concurrency.runtime import ModelRuntime

__all__ = ["max_outage_s", "note_failure", "note_success", "outcome_of"]

log = logging.getLogger("model_concurrency")


def max_outage_s() -> float:
    """``MODEL_CONCURRENCY_MAX_OUTAGE_S`` now (default 60; 0 or less: the outage rule is off)."""
    return float(setting(*MAX_OUTAGE_S))


def outcome_of(exc: BaseException | None, status: int | None, headers: Mapping[str, str] | None) -> Outcome:
    """The verdict on a failed call: from the response a transport saw, else from the exception raised."""
    if status is not None:
        return classify(status, headers)
    if exc is not None:
        return classify_exception(exc)
    return classify(None)


def note_failure(runtime: ModelRuntime, outcome: Outcome, sent_at: float, *, answered: bool) -> None:
    """Apply ``outcome`` to the model. ``sent_at``: when the call started, on the runtime's clock; ``answered``:
    whether the server sent an HTTP response (the model is reachable, whatever it said)."""
    limiter = runtime.limiter
    outage = limiter.hold.outage
    if outcome.kind is Kind.OUTAGE:
        limit = max_outage_s()
        if outage.fail(sent_at, runtime.clock(), outcome.reason, limit):
            log.warning(
                "model %s unreachable (%s): new calls wait, one probe at a time; items fail after %g s "
                "(MODEL_CONCURRENCY_MAX_OUTAGE_S)",
                runtime.name,
                outcome.reason,
                limit,
            )
            runtime.apply_limits()  # pinned to one probe while the outage lasts (ModelLimiter.resize)
        return
    if answered:
        _reachable(runtime, sent_at)
    # Capacity refusals cut once per flight; a rate limit's 429 with a delay cuts at each refusal, as the lab's
    # clients do (docs/operations.md, "429 and Retry-After": the rule its figures were measured with).
    if outcome.cuts and (outcome.kind is Kind.HOLD or limiter.flights.admit(sent_at, runtime.clock())):
        runtime.note_throttled(GENTLE_CUT_FACTOR if outcome.kind is Kind.GENTLE_CUT else None)
    if outcome.hold_s is not None:
        runtime.note_retry_after(outcome.hold_s)


def note_success(runtime: ModelRuntime, sent_at: float) -> None:
    """A call sent at ``sent_at`` succeeded: an outage opened before it was sent is over."""
    if runtime.limiter.hold.outage.active:
        _reachable(runtime, sent_at)


def _reachable(runtime: ModelRuntime, sent_at: float) -> None:
    outage = runtime.limiter.hold.outage
    since = outage.since
    if outage.succeed(sent_at):
        gone = runtime.clock() - since if since is not None else 0.0
        log.warning("model %s reachable again after %.1f s; back to its target", runtime.name, gone)
        runtime.apply_limits()
