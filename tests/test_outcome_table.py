"""The classification table (gate/outcome.py), exact; the hold's header readers; the once-per-flight rule."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency.gate.hold import hold_from_headers, parse_duration, parse_reset_time
from model_concurrency.gate.outcome import (
    GENTLE_CUT_FACTOR,
    CutOncePerFlight,
    Kind,
    Outcome,
    classify,
    classify_exception,
)

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def fixed() -> datetime:
    return NOW


DROPPED = "x-llm-d-request-dropped-reason"


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (503, {}, Outcome(Kind.CUT, "503: queue full")),
        (503, {"Retry-After": "2"}, Outcome(Kind.CUT, "503: queue full", 2.0)),
        (529, {}, Outcome(Kind.CUT, "529: every worker busy")),
        (429, {DROPPED: "rejected-saturated"}, Outcome(Kind.CUT, "llm-d: rejected-saturated")),
        (503, {DROPPED: "rejected-saturated"}, Outcome(Kind.CUT, "llm-d: rejected-saturated")),
        (503, {DROPPED: "rejected-ttl-expired"}, Outcome(Kind.GENTLE_CUT, "llm-d: rejected-ttl-expired")),
        (429, {DROPPED: "evicted-preempted"}, Outcome(Kind.NO_INFORMATION, "llm-d: evicted-preempted")),
        (429, {DROPPED: "Evicted"}, Outcome(Kind.NO_INFORMATION, "llm-d: evicted")),
        (502, {}, Outcome(Kind.OUTAGE, "502 from a proxy: the engine behind it is unreachable")),
        (504, {}, Outcome(Kind.OUTAGE, "504 from a proxy: the engine behind it is unreachable")),
        (429, {}, Outcome(Kind.CUT, "429")),
        (429, {"retry-after": "3"}, Outcome(Kind.HOLD, "429 with a delay", 3.0)),
        (
            429,
            {"retry-after-ms": "1500", "x-should-retry": "true", "x-ratelimit-remaining-requests": "0"},
            Outcome(Kind.HOLD, "429 with a delay", 1.5),
        ),
        (
            429,
            {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"},
            Outcome(Kind.HOLD, "429 with a delay", 360.0),
        ),
        (
            429,
            {
                "x-ratelimit-remaining-requests": "12",
                "x-ratelimit-reset-requests": "1s",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "12ms",
            },
            Outcome(Kind.HOLD, "429 with a delay", 0.012),
        ),
        (
            429,
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": "2026-12-01T12:00:30Z",
                "anthropic-ratelimit-tokens-remaining": "0",
                "anthropic-ratelimit-tokens-reset": "2026-12-01T12:00:45+00:00",
            },
            Outcome(Kind.HOLD, "429 with a delay", 45.0),
        ),
        (
            429,
            {"retry-after": "4", "anthropic-ratelimit-requests-remaining": "0"},
            Outcome(Kind.HOLD, "429 with a delay", 4.0),
        ),
        (429, {"x-should-retry": "false"}, Outcome(Kind.NO_INFORMATION, "429, x-should-retry: false", None, False)),
        (429, {"x-should-retry": "false", "retry-after": "1"}, Outcome(Kind.HOLD, "429 with a delay", 1.0, False)),
        (500, {}, Outcome(Kind.ERROR, "status 500", None, False)),
        (400, {"retry-after": "9"}, Outcome(Kind.ERROR, "status 400", None, False)),
        (None, None, Outcome(Kind.ERROR, "no status", None, False)),
    ],
)
def test_the_table(status: int | None, headers: dict[str, str] | None, expected: Outcome) -> None:
    assert classify(status, headers, now=fixed) == expected


def test_verdict_properties() -> None:
    assert [k for k in Kind if Outcome(k, "").cuts] == [Kind.CUT, Kind.GENTLE_CUT, Kind.HOLD]
    assert classify(None, connection_failed=True) == Outcome(Kind.OUTAGE, "connection refused or reset")
    assert math.isclose(GENTLE_CUT_FACTOR, 0.9**0.5)


def _status_error(status: int, headers: dict[str, str]) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://h/v1/embeddings")
    response = httpx.Response(status, headers=headers, request=request)
    return httpx.HTTPStatusError("refused", request=request, response=response)


def test_exceptions() -> None:
    request = httpx.Request("POST", "http://h/v1/embeddings")
    assert classify_exception(httpx.ConnectError("refused", request=request)).kind is Kind.OUTAGE
    assert classify_exception(httpx.RemoteProtocolError("server disconnected", request=request)).kind is Kind.OUTAGE
    assert classify_exception(httpx.ReadError("reset", request=request)).kind is Kind.OUTAGE
    assert classify_exception(ConnectionRefusedError()).kind is Kind.OUTAGE
    assert classify_exception(ValueError("a bug")) == Outcome(Kind.ERROR, "ValueError", None, False)
    assert classify_exception(httpx.ReadTimeout("slow", request=request)).kind is Kind.ERROR
    wrapped = openai.APIConnectionError(request=request)
    wrapped.__cause__ = httpx.ConnectError("refused", request=request)
    assert classify_exception(wrapped).kind is Kind.OUTAGE
    assert classify_exception(_status_error(429, {"retry-after-ms": "250"})) == Outcome(
        Kind.HOLD, "429 with a delay", 0.25
    )
    assert classify_exception(_status_error(503, {DROPPED: "rejected-ttl-expired"})).kind is Kind.GENTLE_CUT
    assert classify_exception(_status_error(502, {})).kind is Kind.OUTAGE


def test_durations_and_reset_times() -> None:
    assert parse_duration("12ms") == 0.012
    assert parse_duration("6m0s") == 360.0
    assert parse_duration("1h2m3.5s") == 3723.5
    assert parse_duration("0.5") == 0.5
    assert parse_duration("1.5s") == 1.5
    for bad in ("", "soon", "5x", "s", "-1s", "1s soon", "nan"):
        assert parse_duration(bad) is None, bad
    assert parse_reset_time("2026-12-01T12:01:00Z", NOW) == 60.0
    assert parse_reset_time("2026-12-01T11:00:00Z", NOW) == 0.0
    assert parse_reset_time("2026-12-01T12:00:10", NOW) == 10.0  # no zone: UTC
    assert parse_reset_time("tomorrow", NOW) is None
    assert hold_from_headers({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "1s"}) == 1.0
    assert hold_from_headers({"x-ratelimit-limit-requests": "100"}) is None
    assert hold_from_headers({}) is None


def test_flight_rule_exact() -> None:
    flights = CutOncePerFlight()
    assert flights.admit(sent_at=0.0, now=5.0)  # the first refusal cuts
    assert not flights.admit(sent_at=1.0, now=5.5)  # sent before the cut at 5.0: the same overload
    assert not flights.admit(sent_at=4.9, now=6.0)
    assert flights.admit(sent_at=5.0, now=7.0)  # sent at the cut: sized by the new target
    assert (flights.cuts, flights.ignored, flights.last_cut_at) == (2, 2, 7.0)


calls = st.lists(st.tuples(st.floats(0, 100), st.floats(0, 10)), min_size=1, max_size=60)


@given(calls)
def test_a_cut_only_answers_a_call_sent_after_the_previous_cut(events: list[tuple[float, float]]) -> None:
    """Refusals arrive in time order; each call's refusal comes ``latency`` after it was sent. Cut at most once per
    flight: every cut's call was sent at or after the previous cut, every ignored one before it, and a batch of
    calls all sent before the first cut produces exactly one cut."""
    flights = CutOncePerFlight()
    refusals = sorted((sent + latency, sent) for sent, latency in events)
    cuts: list[float] = []
    for now, sent in refusals:
        last = cuts[-1] if cuts else -math.inf
        if flights.admit(sent, now):
            assert sent >= last
            cuts.append(now)
        else:
            assert sent < last
    assert flights.cuts == len(cuts) >= 1
    assert flights.cuts + flights.ignored == len(events)


@given(st.lists(st.floats(0, 10), min_size=1, max_size=60), st.floats(10.5, 20), st.lists(st.floats(0, 5), max_size=60))
def test_one_flight_cuts_once(sent: list[float], first_refusal: float, spread: list[float]) -> None:
    """Calls all sent before the first refusal came back are one flight: however many are refused, one cut."""
    flights = CutOncePerFlight()
    times = sorted(first_refusal + (spread[i] if i < len(spread) else 0.0) for i in range(len(sent)))
    admitted = [flights.admit(s, now) for s, now in zip(sent, times, strict=True)]
    assert admitted.count(True) == 1 and admitted[0]
