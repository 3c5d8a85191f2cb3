"""The fan-out gate: one resizable limiter per model behind map_concurrent and map_concurrent_sync."""

from model_concurrency.gate.limiter import LimiterCore

__all__ = ["LimiterCore"]
