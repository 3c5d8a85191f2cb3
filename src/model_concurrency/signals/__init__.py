"""Signal sources: read engine state, never decide."""

from model_concurrency.signals.scrape import ScrapeError, ScrapeLimits, metrics_url_from_base
from model_concurrency.signals.sglang import parse_metrics_page, parse_sglang_metrics
from model_concurrency.signals.sglang_loads import LoadsError, parse_loads
from model_concurrency.signals.source import SignalSource, VllmMetricsSource
from model_concurrency.signals.vllm import MetricsError, parse_vllm_metrics

__all__ = [
    "LoadsError",
    "MetricsError",
    "ScrapeError",
    "ScrapeLimits",
    "SignalSource",
    "VllmMetricsSource",
    "metrics_url_from_base",
    "parse_loads",
    "parse_metrics_page",
    "parse_sglang_metrics",
    "parse_vllm_metrics",
]
