"""How the emulator refuses a call when its queue is full: one style per engine, gateway or hosted API.

``--max-num-queued-reqs N`` (``EmulatorConfig.max_num_queued_reqs``) caps the requests accepted and not yet
running (vLLM's admission control, PR #49445: beyond it a 503, "queue full", not "engine down"). The refusal's
shape follows ``--reject-style`` so every row of the client's classification table (gate/outcome.py) can be driven
through real HTTP:

=================  ======  =====================================================================================
style              status  headers
=================  ======  =====================================================================================
``vllm``           503     none (the body says the queue is full)
``sglang``         503     none
``llm-d``          429     ``x-llm-d-request-dropped-reason: rejected-saturated``
``llm-d-ttl``      503     ``x-llm-d-request-dropped-reason: rejected-ttl-expired``
``llm-d-evicted``  429     ``x-llm-d-request-dropped-reason: evicted-preempted``
``dynamo``         529     none
``openai``         429     ``x-ratelimit-{limit,remaining,reset}-requests`` (remaining 0, reset a duration),
                           ``retry-after-ms``, ``x-should-retry: true``
``anthropic``      429     ``retry-after`` (seconds), ``anthropic-ratelimit-requests-{limit,remaining,reset}``
                           (remaining 0, reset an RFC 3339 time)
=================  ======  =====================================================================================

The hosted styles name ``retry_after_s`` (wall seconds) as their delay.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from model_concurrency.emulator.openai_shapes import ApiError

__all__ = ["REJECT_STYLES", "check_style", "queue_full"]

REJECT_STYLES = ("vllm", "sglang", "llm-d", "llm-d-ttl", "llm-d-evicted", "dynamo", "openai", "anthropic")
_DROPPED = "x-llm-d-request-dropped-reason"


def check_style(style: str) -> str:
    if style not in REJECT_STYLES:
        raise ValueError(f"reject_style must be one of {', '.join(REJECT_STYLES)}; got {style!r}")
    return style


def queue_full(style: str, limit: int, retry_after_s: float, now: datetime | None = None) -> ApiError:
    """The refusal of a call that found ``limit`` requests already queued, in ``style``."""
    message = f"the request queue is full ({limit} requests waiting; --max-num-queued-reqs)"
    if style in ("vllm", "sglang"):
        return ApiError(503, message, kind="ServiceUnavailableError")
    if style == "llm-d":
        headers = {_DROPPED: "rejected-saturated"}
        return ApiError(429, "rejected: pool saturated", kind="RateLimitError", headers=headers)
    if style == "llm-d-ttl":
        headers = {_DROPPED: "rejected-ttl-expired"}
        return ApiError(503, "rejected: queue TTL expired", kind="ServiceUnavailableError", headers=headers)
    if style == "llm-d-evicted":
        return ApiError(429, "evicted", kind="RateLimitError", headers={_DROPPED: "evicted-preempted"})
    if style == "dynamo":
        return ApiError(529, "every worker is busy", kind="ServiceUnavailableError")
    ms = max(1, math.ceil(retry_after_s * 1000))
    if style == "openai":
        headers = {
            "x-ratelimit-limit-requests": str(limit),
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": f"{ms}ms",
            "retry-after-ms": str(ms),
            "x-should-retry": "true",
        }
        return ApiError(429, "Rate limit reached for requests", kind="RateLimitError", headers=headers)
    check_style(style)  # anthropic
    reset = (now or datetime.now(UTC)) + timedelta(milliseconds=ms)
    headers = {
        "retry-after": str(max(1, math.ceil(retry_after_s))),
        "anthropic-ratelimit-requests-limit": str(limit),
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": reset.isoformat().replace("+00:00", "Z"),
    }
    return ApiError(429, "number of requests has exceeded your rate limit", kind="RateLimitError", headers=headers)
