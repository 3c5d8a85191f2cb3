"""Requests-per-minute and tokens-per-minute limits, as hosted OpenAI-compatible APIs enforce them.

Why: a client-side policy must be tested against an endpoint that answers 429 with ``Retry-After`` instead of
queueing, and the emulator is the only endpoint the tests have; the lab puts the same buckets in front of its
simulated fleet (:mod:`model_concurrency.lab.ratelimit`), so both refuse the same calls. Two token buckets
(requests, tokens), each holding at most one minute's worth and refilled continuously, checked together: a call is
admitted only when both can pay, and then both pay; otherwise nothing is taken and the caller learns how long
until both could pay.

Time is whatever clock the caller passes (the emulator and the lab pass simulated seconds, so a limit is "per
simulated minute", consistent with every other figure they report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["RateLimited", "RateLimiter", "TokenBucket"]


@dataclass(slots=True)
class TokenBucket:
    """``per_minute`` units per minute, bursting to one minute's worth. Starts full."""

    per_minute: float
    level: float = field(init=False)
    stamp: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not (self.per_minute > 0 and math.isfinite(self.per_minute)):
            raise ValueError(f"a per-minute limit must be a positive number, got {self.per_minute!r}")
        self.level = self.per_minute

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.per_minute, self.level + (now - self.stamp) * self.per_minute / 60.0)
            self.stamp = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds from ``now`` until ``amount`` could be taken (0 if it can be taken now)."""
        self.refill(now)
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.per_minute


class RateLimited(Exception):
    """Refused: retry after ``retry_after_s`` (in the limiter's clock); ``which`` is "requests" or "tokens"."""

    def __init__(self, retry_after_s: float, which: str) -> None:
        super().__init__(f"rate limit on {which}: retry after {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s
        self.which = which


class RateLimiter:
    """Both buckets; either may be absent (``None`` = unlimited)."""

    def __init__(self, requests_per_minute: float | None = None, tokens_per_minute: float | None = None) -> None:
        self.requests = TokenBucket(requests_per_minute) if requests_per_minute is not None else None
        self.tokens = TokenBucket(tokens_per_minute) if tokens_per_minute is not None else None

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def admit(self, tokens: int, now: float) -> None:
        """Take one request and ``tokens`` tokens, or raise :class:`RateLimited` having taken nothing.

        A call larger than the whole token limit could never pass: ``ValueError`` (the caller answers 400, not a
        429 whose ``Retry-After`` would be a lie).
        """
        if self.tokens is not None and tokens > self.tokens.per_minute:
            limit = self.tokens.per_minute
            raise ValueError(f"the request needs {tokens} tokens, more than the limit of {limit:g} tokens per minute")
        waits = []
        if self.requests is not None:
            waits.append((self.requests.wait_for(1, now), "requests"))
        if self.tokens is not None:
            waits.append((self.tokens.wait_for(tokens, now), "tokens"))
        wait, which = max(waits, default=(0.0, ""))
        if wait > 0:
            raise RateLimited(wait, which)
        if self.requests is not None:
            self.requests.level -= 1
        if self.tokens is not None:
            self.tokens.level -= tokens

    def remaining(self, now: float) -> dict[str, int]:
        """What is left now, for the ``x-ratelimit-remaining-*`` headers."""
        out: dict[str, int] = {}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                bucket.refill(now)
                out[name] = int(bucket.level)
                out[f"limit-{name}"] = int(bucket.per_minute)
        return out
