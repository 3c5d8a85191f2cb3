"""Which queues are walls: the two judgments ``adaptive`` makes before a queue may cut its target.

A queue for capacity means a wall only when the engine has run out of sequence slots or KV blocks. vLLM also holds
requests for a step's prefill token budget (``--max-num-batched-tokens``) at any load, and counts them as waiting
for capacity too, so the gauge alone cannot tell the two apart; these read what else the poll shows. Pure
functions of one Observation, beside the policy that calls them.
"""

from __future__ import annotations

from model_concurrency.observation import Observation

__all__ = ["PREFILL_WAIT", "prefill_wait", "waited"]

#: A queue of at most this share of ``running`` can be a prefill wait (:func:`prefill_wait`).
PREFILL_WAIT = 0.01


def waited(obs: Observation, decrease_factor: float) -> bool | None:
    """The interval's requests waited a queue worth a cut: their mean queue time over ``1 − decrease_factor`` of
    our mean round trip. None when either figure is missing."""
    latency, queued = obs.client_latency_mean_s, obs.queue_time_mean_s
    if latency is None or queued is None:
        return None
    return queued > (1 - decrease_factor) * latency


def prefill_wait(obs: Observation, capacity: float | None, kv_high: float) -> bool:
    """A queue of at most :data:`PREFILL_WAIT` × ``running`` while the engine runs fewer sequences than the most it
    ran with a queue (``capacity``) and its KV cache is under ``kv_high``: requests held for a step's prefill
    tokens. A sequence wall shows its queue at the same total ``running`` every time, since every client's requests
    count there; a wall of KV blocks shows a full cache."""
    if capacity is None:
        return False
    kv = obs.kv_cache_usage
    room = kv is None or kv < kv_high
    return room and obs.running < capacity - 0.5 and obs.waiting_capacity <= PREFILL_WAIT * obs.running
