"""The roofline step time: bounds, monotonicity, and the older linear form as its ``memory_ms = 0`` case."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_concurrency.engine import FrontEndCost, StepTimeModel

coefficient = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)
slope = st.floats(min_value=1e-4, max_value=0.2, allow_nan=False)
tokens = st.integers(min_value=0, max_value=16_384)
exponent = st.floats(min_value=1.0, max_value=8.0, allow_nan=False)


@given(a=coefficient, b=slope, c=st.floats(0.0, 1e-3), d=st.floats(0.0, 1e-5), n=tokens, ctx=tokens, q=tokens)
def test_memory_zero_is_exactly_the_linear_sum(
    a: float, b: float, c: float, d: float, n: int, ctx: int, q: int
) -> None:
    model = StepTimeModel(a, b, c, d)
    ms = 1.0 / 1000.0  # the engine folds ms -> s into each coefficient; the same arithmetic, bit for bit
    assert model.seconds(n, ctx, q) == a * ms + b * ms * n + c * ms * ctx + d * ms * q


@given(memory=st.floats(0.01, 50.0), b=slope, p=exponent, n=tokens)
def test_linear_layers_cost_between_the_larger_and_the_sum_of_memory_and_compute(
    memory: float, b: float, p: float, n: int
) -> None:
    step = StepTimeModel(0.0, b, memory_ms=memory, overlap_p=p).seconds(n) * 1000
    compute = b * n
    assert max(memory, compute) * (1 - 1e-9) <= step <= (memory + compute) * (1 + 1e-9)


@given(memory=st.floats(0.01, 50.0), b=slope, p=exponent, n=tokens, extra=st.integers(1, 4096))
def test_more_tokens_never_make_a_step_shorter(memory: float, b: float, p: float, n: int, extra: int) -> None:
    model = StepTimeModel(1.0, b, 1e-4, 1e-6, memory_ms=memory, overlap_p=p)
    assert model.seconds(n + extra) >= model.seconds(n)
    assert model.seconds(n, n + extra) >= model.seconds(n, n)


def test_speed_divides_the_whole_step() -> None:
    model = StepTimeModel(1.0, 0.07, 7e-5, 1.4e-6, memory_ms=8.85, overlap_p=1.5)
    assert model.seconds(300, 5000, 9000, speed=4.0) == pytest.approx(model.seconds(300, 5000, 9000) / 4.0)


def test_invalid_coefficients_are_refused() -> None:
    with pytest.raises(ValueError, match="memory_ms"):
        StepTimeModel(1.0, 0.1, memory_ms=-1.0)
    with pytest.raises(ValueError, match="overlap_p"):
        StepTimeModel(1.0, 0.1, memory_ms=1.0, overlap_p=0.5)
    with pytest.raises(ValueError, match="front-end"):
        FrontEndCost(latency_ms=-1.0)


def test_transit_latency_is_free_for_throughput_but_not_for_the_books() -> None:
    cost = FrontEndCost(fixed_ms=0.5, per_token_ms=0.001, latency_ms=5.6)
    assert not cost.free
    assert cost.seconds(1000) == pytest.approx(0.0015)  # CPU time on a worker only
    assert cost.latency_seconds == pytest.approx(0.0056)
    assert FrontEndCost().free
