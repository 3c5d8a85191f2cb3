"""The emulator's requests/tokens-per-minute buckets: :mod:`model_concurrency.engine.ratelimit`, shared with the lab.

They live beside the engine model so the lab (the ``[sim]`` extra, no ASGI stack) refuses the same calls for the
same reasons as the emulator.
"""

from __future__ import annotations

from model_concurrency.engine.ratelimit import RateLimited, RateLimiter, TokenBucket

__all__ = ["RateLimited", "RateLimiter", "TokenBucket"]
