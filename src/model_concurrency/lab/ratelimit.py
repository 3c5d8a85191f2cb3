"""A hosted endpoint's rate limit in front of the simulated fleet: requests and tokens per minute, 429 + Retry-After.

Why the emulator's own buckets: the lab and the emulator must refuse the same calls for the same reasons, so this
stage is :class:`~model_concurrency.engine.ratelimit.RateLimiter` (pure, on the clock it is given) driven by
SimPy time. A call is charged its prompt plus its output tokens (what OpenAI-style limits count: the prompt and
``max_tokens``). A refused call costs the client a round trip (``refusal_latency_s``) and comes back with the exact
delay until both buckets could pay, as the emulator's ``retry-after-ms`` header says.

Background tenants bypass it: a rate limit belongs to an API key, and theirs is not the fan-out's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import simpy

from model_concurrency.engine.ratelimit import RateLimited, RateLimiter
from model_concurrency.engine.request import Request
from model_concurrency.observation import EngineSnapshot

__all__ = ["RateLimitedFront", "Refused", "Target"]

Finished = Callable[[Request], None]
# Called with the refused request and the Retry-After (simulated seconds) the endpoint answered.
Refused = Callable[[Request, float], None]


class Target(Protocol):
    """What the front forwards admitted calls to (a fleet, a server)."""

    def submit_callback(self, request: Request, on_finish: Finished) -> None: ...

    def snapshot(self) -> EngineSnapshot: ...


class RateLimitedFront:
    """The fleet behind a token bucket; ``submit_limited`` answers a refusal with a Retry-After after one RTT."""

    def __init__(
        self,
        env: simpy.Environment,
        inner: Target,
        *,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        refusal_latency_s: float = 0.01,
    ) -> None:
        self.env = env
        self.inner = inner
        self.limiter = RateLimiter(requests_per_minute, tokens_per_minute)
        self.refusal_latency_s = refusal_latency_s
        self.admitted = 0
        self.refused = 0

    def snapshot(self) -> EngineSnapshot:
        return self.inner.snapshot()

    def submit_callback(self, request: Request, on_finish: Finished) -> None:
        """Unlimited path (a caller that cannot hear a 429): forwards as is."""
        self.inner.submit_callback(request, on_finish)

    def submit_limited(self, request: Request, on_finish: Finished, on_refused: Refused) -> None:
        try:
            self.limiter.admit(request.prompt_tokens + request.output_tokens, self.env.now)
        except RateLimited as limited:
            self.refused += 1
            delay = limited.retry_after_s
            self.env.timeout(self.refusal_latency_s).callbacks.append(lambda _: on_refused(request, delay))
            return
        self.admitted += 1
        self.inner.submit_callback(request, on_finish)
