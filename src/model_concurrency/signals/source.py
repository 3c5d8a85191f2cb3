"""Signal sources: where an :class:`EngineSnapshot` comes from.

A source reads and never decides. The controller asks it for a snapshot when a poll is due and treats any
exception as a failed poll. Each source offers a blocking ``read`` for threads and an ``aread`` for event loops,
so an async fan-out never blocks its loop on a scrape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from model_concurrency.observation import EngineSnapshot
from model_concurrency.signals.interval import IntervalMeter
from model_concurrency.signals.scrape import ScrapeLimits, afetch_text, fetch_text, origin_of
from model_concurrency.signals.sglang import read_metrics_page
from model_concurrency.signals.sglang_loads import LoadsReader

__all__ = ["ClientOnlySource", "SignalSource", "VllmMetricsSource"]


@runtime_checkable
class SignalSource(Protocol):
    """Produces one model's engine snapshot; raises on failure (any exception is a failed poll)."""

    @property
    def description(self) -> str: ...

    def read(self) -> EngineSnapshot: ...

    async def aread(self) -> EngineSnapshot: ...


@dataclass(slots=True)
class VllmMetricsSource:
    """Scrapes a ``/metrics`` page and parses one served model out of it: a vLLM or an SGLang page, told apart by
    the model's own series on each read (:func:`~model_concurrency.signals.sglang.parse_metrics_page`).

    Beside an SGLang page it asks ``/v1/loads`` once per read, for the limits SGLang states only there
    (:mod:`~model_concurrency.signals.sglang_loads`; a 404 is remembered and never asked again)."""

    metrics_url: str
    served_model_name: str
    api_key: str | None = field(default=None, repr=False)
    token_origin: tuple[str, str, int | None] | None = None
    limits: ScrapeLimits = field(default_factory=ScrapeLimits)
    # The previous reading's totals: each snapshot read carries the interval since it (signals/interval.py).
    meter: IntervalMeter = field(default_factory=IntervalMeter, repr=False, compare=False)
    loads: LoadsReader | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.loads is None:
            self.loads = LoadsReader(self.metrics_url)

    @classmethod
    def for_model(
        cls,
        metrics_url: str,
        served_model_name: str,
        *,
        base_url: str | None,
        api_key: str | None,
        limits: ScrapeLimits,
    ) -> VllmMetricsSource:
        return cls(
            metrics_url=metrics_url,
            served_model_name=served_model_name,
            api_key=api_key,
            token_origin=origin_of(base_url) if base_url else None,
            limits=limits,
        )

    @property
    def description(self) -> str:
        return self.metrics_url

    def read(self) -> EngineSnapshot:
        text = fetch_text(self.metrics_url, api_key=self.api_key, token_origin=self.token_origin, limits=self.limits)
        snapshot, engine = read_metrics_page(text, self.served_model_name)
        if self.loads is not None and self.loads.wanted(engine):
            snapshot = self.loads.read(
                snapshot, api_key=self.api_key, token_origin=self.token_origin, limits=self.limits
            )
        return self.meter.advance(snapshot)

    async def aread(self) -> EngineSnapshot:
        text = await afetch_text(
            self.metrics_url, api_key=self.api_key, token_origin=self.token_origin, limits=self.limits
        )
        snapshot, engine = read_metrics_page(text, self.served_model_name)
        if self.loads is not None and self.loads.wanted(engine):
            snapshot = await self.loads.aread(
                snapshot, api_key=self.api_key, token_origin=self.token_origin, limits=self.limits
            )
        return self.meter.advance(snapshot)


@dataclass(frozen=True, slots=True)
class ClientOnlySource:
    """No engine signals at all: for endpoints without ``/metrics`` (hosted APIs).

    Every poll "succeeds" with an empty snapshot, so the controller still calls its policy once per poll with the
    client's own latencies, errors and 429/503 counts. Only policies that declare
    ``uses_engine_signals = False`` (``gradient``) are given this source.
    """

    @property
    def description(self) -> str:
        return "client-side signals only (no /metrics)"

    def read(self) -> EngineSnapshot:
        return EngineSnapshot()

    async def aread(self) -> EngineSnapshot:
        return EngineSnapshot()
