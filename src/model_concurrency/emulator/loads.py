"""SGLang's ``GET /v1/loads`` over the engine model: what an SGLang server (0.5.8 on) answers there.

One object per scheduler (``dp_rank``), from the engines' own state at the moment of the request: what the page's
``sglang:`` gauges read, plus the caps SGLang states only here (``max_running_requests``, and the KV pool again as
``max_total_num_tokens``). ``?format=prometheus`` gives the same figures as ``sglang_<key>{dp_rank=...}`` gauges.
A vLLM server has no such route: the emulator in a vLLM flavour answers it 404, as vLLM's router does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from model_concurrency.engine.engine import Engine

__all__ = ["LOADS_VERSION", "loads_prometheus", "loads_report"]

# The SGLang release whose answer this imitates (the first with the endpoint is 0.5.8).
LOADS_VERSION = "0.5.9"
_GAUGES = (
    "num_running_reqs",
    "num_waiting_reqs",
    "num_used_tokens",
    "max_total_num_tokens",
    "max_running_requests",
    "token_usage",
)


def _rank(rank: int, engine: Engine) -> dict[str, Any]:
    running, waiting, kv, _, tokens, *_ = engine.signals()
    return {
        "dp_rank": rank,
        "num_running_reqs": int(running),
        "num_waiting_reqs": int(waiting),
        "num_used_tokens": round(kv * tokens),
        "max_total_num_tokens": int(tokens),
        "max_running_requests": engine.max_num_seqs,
        "token_usage": kv,
    }


def loads_report(engines: Iterable[Engine]) -> dict[str, Any]:
    """The JSON body: the live engines, one ``dp_rank`` each (a downed engine's scheduler is gone)."""
    live = [e for e in engines if e.up]
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": LOADS_VERSION,
        "accelerator": "cuda",
        "num_accelerators": len(live),
        "loads": [_rank(e.index, e) for e in live],
    }


class _Loads:
    def __init__(self, report: dict[str, Any]) -> None:
        self._report = report

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for key in _GAUGES:
            family = GaugeMetricFamily(f"sglang_{key}", f"SGLang load report: {key}.", labels=["dp_rank"])
            for rank in self._report["loads"]:
                family.add_metric([str(rank["dp_rank"])], float(rank[key]))
            yield family


def loads_prometheus(report: dict[str, Any]) -> str:
    """The report as Prometheus text (``?format=prometheus``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Loads(report))
    return generate_latest(registry).decode("utf-8")
