"""What a model's runtime publishes: one frozen, typed record that telemetry, the hooks and ``watch`` read.

The runtime (:mod:`model_concurrency.runtime`) is the only writer of a model's state. Readers never reach into
its controller core or limiter: they get a :class:`RuntimeState`, built under the runtime's lock, and
``get_utilization`` is that record's :meth:`RuntimeState.as_dict`. The static view (no controller applies: the
flag off, an unregistered model, no metrics endpoint) is the same record with the adaptive fields empty, so a
dashboard sees the same keys either way. This module imports nothing of the package, so every layer may read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RuntimeState"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeState:
    """One model's state as last published by its runtime. Never holds credentials.

    The first fields are the original design's view (running, waiting_capacity, current_target, floor, ceiling,
    metrics_ok, saturated, last_poll, metrics_url); the rest were added since, and keep their names.
    """

    model: str | None
    served_model_name: str | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_capacity: float | None = None
    kv_cache_usage: float | None = None
    inflight: int = 0
    inflight_tokens: int = 0
    token_budget: int | None = None
    current_target: int = 1
    floor: int = 1
    ceiling: int = 1
    metrics_ok: bool | None = None
    saturated: bool = False
    # The Gateway API Inference Extension's pool score beside ours (signals/saturation.py), and whether it calls the
    # pool saturated; the reason a hostile page holds the target (page_hold.py), if one does.
    gateway_saturation: float | None = None
    gateway_saturated: bool | None = None
    page_hold: str | None = None
    last_poll: float | None = None  # wall-clock seconds since the epoch
    consecutive_failures: int = 0
    last_error: str | None = None
    metrics_url: str | None = None
    policy: str = "static"
    adaptive: bool = False
    # What holds the target back (decision.LIMITS: ceiling, guard, saturation, app-limited, throttled, floor), or
    # None while it grows freely; and the last decision in short ("16 -> 24: policy").
    limited_by: str | None = None
    last_decision: str | None = None
    # Failures that show (health.py): a fallback in use ("grace", "handover", "floor"), a page that stopped moving,
    # a limit nothing reaches (the gate open in effect), and engine restarts seen (counters that went backwards).
    fallback: str | None = None
    signal_stale: bool = False
    limit_unreached: bool = False
    counter_resets: int = 0
    # The outage hold (gate/hold.py): why the model is held as unreachable by its own calls (the last failure),
    # and for how long so far; None while its calls get through.
    outage: str | None = None
    outage_s: float | None = None
    # The Retry-After hold's backoff at the floor (gate/hold.py): 1 until refusals repeat there; above 1, each
    # refusal holds that many times the delay it names (the backoff adding at most up to 30 s).
    hold_backoff: float = 1.0
    # What is known of the engines' limits (observation.EngineLimits.as_dict): ``max_num_seqs`` (sequence slots,
    # all engines), ``max_num_batched_tokens`` (one engine's step), ``kv_cache_tokens`` (all engines),
    # ``kv_cache_max_concurrency``, and ``source``: per known field, where it came from. None: nothing known.
    limits: dict[str, Any] | None = None
    # A worker of a job (model_concurrency.ray, ``FanOut(job=...)``): the job's name, this worker's grant from the
    # job's coordinator (the limit it runs at), the job's target at that grant, and whether the lease lapsed (the
    # coordinator did not answer in time, so this worker decides on its own until one answers again).
    job: str | None = None
    grant: int | None = None
    job_target: int | None = None
    lease_lapsed: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (what ``get_utilization`` returns)."""
        return asdict(self)

    @classmethod
    def static(
        cls, model: str | None, *, served_model_name: str | None, floor: int, ceiling: int, metrics_url: str | None
    ) -> RuntimeState:
        """The view when no controller applies: the floor is the limit, and nothing was polled."""
        return cls(
            model=model,
            served_model_name=served_model_name,
            current_target=floor,
            floor=floor,
            ceiling=max(floor, ceiling),
            metrics_url=metrics_url,
        )
