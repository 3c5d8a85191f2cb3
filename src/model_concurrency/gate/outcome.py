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

import email.utils
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import httpx

from model_concurrency.gate.stats import status_of

__all__ = [
    "DROPPED_REASON",
    "GENTLE_CUT_FACTOR",
    "CutOncePerFlight",
    "Kind",
    "Outcome",
    "classify",
    "classify_exception",
    "hold_from_headers",
    "is_connection_failure",
    "parse_duration",
    "parse_reset_time",
    "retry_after_from_headers",
]

DROPPED_REASON = "x-llm-d-request-dropped-reason"
# A queue-TTL expiry is a late sign of overload, not a refusal at the door: √0.9 of in flight instead of 0.9.
GENTLE_CUT_FACTOR = math.sqrt(0.9)


def retry_after_from_headers(headers: Mapping[str, str], now: Callable[[], datetime] | None = None) -> float | None:
    """The delay a response asks for: ``retry-after-ms``, else ``Retry-After`` (seconds or an HTTP date).

    None when there is none or it cannot be read (a malformed header is ignored, never raised: the response is
    still a 429 and counted as throttled).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        value = (when - (now() if now is not None else datetime.now(UTC))).total_seconds()
        return max(0.0, value)
    return value if math.isfinite(value) and value >= 0 else None


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")


def parse_duration(text: str) -> float | None:
    """Seconds in a Go-style duration as OpenAI's ``x-ratelimit-reset-*`` send them (``12ms``, ``1.5s``,
    ``6m0s``, ``1h2m3s``); a bare number is seconds. None when it cannot be read."""
    raw = text.strip().lower()
    try:
        value = float(raw)
    except ValueError:
        pos, value = 0, 0.0
        for match in _DURATION.finditer(raw):
            if match.start() != pos:
                return None
            pos = match.end()
            scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2)]
            value += float(match.group(1)) * scale
        if pos == 0 or pos != len(raw):
            return None
    return value if math.isfinite(value) and value >= 0 else None


def parse_reset_time(text: str, now: datetime) -> float | None:
    """Seconds from ``now`` until an RFC 3339 time (Anthropic's ``anthropic-ratelimit-*-reset``); 0 if past."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


_OPENAI_BUCKETS = ("requests", "tokens")
_ANTHROPIC_BUCKETS = ("requests", "tokens", "input-tokens", "output-tokens")


def hold_from_headers(headers: Mapping[str, str], now: Callable[[], datetime] | None = None) -> float | None:
    """The delay a rejection names: :func:`retry_after_from_headers` first; else the hosted APIs' bucket resets.

    A bucket with ``remaining`` 0 names when it refills; the longest of those is the delay (every empty bucket
    must refill). With no empty bucket reported, the earliest reset. None when nothing names a time.
    """
    explicit = retry_after_from_headers(headers, now)
    if explicit is not None:
        return explicit
    lowered = {k.lower(): v for k, v in headers.items()}
    wall = now() if now is not None else datetime.now(UTC)
    resets: list[tuple[bool, float]] = []  # (bucket empty, seconds until it refills)
    for bucket in _OPENAI_BUCKETS:
        reset = lowered.get(f"x-ratelimit-reset-{bucket}")
        seconds = parse_duration(reset) if reset is not None else None
        if seconds is not None:
            resets.append((lowered.get(f"x-ratelimit-remaining-{bucket}", "").strip() == "0", seconds))
    for bucket in _ANTHROPIC_BUCKETS:
        reset = lowered.get(f"anthropic-ratelimit-{bucket}-reset")
        seconds = parse_reset_time(reset, wall) if reset is not None else None
        if seconds is not None:
            resets.append((lowered.get(f"anthropic-ratelimit-{bucket}-remaining", "").strip() == "0", seconds))
    empty = [seconds for is_empty, seconds in resets if is_empty]
    if empty:
        return max(empty)
    return min((seconds for _, seconds in resets), default=None)


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
