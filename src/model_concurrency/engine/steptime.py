"""How long one engine step and one front-end request take: a roofline cost model per operator group.

    t_step = ( a
             + (M^p + (b·scheduled_tokens)^p)^(1/p)      linear layers: weight reads vs GEMM compute
             + c·Σ decode context                        decode attention: KV-cache reads at HBM bandwidth
             + d·Σ prefill chunk·(chunk start + chunk)   prefill attention: FLOPs
             ) / speed

``a`` is the fixed cost of a step (scheduler CPU time, sampling, launch gaps under CUDA graphs). The linear layers
(projections, MLP, LM head) are the roofline: a step reads every weight once (``M`` = weight bytes / effective
HBM bandwidth) and does ``b`` ms of tensor-core work per scheduled token; the GPU overlaps the two, so the step
costs about the larger of them. A hard ``max`` overstates the overlap near the ridge point (Vidur's operator
profiles bend smoothly), so the two are combined as a p-norm, which tends to the ``max`` for large ``p`` and to the
sum for ``p = 1``; ``p`` and ``b`` are fitted on Vidur's profiles (``scripts/calibrate_engine.py``).
Attention runs in kernels of its own after the projections, so its time adds: decodes read their KV cache
(memory-bound, ``c`` = KV bytes per token / effective bandwidth), prefills are compute-bound (``d`` = attention
FLOPs per token pair / effective FLOP rate; a chunk attends to everything before it too).

With ``memory_ms = 0`` the formula is the older linear sum ``a + b·tokens + c·context + d·quadratic`` exactly.
Coefficients are in milliseconds; durations come out in seconds. ``speed`` scales a whole engine (a faster GPU, or
"capacity ×4" in a scenario) without touching the shape.

The front-end cost is the API server's work per request. ``fixed_ms + per_token_ms × prompt`` is CPU time
(HTTP, tokenisation, serialising the result) on ``workers`` API processes, FIFO, pipelined with the engine's steps;
for small embedding models it can be the bottleneck (docs/engine-model.md). ``latency_ms`` is time a request
spends in transit without holding a worker (IPC to the engine core and back, detokenising and sending the first
token): it shows in time to first token and end-to-end latency but never limits throughput.
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
    memory_ms: float = 0.0  # M: one read of the weights at effective HBM bandwidth (0 = no roofline, linear sum)
    overlap_p: float = 1.5  # p of the p-norm combining memory and compute time of the linear layers

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms_per_token", "c_ms_per_context_token", "d_ms_per_token_sq", "memory_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not self.overlap_p >= 1.0:
            raise ValueError("overlap_p must be >= 1 (1 = no overlap, large = a hard max)")

    def compile(self, speed: float = 1.0) -> Callable[[int, int, int], float]:
        """``(tokens, decode_context, prefill_quadratic) -> seconds`` with ms -> s and ``speed`` folded in.

        The engine calls this once per step; a closure over pre-scaled coefficients keeps that call cheap.
        """
        scale = 1.0 / (1000.0 * speed)
        a = self.a_ms * scale
        b = self.b_ms_per_token * scale
        c = self.c_ms_per_context_token * scale
        d = self.d_ms_per_token_sq * scale
        if self.memory_ms == 0.0:

            def linear_step_seconds(tokens: int, decode_context: int, prefill_quadratic: int) -> float:
                return a + b * tokens + c * decode_context + d * prefill_quadratic

            return linear_step_seconds

        p = self.overlap_p
        inv_p = 1.0 / p
        memory_p = (self.memory_ms * scale) ** p

        def roofline_step_seconds(tokens: int, decode_context: int, prefill_quadratic: int) -> float:
            linear: float = (memory_p + (b * tokens) ** p) ** inv_p
            return a + linear + c * decode_context + d * prefill_quadratic

        return roofline_step_seconds

    def seconds(self, tokens: int, decode_context: int = 0, prefill_quadratic: int = 0, speed: float = 1.0) -> float:
        """One step's duration (the engine uses :meth:`compile`, the same arithmetic)."""
        return self.compile(speed)(tokens, decode_context, prefill_quadratic)


@dataclass(frozen=True, slots=True)
class FrontEndCost:
    """Per-request API-server time: CPU ``fixed + per_token × prompt_tokens`` (ms) on ``workers`` processes,
    plus ``latency_ms`` in transit that holds no worker."""

    fixed_ms: float = 0.0
    per_token_ms: float = 0.0
    workers: int = 1
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.fixed_ms < 0 or self.per_token_ms < 0 or self.latency_ms < 0:
            raise ValueError("front-end costs must be >= 0")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")

    @property
    def free(self) -> bool:
        return self.fixed_ms == 0.0 and self.per_token_ms == 0.0 and self.latency_ms == 0.0

    def seconds(self, prompt_tokens: int) -> float:
        """CPU time on a worker (``latency_ms`` excluded: see :attr:`latency_seconds`)."""
        return (self.fixed_ms + self.per_token_ms * prompt_tokens) / 1000.0

    @property
    def latency_seconds(self) -> float:
        return self.latency_ms / 1000.0
