"""The engines' limits a policy sees: what the operator stated, merged with what the engines state themselves.

Two kinds of figure meet here. A page (or SGLang's ``/v1/loads`` beside it) states some limits as totals over the
engines it sums (:class:`~model_concurrency.observation.EngineLimits`). No vLLM release puts ``--max-num-seqs`` or
``--max-num-batched-tokens`` on ``/metrics``, so an operator may state them in the model's spec, per engine
(``max_num_seqs``, ``max_num_batched_tokens``, with ``parallel_instances`` the engines behind the URL).

The rule, in one place (:func:`merge_limits`, pure): a stated figure wins over a page's for the same field
(``max_num_seqs`` times the engine count; the step budget stays per engine); a page's figure fills what nobody
stated. A stated ``max_num_seqs`` that the page contradicts (more requests running than the stated total allows)
is wrong about this deployment: :class:`StatedLimitsRule` warns once and ignores it for the rest of the runtime's
life, so one stale config line cannot keep feeding a policy a ceiling the engines already passed.

It sits with the signal sources because a stated limit is one more reading of the engine (the operator's), merged
before any policy sees it; the runtime applies the rule at each poll, the sources merge their own page readings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from model_concurrency.observation import EngineLimits

__all__ = ["STATED", "StatedLimits", "StatedLimitsRule", "merge_limits", "merge_page_limits"]

log = logging.getLogger("model_concurrency")

STATED = "stated"


class _Spec(Protocol):
    """The parts of a :class:`~model_concurrency.config.ModelSpec` the stated limits come from."""

    @property
    def max_num_seqs(self) -> int | None: ...

    @property
    def max_num_batched_tokens(self) -> int | None: ...

    @property
    def parallel_instances(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class StatedLimits:
    """The limits each engine was started with, as the operator states them, and how many engines there are."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    engines: int = 1

    @classmethod
    def from_spec(cls, spec: _Spec | None) -> StatedLimits | None:
        """The spec's stated limits; None when it states none. ``parallel_instances`` 0 counts as one engine: a
        URL with a stated limit has at least the engine that answers it."""
        if spec is None or (spec.max_num_seqs is None and spec.max_num_batched_tokens is None):
            return None
        return cls(
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            engines=max(1, spec.parallel_instances),
        )

    @property
    def total_seqs(self) -> int | None:
        """The sequence slots of all the engines together (what ``running`` is compared with)."""
        return None if self.max_num_seqs is None else self.max_num_seqs * self.engines


def merge_page_limits(first: EngineLimits | None, second: EngineLimits | None) -> EngineLimits | None:
    """Two page-side readings of the limits as one: ``second``'s figures win where both know a field (a request
    beside the page, such as SGLang's ``/v1/loads``, states the page's pool again, from the scheduler itself)."""
    if first is None or second is None:
        return second if first is None else first
    fields = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_tokens", "kv_cache_max_concurrency")
    values = {name: getattr(second, name) if getattr(second, name) is not None else getattr(first, name)
              for name in fields}  # fmt: skip
    source = {name: (second.source if getattr(second, name) is not None else first.source).get(name, "")
              for name in fields if values[name] is not None}  # fmt: skip
    return EngineLimits(**values, source=source)


def merge_limits(
    stated: StatedLimits | None, page: EngineLimits | None, running: float | None, *, seqs_ignored: bool = False
) -> tuple[EngineLimits | None, bool]:
    """The limits a policy sees, and whether the stated ``max_num_seqs`` is ignored from now on.

    ``running`` is the page's running requests (None on a failed poll: nothing contradicts anything then). A stated
    total below ``running`` is contradicted, and so is one already ``seqs_ignored``: the page's figure (if any)
    stands in for it. None when nothing at all is known.
    """
    total = stated.total_seqs if stated is not None else None
    if total is not None and running is not None and running > total:
        seqs_ignored = True
    values = {
        "max_num_seqs": page.max_num_seqs if page is not None else None,
        "max_num_batched_tokens": page.max_num_batched_tokens if page is not None else None,
        "kv_cache_tokens": page.kv_cache_tokens if page is not None else None,
        "kv_cache_max_concurrency": page.kv_cache_max_concurrency if page is not None else None,
    }
    source = {
        name: page.source.get(name, "") for name, value in values.items() if page is not None and value is not None
    }
    if total is not None and not seqs_ignored:
        values["max_num_seqs"], source["max_num_seqs"] = total, STATED
    if stated is not None and stated.max_num_batched_tokens is not None:
        values["max_num_batched_tokens"], source["max_num_batched_tokens"] = stated.max_num_batched_tokens, STATED
    if all(value is None for value in values.values()):
        return None, seqs_ignored
    return EngineLimits(**values, source=source), seqs_ignored  # type: ignore[arg-type]


class StatedLimitsRule:
    """One runtime's stated limits and whether the page has contradicted its ``max_num_seqs`` (warned once)."""

    __slots__ = ("model", "quiet", "seqs_ignored", "stated")

    def __init__(self, model: str, stated: StatedLimits | None, *, quiet: bool = False) -> None:
        self.model = model
        self.stated = stated
        self.quiet = quiet  # the lab's thousands of clients log nothing (the rule still applies)
        self.seqs_ignored = False

    def merge(self, page: EngineLimits | None, running: float | None) -> EngineLimits | None:
        """The limits for this poll (:func:`merge_limits`); the first contradiction is logged, once."""
        before = self.seqs_ignored
        limits, self.seqs_ignored = merge_limits(self.stated, page, running, seqs_ignored=before)
        if self.seqs_ignored and not before and not self.quiet and self.stated is not None:
            log.warning(
                "model %s: the stated max_num_seqs %s per engine (%s in all over %d engine(s)) is below the %g "
                "requests the engine runs; ignoring the stated value from now on",
                self.model,
                self.stated.max_num_seqs,
                self.stated.total_seqs,
                self.stated.engines,
                running,
            )
        return limits
