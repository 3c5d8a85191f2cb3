"""SGLang's ``GET /v1/loads``: the limits its schedulers state, read beside the ``/metrics`` page.

SGLang's ``/metrics`` has the KV pool (``sglang:max_total_num_tokens``) but no gauge for ``max_running_requests``,
the sequence cap a policy compares ``running`` with. From 0.5.8 the server answers ``GET /v1/loads`` with
``{"timestamp", "version", "accelerator", "num_accelerators", "loads": [...]}``, one object per ``dp_rank``
(``num_running_reqs``, ``num_waiting_reqs``, ``num_used_tokens``, ``max_total_num_tokens``,
``max_running_requests``, ``token_usage``...). Ranks are separate schedulers, so their caps add up, as their
``running`` gauges do on the page.

A source asks it at most once per poll, only of a page it read as SGLang's, and never again after a 404 (an older
server): :class:`LoadsReader` remembers that per source. The body is read under the scrape's own caps (timeouts,
a deadline, a byte cap smaller than a page's); JSON that is not an object with a ``loads`` array, ``NaN``, negative
or absurd figures are a :class:`LoadsError` with one line of reason. Any failure here leaves the limits unknown
for that poll and never fails it: the page's own reading stands.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from model_concurrency.observation import EngineLimits, EngineSnapshot
from model_concurrency.signals.limits import merge_page_limits
from model_concurrency.signals.scrape import HttpStatusError, ScrapeError, ScrapeLimits, afetch_text, fetch_text
from model_concurrency.signals.sglang import SGLANG
from model_concurrency.signals.vllm import MAX_PLAUSIBLE

__all__ = ["LOADS_PATH", "LOADS_SOURCE", "LoadsError", "LoadsReader", "loads_url", "parse_loads"]

log = logging.getLogger("model_concurrency")

LOADS_PATH = "/v1/loads"
LOADS_SOURCE = "sglang /v1/loads"
# A few ranks' worth of small objects; a body past this is not a load report.
MAX_LOADS_BYTES = 256 * 1024
# Above this a KV pool is a broken report, not a GPU (ten billion tokens).
_MAX_TOKENS = 1e10
_CAPS = (
    ("max_running_requests", "max_num_seqs", MAX_PLAUSIBLE),
    ("max_total_num_tokens", "kv_cache_tokens", _MAX_TOKENS),
)


class LoadsError(ValueError):
    """The ``/v1/loads`` answer cannot be trusted; the limits it would state stay unknown."""


def loads_url(metrics_url: str) -> str:
    """``http://h:30000/metrics`` → ``http://h:30000/v1/loads``: SGLang serves both at the root of one origin."""
    parts = urlsplit(metrics_url)
    return urlunsplit((parts.scheme, parts.netloc, LOADS_PATH, "", ""))


def _refuse_constant(name: str) -> Any:
    raise LoadsError(f"/v1/loads: {name} in the JSON")


def _figure(entry: dict[str, Any], key: str, upper: float) -> int | None:
    """One rank's figure: a whole number in ``[0, upper]`` (None when the rank leaves it out, or states 0)."""
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LoadsError(f"/v1/loads: {key} is {value!r}, not a number")
    if not math.isfinite(value) or value < 0 or value > upper or value != int(value):
        raise LoadsError(f"/v1/loads: implausible {key} {value!r}")
    return int(value) or None


def parse_loads(text: str) -> EngineLimits | None:
    """The limits the ranks state, summed over ``dp_rank``; None when no rank states any. :class:`LoadsError` if
    the body is not a load report."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except LoadsError:
        raise
    except (ValueError, RecursionError) as exc:
        raise LoadsError(f"/v1/loads: not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("loads"), list):
        raise LoadsError("/v1/loads: not an object with a 'loads' array")
    ranks = data["loads"]
    if not all(isinstance(entry, dict) for entry in ranks):
        raise LoadsError("/v1/loads: a 'loads' entry is not an object")
    totals: dict[str, int] = {}
    for key, field, upper in _CAPS:
        figures = [_figure(entry, key, upper) for entry in ranks]
        if figures and all(figure is not None for figure in figures):  # a rank left out: the sum would be short
            totals[field] = sum(figure for figure in figures if figure is not None)
    if not totals:
        return None
    return EngineLimits(**totals, source={field: LOADS_SOURCE for field in totals})


class LoadsReader:
    """One source's ``/v1/loads``: where it is, whether the server has it, and the last reason it failed."""

    __slots__ = ("_warned", "last_error", "missing", "url")

    def __init__(self, metrics_url: str) -> None:
        self.url = loads_url(metrics_url)
        self.missing = False  # the server answered 404: an SGLang older than the endpoint, never asked again
        self.last_error: str | None = None
        self._warned = False

    def wanted(self, engine: str) -> bool:
        """Whether to ask now: the page was SGLang's, and the server has not said it lacks the endpoint."""
        return engine == SGLANG and not self.missing

    @staticmethod
    def _limits(limits: ScrapeLimits) -> ScrapeLimits:
        return ScrapeLimits(timeout_s=limits.timeout_s, deadline_s=limits.deadline_s, max_bytes=MAX_LOADS_BYTES)

    def read(
        self,
        snapshot: EngineSnapshot,
        *,
        api_key: str | None,
        token_origin: tuple[str, str, int | None] | None,
        limits: ScrapeLimits,
    ) -> EngineSnapshot:
        """``snapshot`` with the limits ``/v1/loads`` states added (unchanged when it cannot be read)."""
        try:
            text = fetch_text(
                self.url,
                api_key=api_key,
                token_origin=token_origin,
                limits=self._limits(limits),
                accept="application/json",
            )
        except ScrapeError as exc:
            return self._failed(snapshot, exc)
        return self._absorb(snapshot, text)

    async def aread(
        self,
        snapshot: EngineSnapshot,
        *,
        api_key: str | None,
        token_origin: tuple[str, str, int | None] | None,
        limits: ScrapeLimits,
    ) -> EngineSnapshot:
        """:meth:`read` on the running event loop."""
        try:
            text = await afetch_text(
                self.url,
                api_key=api_key,
                token_origin=token_origin,
                limits=self._limits(limits),
                accept="application/json",
            )
        except ScrapeError as exc:
            return self._failed(snapshot, exc)
        return self._absorb(snapshot, text)

    def _absorb(self, snapshot: EngineSnapshot, text: str) -> EngineSnapshot:
        try:
            stated = parse_loads(text)
        except LoadsError as exc:
            return self._failed(snapshot, exc)
        self.last_error = None
        return replace(snapshot, limits=merge_page_limits(snapshot.limits, stated))

    def _failed(self, snapshot: EngineSnapshot, exc: Exception) -> EngineSnapshot:
        if isinstance(exc, HttpStatusError) and exc.status == 404:
            self.missing = True
            log.info("%s answered 404 (an SGLang older than 0.5.8): its limits are not asked again", self.url)
            return snapshot
        self.last_error = f"{type(exc).__name__}: {exc}"
        # One warning per source: a server whose endpoint stays broken would otherwise log at every poll.
        log.log(
            logging.DEBUG if self._warned else logging.WARNING,
            "%s unreadable (%s); the engine's limits stay unknown",
            self.url,
            self.last_error,
        )
        self._warned = True
        return snapshot
