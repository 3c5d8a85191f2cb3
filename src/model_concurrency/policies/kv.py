"""What the KV cache says about an engine's room: the figure a policy may grow toward before the engine has been
driven anywhere.

vLLM's ``vllm:cache_config_info`` gives the block count ``N`` (summed over engines); KV usage ``u`` over ``running``
gives the blocks a sequence holds, ``b = u × N / running``; the cache holds ``N / b`` such sequences.
Usage is the most loaded engine's while ``running`` is summed, so on several engines ``b`` comes out high and the
room low: the safe side. A pooling (embedding) sequence holds one block, and the bound then says nothing of its
sequence limit; callers on such engines do not jump toward it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model_concurrency.observation import Observation
from model_concurrency.policies._common import own_share

__all__ = ["KvEstimate", "kv_estimate"]


@dataclass(frozen=True, slots=True)
class KvEstimate:
    """One poll's reading: blocks a sequence holds, sequences that fill the cache to ``kv_high``, and ``bound``, the
    most our in-flight may grow to (ours plus our share of the sequences left), so that N clients starting together
    add up to the engine's room, not N times it."""

    blocks_per_sequence: float
    sequences: float
    bound: float


def kv_estimate(obs: Observation, kv_high: float = 1.0) -> KvEstimate | None:
    """The estimate, or None without a block count, a usage above zero, sequences running and calls of ours.
    ``kv_high``: the share of the cache counted as room (the whole of it by default; vLLM admits a sequence while
    its blocks fit)."""
    blocks, kv = obs.kv_num_blocks, obs.kv_cache_usage
    if not blocks or blocks <= 0 or kv is None or not 0 < kv <= 1 or not 0 < obs.running < math.inf:
        return None
    if obs.inflight <= 0:
        return None
    # A running sequence holds at least one block: less means gauges read at different instants.
    per_sequence = max(1.0, kv * blocks / obs.running)
    sequences = kv_high * blocks / per_sequence
    bound = obs.inflight + own_share(obs) * max(0.0, sequences - obs.running)
    return KvEstimate(blocks_per_sequence=per_sequence, sequences=sequences, bound=bound)
