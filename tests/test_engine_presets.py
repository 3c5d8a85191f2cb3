"""Preset coefficients are the documented ones, and the calibration script reproduces the token-cost fit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import simpy

from model_concurrency.engine import (
    BGE_M3,
    LLAMA_8B_A100,
    LLAMA_8B_A100_40GB,
    LLAMA_8B_A100_80GB,
    LLAMA_8B_H100,
    LLAMA_8B_H100_80GB,
    PRESETS,
    Request,
    get_preset,
)

ROOT = Path(__file__).resolve().parents[1]
VIDUR = Path("/work/shared/data/vidur")


def load_calibrate():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("calibrate_engine", ROOT / "scripts" / "calibrate_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibrate_engine"] = module
    spec.loader.exec_module(module)
    return module


def test_presets_are_registered_and_follow_vllm_defaults() -> None:
    assert set(PRESETS) == {"llama-8b-h100-80gb", "llama-8b-a100-80gb", "llama-8b-a100-40gb", "bge-m3"}
    # The names used before presets named their GPU still work, as the 80 GB cards they always meant.
    assert get_preset("llama-8b-a100") is LLAMA_8B_A100 is LLAMA_8B_A100_80GB
    assert get_preset("llama-8b-h100") is LLAMA_8B_H100 is LLAMA_8B_H100_80GB
    assert (LLAMA_8B_H100.max_num_batched_tokens, LLAMA_8B_H100.max_num_seqs) == (8192, 1024)
    assert (LLAMA_8B_A100.max_num_batched_tokens, LLAMA_8B_A100.max_num_seqs) == (2048, 256)
    assert (LLAMA_8B_A100_40GB.max_num_batched_tokens, LLAMA_8B_A100_40GB.max_num_seqs) == (2048, 256)
    assert BGE_M3.embedding and not BGE_M3.chunked_prefill
    with pytest.raises(ValueError, match="unknown engine preset"):
        get_preset("gpt-5")
    with pytest.raises(ValueError):
        LLAMA_8B_A100.replace(max_num_batched_tokens=128)  # below max_num_seqs


WEIGHT_BYTES = 8.03e9 * 2  # Llama-3.1-8B in bf16
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # layers × KV heads × head dim × (K, V) × bf16
HBM_EFFICIENCY = 0.89


@pytest.mark.parametrize(
    ("preset", "bandwidth"),
    [(LLAMA_8B_A100_40GB, 1.555e12), (LLAMA_8B_A100_80GB, 2.039e12), (LLAMA_8B_H100_80GB, 3.35e12)],
)
def test_memory_terms_are_bytes_over_effective_bandwidth(preset, bandwidth) -> None:  # type: ignore[no-untyped-def]
    effective = bandwidth * HBM_EFFICIENCY
    assert preset.step.memory_ms == pytest.approx(WEIGHT_BYTES / effective * 1000, rel=1e-3)
    assert preset.step.c_ms_per_context_token == pytest.approx(KV_BYTES_PER_TOKEN / effective * 1000, rel=1e-3)
    assert preset.step.a_ms == 1.08


def test_the_two_a100_cards_differ_only_in_memory() -> None:
    forty, eighty = LLAMA_8B_A100_40GB.step, LLAMA_8B_A100_80GB.step
    assert (forty.b_ms_per_token, forty.d_ms_per_token_sq, forty.overlap_p) == (
        eighty.b_ms_per_token,
        eighty.d_ms_per_token_sq,
        eighty.overlap_p,
    )
    assert forty.memory_ms / eighty.memory_ms == pytest.approx(2.039 / 1.555, rel=1e-3)
    assert LLAMA_8B_A100_40GB.num_gpu_blocks < LLAMA_8B_A100_80GB.num_gpu_blocks


def test_single_stream_decode_is_memory_bound_and_batching_is_nearly_free_up_to_the_ridge() -> None:
    step = LLAMA_8B_A100_80GB.step
    one = step.seconds(1)
    assert one * 1000 == pytest.approx(step.a_ms + step.memory_ms, rel=1e-3)
    # 8 decodes cost < 1 % more than 1 (the linear layers still read the weights once) ...
    assert step.seconds(8) / one < 1.01
    # ... while far past the ridge point the step is compute-bound: b per token.
    big = step.seconds(8192) - step.seconds(4096)
    assert big * 1000 == pytest.approx(4096 * step.b_ms_per_token, rel=0.02)


def test_embedding_preset_is_front_end_bound_for_short_inputs_and_gpu_bound_for_long_ones() -> None:
    def rate(prompt: int) -> float:
        from model_concurrency.engine import Server

        env = simpy.Environment()
        server = Server(env, BGE_M3)

        def again(_r: Request) -> None:
            server.submit_callback(Request(prompt, embedding=True), again)

        for _ in range(256):
            server.submit_callback(Request(prompt, embedding=True), again)
        env.run(until=30.0)
        return server.completed / 30.0

    assert rate(3000) == pytest.approx(12.0, rel=0.1)  # ≈ 12 req/s at 3K tokens, as reported
    # 32-token inputs: the GPU could do ~1,280 req/s (256 per 200 ms step), the API server only ~650.
    short = rate(32)
    frontend_ceiling = 1000.0 / (BGE_M3.frontend.fixed_ms + 32 * BGE_M3.frontend.per_token_ms)
    assert short == pytest.approx(frontend_ceiling, rel=0.02)


@pytest.mark.skipif(not VIDUR.exists(), reason="Vidur profiles not available")
def test_calibration_reproduces_the_committed_linear_layer_terms() -> None:
    calibrate = load_calibrate()
    a100 = VIDUR / "data_profiling_compute_a100_meta-llama_Meta-Llama-3-8B_mlp.csv"
    _, b_linear, r2, costs = calibrate.fit_file(a100, layers=32, max_tokens=8192)
    assert r2 > 0.99
    assert costs[1] == pytest.approx(9.7, abs=0.05)  # the reference's 9.7 ms at 1 token
    _, b, p, rms = calibrate.fit_roofline(a100, layers=32, max_tokens=8192)
    assert (b, p) == (pytest.approx(LLAMA_8B_A100.step.b_ms_per_token), LLAMA_8B_A100.step.overlap_p)
    assert rms < 0.05  # the p-norm follows the profile within 5 % RMS; the linear fit's slope is 4 % lower
    assert b_linear == pytest.approx(b, rel=0.04)
    h100 = VIDUR / "data_profiling_compute_h100_meta-llama_Llama-2-7b-hf_mlp.csv"
    a100_l2 = VIDUR / "data_profiling_compute_a100_meta-llama_Llama-2-7b-hf_mlp.csv"
    _, b_h100, p_h100, _ = calibrate.fit_roofline(h100, layers=32, max_tokens=8192)
    _, b_a100_l2, _, _ = calibrate.fit_roofline(a100_l2, layers=32, max_tokens=8192)
    assert b_h100 * b / b_a100_l2 == pytest.approx(LLAMA_8B_H100.step.b_ms_per_token, rel=0.01)
    assert p_h100 == LLAMA_8B_H100.step.overlap_p
