"""``retries=``: the caller's choice to send an idempotent call again after a rejection or an outage.

Retrying is never the gate's default: a completion with side effects, or one billed per attempt, must not be sent
twice behind the caller's back. For idempotent calls (embeddings, a cached lookup) ``map_concurrent(...,
retries=3)`` / ``map_concurrent_sync(..., retries=3)`` re-run an item whose call was refused or could not reach
the model (the classification table, gate/outcome.py: cut, gentle cut, hold, no information, outage; never an
*error* such as a 400 or the caller's own bug, and never a rejection that says ``x-should-retry: false``).

Between attempts the item gives its slot back and waits ``base_s × 2^attempt`` (× a random 0.5–1, so refused calls
do not return together; capped at ``max_s``), and at least the delay the rejection named (``Retry-After``,
``retry-after-ms``, a bucket reset). It then queues for a slot like any new call, so the hold and the outage
rule apply to it: during an outage a retried item waits with the others, one probe at a time. A failed probe (a
call sent while the model was already unreachable) costs the item no attempt: ``max_outage_s`` bounds those.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from model_concurrency.gate.outcome import Kind, classify_exception

__all__ = ["RetryPolicy", "retry_policy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times an item may be sent again, and the backoff between attempts."""

    retries: int
    base_s: float = 0.25
    max_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        count = self.retries
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"retries must be an int >= 0 (attempts after the first; idempotent calls), got {count!r}")

    def delay(self, exc: BaseException | None, attempt: int) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` after ``exc`` (attempt 0 is the first call), or None:
        the failure stands."""
        if exc is None or attempt >= self.retries or not isinstance(exc, Exception):
            return None
        outcome = classify_exception(exc)
        if outcome.kind is Kind.ERROR or not outcome.retryable:
            return None
        backoff: float = min(self.max_s, self.base_s * 2.0**attempt) * (0.5 + 0.5 * self.rng.random())
        return max(backoff, outcome.hold_s or 0.0)


def retry_policy(retries: int | RetryPolicy) -> RetryPolicy | None:
    """The policy for ``retries=`` (None for 0): a count, or a :class:`RetryPolicy` of the caller's own (its
    backoff, or a seeded ``rng`` so a run on virtual time repeats exactly); ``ValueError`` for anything else."""
    if isinstance(retries, RetryPolicy):  # checked when it was built
        return retries if retries.retries else None
    policy = RetryPolicy(retries)  # the count is checked there
    return policy if retries else None
