"""How long one engine step and one front-end request take: the parametric cost model.

    t_step = (a + b·scheduled_tokens + c·Σ decode context + d·Σ prefill chunk·(chunk start + chunk)) / speed

``a`` is the fixed cost of a step (kernel launches, sampling, the scheduler's own CPU time), ``b`` the token-linear
work (projections and MLP: the term ``scripts/calibrate_engine.py`` fits from Vidur profiles), ``c`` the
memory-bound attention of decodes reading their KV cache, ``d`` the quadratic attention of prefills (for a prompt
computed in one chunk the term is prompt_len², the DistServe form; a chunk attends to everything before it too).
Coefficients are in milliseconds; durations come out in seconds. ``speed`` scales a whole engine (a faster GPU,
or "capacity ×4" in a scenario) without touching the shape.

The front-end cost is the API server's per-request CPU work (HTTP, tokenisation, serialising the result). It runs
in front of the engine, in its own process(es), so it pipelines with steps rather than adding to them; for small
embedding models it can be the bottleneck (docs/engine-model.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FrontEndCost", "StepTimeModel"]


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Coefficients of one engine step, in milliseconds (see the module docstring for the formula)."""

    a_ms: float
    b_ms_per_token: float
    c_ms_per_context_token: float = 0.0
    d_ms_per_token_sq: float = 0.0

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms_per_token", "c_ms_per_context_token", "d_ms_per_token_sq"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def compile(self, speed: float = 1.0) -> Callable[[int, int, int], float]:
        """``(tokens, decode_context, prefill_quadratic) -> seconds`` with ms -> s and ``speed`` folded in.

        The engine calls this once per step; a closure over pre-scaled coefficients keeps that call cheap.
        """
        scale = 1.0 / (1000.0 * speed)
        a = self.a_ms * scale
        b = self.b_ms_per_token * scale
        c = self.c_ms_per_context_token * scale
        d = self.d_ms_per_token_sq * scale

        def step_seconds(tokens: int, decode_context: int, prefill_quadratic: int) -> float:
            return a + b * tokens + c * decode_context + d * prefill_quadratic

        return step_seconds

    def seconds(self, tokens: int, decode_context: int = 0, prefill_quadratic: int = 0, speed: float = 1.0) -> float:
        """One step's duration (the engine uses :meth:`compile`, the same arithmetic)."""
        ms = (
            self.a_ms
            + self.b_ms_per_token * tokens
            + self.c_ms_per_context_token * decode_context
            + self.d_ms_per_token_sq * prefill_quadratic
        )
        return ms / (1000.0 * speed)


@dataclass(frozen=True, slots=True)
class FrontEndCost:
    """Per-request API-server CPU time, ``fixed + per_token × prompt_tokens`` (ms), over ``workers`` processes."""

    fixed_ms: float = 0.0
    per_token_ms: float = 0.0
    workers: int = 1

    def __post_init__(self) -> None:
        if self.fixed_ms < 0 or self.per_token_ms < 0:
            raise ValueError("front-end costs must be >= 0")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")

    @property
    def free(self) -> bool:
        return self.fixed_ms == 0.0 and self.per_token_ms == 0.0

    def seconds(self, prompt_tokens: int) -> float:
        return (self.fixed_ms + self.per_token_ms * prompt_tokens) / 1000.0
