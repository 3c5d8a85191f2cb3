"""Signal sources: read engine state, never decide."""

from model_concurrency.signals.scrape import ScrapeError, ScrapeLimits, metrics_url_from_base
from model_concurrency.signals.source import SignalSource, VllmMetricsSource
from model_concurrency.signals.vllm import MetricsError, parse_vllm_metrics

__all__ = [
    "MetricsError",
    "ScrapeError",
    "ScrapeLimits",
    "SignalSource",
    "VllmMetricsSource",
    "metrics_url_from_base",
    "parse_vllm_metrics",
]
