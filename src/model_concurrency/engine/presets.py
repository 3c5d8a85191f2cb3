"""Engine configurations with step-time coefficients, and where every number comes from.

The derivations are in docs/engine-model.md; in short (all 8B figures are Llama-3-8B-class, fp16, TP 1):

* ``b`` (token-linear cost) is the least-squares fit of ``scripts/calibrate_engine.py`` over Vidur's operator
  profiles (per-layer medians × 32 layers + embedding, batch sizes up to 8192 tokens): Llama-3-8B on A100
  66.56 µs/token; Llama-2-7B on H100 19.92 µs/token, scaled by the Llama-3-8B/Llama-2-7B ratio measured on A100
  (66.56/63.69 = 1.045) to 20.8 µs/token.
* ``a`` (fixed step cost) is the single-stream time per output token of public vLLM benchmarks (H100 6.48 ms at
  concurrency 1; A100 ≈ 13.3 ms per token at 1024 in / 128 out, ≈ 12.7 ms once the prefill is taken out) minus the
  model's own ``b`` and ``c`` share at batch 1.
* ``c`` (decode attention) is memory-bound: 128 KiB of KV per token read at HBM bandwidth (H100 SXM 3.35 TB/s,
  A100 80GB 2.04 TB/s). DistServe's A100 OPT-13B fit (4.94e-4 ms per context token, 800 KiB/token) scales to
  the same order.
* ``d`` (prefill attention) is DistServe's A100 fit 8.65e-6 ms/len² scaled by attention FLOPs
  (layers × hidden: 32·4096 vs 40·5120 = 0.64); H100 by the H100/A100 ratio of ``b``.
* ``num_gpu_blocks``: 80 GB × 0.9 utilisation − 15 GiB of weights − ≈2.5 GiB activations ≈ 54.5 GiB of KV at
  128 KiB/token ≈ 446k tokens ≈ 27.9k blocks of 16.
* Scheduler limits are ``vllm serve`` defaults: H100 8192 tokens / 1024 seqs; A100 2048 / 256.
* bge-m3 class (568M-parameter XLM-R encoder): ``b`` 24 µs/token so that 3K-token prompts run at ≈ 12 req/s,
  the figure reported in vLLM issues; front-end 1.5 ms + 1.5 µs/token so that a 512-token request costs ≈ 2.3 ms
  of API-server CPU (≈ 430 req/s, the ceiling a 110M encoder reached); pooling models do not chunk prefills.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from model_concurrency.engine.steptime import FrontEndCost, StepTimeModel

__all__ = ["BGE_M3", "BLOCK_SIZE", "LLAMA_8B_A100", "LLAMA_8B_H100", "PRESETS", "EnginePreset", "get_preset"]

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class EnginePreset:
    """Everything one engine needs: scheduler limits, KV cache size, step-time and front-end coefficients."""

    name: str
    model_name: str
    step: StepTimeModel
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int = BLOCK_SIZE
    chunked_prefill: bool = True
    embedding: bool = False  # the model serves embeddings: requests are prefill-only
    frontend: FrontEndCost = field(default_factory=FrontEndCost)
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        # vLLM refuses this too: every running sequence must be able to decode in every step.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2 (block 0 is reserved)")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")

    def replace(self, **changes: object) -> EnginePreset:
        """A copy with some fields changed (``preset.replace(max_num_seqs=64)``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


LLAMA_8B_H100 = EnginePreset(
    name="llama-8b-h100",
    model_name="meta-llama/Llama-3.1-8B-Instruct",
    step=StepTimeModel(a_ms=6.42, b_ms_per_token=0.0208, c_ms_per_context_token=3.91e-5, d_ms_per_token_sq=1.73e-6),
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    num_gpu_blocks=27_900,
)

LLAMA_8B_A100 = EnginePreset(
    name="llama-8b-a100",
    model_name="meta-llama/Llama-3.1-8B-Instruct",
    step=StepTimeModel(a_ms=12.6, b_ms_per_token=0.06656, c_ms_per_context_token=6.43e-5, d_ms_per_token_sq=5.54e-6),
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    num_gpu_blocks=27_900,
)

BGE_M3 = EnginePreset(
    name="bge-m3",
    model_name="BAAI/bge-m3",
    step=StepTimeModel(a_ms=3.0, b_ms_per_token=0.024, c_ms_per_context_token=0.0, d_ms_per_token_sq=1.0e-6),
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    num_gpu_blocks=27_900,
    chunked_prefill=False,
    embedding=True,
    frontend=FrontEndCost(fixed_ms=1.5, per_token_ms=0.0015, workers=1),
)

PRESETS: dict[str, EnginePreset] = {p.name: p for p in (LLAMA_8B_H100, LLAMA_8B_A100, BGE_M3)}


def get_preset(name: str) -> EnginePreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown engine preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
