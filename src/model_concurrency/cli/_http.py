"""The CLI's HTTP client: the public :class:`~model_concurrency.integrations.client.ShardedAsyncClient`.

``ShardedClient`` here is an alias kept for callers of this private module (``benchmarks/mixed.py``): an async
client, unlike the public blocking :class:`~model_concurrency.integrations.client.ShardedClient`, with the CLI's
``connections`` and ``timeout`` defaults.
"""

from __future__ import annotations

from typing import Any

from model_concurrency.integrations.client import ShardedAsyncClient

__all__ = ["ShardedClient"]


def ShardedClient(*, connections: int = 512, timeout: float = 120.0, **kwargs: Any) -> ShardedAsyncClient:
    """The sharded client with the CLI's defaults (512 connections, 120 s timeout)."""
    return ShardedAsyncClient(connections=connections, timeout=timeout, **kwargs)
