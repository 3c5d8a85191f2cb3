"""What a failed call says: the classification table (pure: a status, headers and an exception in, a verdict out).

Engines and gateways now refuse instead of queueing forever, and each refusal means something different for the
fan-out (docs/operations.md, "Rejections and outages"):

==========================================================  =================  ================================
a failed call                                               verdict            what the gate does
==========================================================  =================  ================================
llm-d ``x-llm-d-request-dropped-reason: rejected-saturated``  cut              target → 0.9 × in flight
llm-d ``... rejected-ttl-expired``                          gentle-cut         target → 0.95 × in flight
llm-d ``... evicted…``                                      no-information     nothing (not counted throttled)
connection refused / reset, a proxy's 502 / 504             outage             hold new starts, probe, resume
429 with a delay (``retry-after(-ms)``, OpenAI                hold             no start before it; and a cut
``x-ratelimit-*``, Anthropic ``anthropic-ratelimit-*``)
429 without one                                             cut
503 (vLLM ``--max-num-queued-reqs``, SGLang queue full)     cut (+ hold if     target → 0.9 × in flight
                                                            it names a delay)
529 (NVIDIA Dynamo: every worker busy)                      cut
anything else (400, 500, a bug in the caller's code)        error              nothing
==========================================================  =================  ================================

The reason header wins over the status (llm-d sheds with 429 *or* 503). ``x-should-retry`` (OpenAI) only says
whether ``retries=`` may send the call again. A capacity refusal (cut, gentle cut) cuts at most once per flight
(:class:`CutOncePerFlight`): refusals of calls sent before the last cut are the same overload seen late. A rate
limit's 429 with a delay (hold) keeps cutting at each refusal, the rule docs/operations.md measured for it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import httpx

from model_concurrency.gate.hold import hold_from_headers
from model_concurrency.gate.stats import status_of

__all__ = [
    "DROPPED_REASON",
    "GENTLE_CUT_FACTOR",
    "CutOncePerFlight",
    "Kind",
    "Outcome",
    "classify",
    "classify_exception",
    "is_connection_failure",
]

DROPPED_REASON = "x-llm-d-request-dropped-reason"
# A queue-TTL expiry is a late sign of overload, not a refusal at the door: √0.9 of in flight instead of 0.9.
GENTLE_CUT_FACTOR = math.sqrt(0.9)


class Kind(StrEnum):
    CUT = "cut"
    GENTLE_CUT = "gentle-cut"
    HOLD = "hold"
    NO_INFORMATION = "no-information"
    OUTAGE = "outage"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One failed call's verdict, why, the delay it named (seconds) and whether a retry may resend it."""

    kind: Kind
    reason: str
    hold_s: float | None = None
    retryable: bool = True

    @property
    def cuts(self) -> bool:
        """Whether the target drops (subject to the once-per-flight rule)."""
        return self.kind in (Kind.CUT, Kind.GENTLE_CUT, Kind.HOLD)

    @property
    def throttled(self) -> bool:
        """Whether the call counts as throttled for the policy and the guard (a refusal that says "slow down")."""
        return self.cuts


def _should_retry(headers: Mapping[str, str], default: bool) -> bool:
    value = headers.get("x-should-retry")
    if value is None:
        return default
    return value.strip().lower() == "true"


def classify(
    status: int | None,
    headers: Mapping[str, str] | None = None,
    *,
    connection_failed: bool = False,
    now: Callable[[], datetime] | None = None,
) -> Outcome:
    """The verdict on a failed call from its HTTP status and response headers (see the module's table)."""
    if connection_failed:
        return Outcome(Kind.OUTAGE, "connection refused or reset")
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    dropped = lowered.get(DROPPED_REASON, "").strip().lower()
    if dropped == "rejected-saturated":
        return Outcome(Kind.CUT, "llm-d: rejected-saturated", hold_from_headers(lowered, now))
    if dropped == "rejected-ttl-expired":
        return Outcome(Kind.GENTLE_CUT, "llm-d: rejected-ttl-expired", hold_from_headers(lowered, now))
    if dropped.startswith("evicted"):
        return Outcome(Kind.NO_INFORMATION, f"llm-d: {dropped}")
    if status in (502, 504):
        return Outcome(Kind.OUTAGE, f"{status} from a proxy: the engine behind it is unreachable")
    if status == 529:
        return Outcome(Kind.CUT, "529: every worker busy", hold_from_headers(lowered, now))
    if status == 503:
        return Outcome(Kind.CUT, "503: queue full", hold_from_headers(lowered, now))
    if status == 429:
        delay = hold_from_headers(lowered, now)
        retry = _should_retry(lowered, True)
        if delay is not None:
            return Outcome(Kind.HOLD, "429 with a delay", delay, retry)
        if not retry:  # e.g. a quota exhausted: refusing again tomorrow says nothing about concurrency
            return Outcome(Kind.NO_INFORMATION, "429, x-should-retry: false", None, False)
        return Outcome(Kind.CUT, "429", None, True)
    return Outcome(Kind.ERROR, f"status {status}" if status is not None else "no status", None, False)


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,  # refused, reset, aborted, broken pipe
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,  # "server disconnected without sending a response": killed mid-call
    httpx.ReadError,
    httpx.WriteError,
)


def is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps: openai's ``APIConnectionError``) is a refused or dropped connection."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, _CONNECTION_ERRORS):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def classify_exception(exc: BaseException, now: Callable[[], datetime] | None = None) -> Outcome:
    """The verdict on a call that raised: its response's status and headers when it kept one."""
    status = status_of(exc)
    if status is None:
        if is_connection_failure(exc):
            return classify(None, connection_failed=True)
        return Outcome(Kind.ERROR, type(exc).__name__, None, False)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    usable = headers if headers is not None and hasattr(headers, "items") else None
    return classify(status, dict(usable.items()) if usable is not None else None, now=now)


class CutOncePerFlight:
    """The llm-d-async rule: a refusal cuts only if its call was sent at or after the last cut.

    Calls already in flight when the target was cut were sized by the old target; their refusals report the
    overload the cut already answered. Without this, a burst of N refusals cut N times (0.9^N).
    """

    __slots__ = ("_lock", "cuts", "ignored", "last_cut_at")

    def __init__(self) -> None:
        self.last_cut_at = -math.inf
        self.cuts = 0
        self.ignored = 0
        self._lock = threading.Lock()

    def admit(self, sent_at: float, now: float) -> bool:
        """True (and the cut is recorded at ``now``) when the call was sent at or after the last cut."""
        with self._lock:
            if sent_at < self.last_cut_at:
                self.ignored += 1
                return False
            self.last_cut_at = max(self.last_cut_at, now)
            self.cuts += 1
            return True
