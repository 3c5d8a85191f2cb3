"""Engine configurations: one preset per model and GPU, and where every number comes from.

Step time (:mod:`.steptime`): ``a + (M^p + (b·tokens)^p)^(1/p) + c·context + d·quadratic``. For Llama-3.1-8B
(8.03 B parameters, bf16, TP 1; derivations and the validation table in docs/engine-model.md):

* ``M`` (``memory_ms``) = weight bytes / (HBM bandwidth × η): 16.06 GB over the datasheet bandwidth (A100-40GB
  1.555 TB/s, A100-80GB SXM 2.039 TB/s, H100-80GB SXM 3.35 TB/s) at η = 0.89;
* ``c`` = 128 KiB of KV per token (32 layers × 8 KV heads × 128 dims × K,V × 2 bytes) over the same effective
  bandwidth;
* ``a`` = 1.08 ms and η = 0.89 solve the two single-stream decode figures together (H100-80GB: TPOT p50 6.48 ms at
  concurrency 1, vLLM 0.21.0; A100-40GB: 75 output tokens/s at concurrency 1, 1024 in / 128 out, vLLM 0.23.0),
  assuming one overhead and one bandwidth efficiency for both cards;
* ``b`` and ``p`` are the p-norm roofline fitted on Vidur's summed linear-operator profiles
  (``scripts/calibrate_engine.py``): A100 Llama-3-8B b = 0.0690 ms/token, p = 1.5; H100 (Llama-2-7B
  profile only) b = 0.0200 × 1.070 (the Llama-3-8B / Llama-2-7B ratio of the same fit on A100, 0.0690 / 0.0645)
  = 0.0214, p = 1.25;
* ``d`` = causal attention FLOPs per token pair (2 × 32 layers × 4096) / (60 % of dense bf16 peak: A100 312,
  H100 989 TFLOP/s);
* ``num_gpu_blocks`` = (memory × 0.9 − 15 GiB weights − ≈2.5 GiB activations and CUDA graphs) / 128 KiB / 16;
* scheduler limits are ``vllm serve`` defaults: 8192 batched tokens / 1024 seqs on H100; 2048 / 256 on A100;
* front end: 0.5 ms + 1 µs/token of API-server CPU (tokenising) and 5.6 ms in transit (IPC to the engine core,
  detokenising, the HTTP response), the transit fitted so that TTFT at concurrency 1 is the H100 benchmark's
  13.98 ms for a ~100-token prompt (a calibration, not a validation: docs/engine-model.md).

bge-m3 class (568M-parameter XLM-R encoder), linear: ``b`` 24 µs/token so that 3K-token prompts run at ≈ 12 req/s
(github.com/vllm-project/vllm/issues/11320); front end 1.5 ms + 1.5 µs/token, ≈ 430 req/s per API process at 512
tokens; pooling models do not chunk prefills. Short names (``llama-8b-h100``, ``llama-8b-a100``) are aliases of the
80 GB presets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from model_concurrency.engine.steptime import FrontEndCost, StepTimeModel

BLOCK_SIZE = 16
SCHEDULING_POLICIES = ("fcfs", "priority")


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
    # vLLM's --scheduling-policy: "fcfs" (default) or "priority" (waiting requests by (priority, arrival), lower
    # first; a preemption evicts the running request with the largest (priority, arrival)).
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}")
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


_LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
_LLAMA_8B_FRONTEND = FrontEndCost(fixed_ms=0.5, per_token_ms=0.001, latency_ms=5.6)


def _llama_8b(
    name: str, memory_ms: float, b: float, p: float, c: float, d: float, seqs: int, tokens: int, blocks: int
) -> EnginePreset:
    """Llama-3.1-8B on one card: the overhead ``a`` and the front end are the model's, the rest the card's (``b``,
    ``p``, ``c``, ``d`` as in the step-time formula above; ``seqs`` and ``tokens`` the scheduler limits)."""
    return EnginePreset(
        name=name,
        model_name=_LLAMA_8B,
        step=StepTimeModel(
            a_ms=1.08, b_ms_per_token=b, c_ms_per_context_token=c, d_ms_per_token_sq=d, memory_ms=memory_ms, overlap_p=p
        ),
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        num_gpu_blocks=blocks,
        frontend=_LLAMA_8B_FRONTEND,
    )


# One row a card (the module docstring derives each number): name, M, b, p, c, d, then the scheduler limits and the
# KV blocks; the A100-40GB's blocks are (36 GiB − 15 − 2.5) / 128 KiB / 16.
#                              name                  M       b       p     c         d         seqs  tokens blocks
LLAMA_8B_H100_80GB = _llama_8b("llama-8b-h100-80gb", 5.387, 0.0214, 1.25, 4.396e-5, 4.418e-7, 1024, 8192, 27_900)
LLAMA_8B_A100_80GB = _llama_8b("llama-8b-a100-80gb", 8.850, 0.0690, 1.5, 7.223e-5, 1.400e-6, 256, 2048, 27_900)
LLAMA_8B_A100_40GB = _llama_8b("llama-8b-a100-40gb", 11.604, 0.0690, 1.5, 9.471e-5, 1.400e-6, 256, 2048, 9_472)

# The names before there was one preset per GPU: both meant 80 GB cards.
LLAMA_8B_H100 = LLAMA_8B_H100_80GB
LLAMA_8B_A100 = LLAMA_8B_A100_80GB

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

PRESETS: dict[str, EnginePreset] = {
    p.name: p for p in (LLAMA_8B_H100_80GB, LLAMA_8B_A100_80GB, LLAMA_8B_A100_40GB, BGE_M3)
}
PRESET_ALIASES: dict[str, str] = {"llama-8b-h100": "llama-8b-h100-80gb", "llama-8b-a100": "llama-8b-a100-80gb"}


def get_preset(name: str) -> EnginePreset:
    """The preset called ``name``, or one of :data:`PRESET_ALIASES`: short names without the card's memory, kept
    for configs that use them."""
    try:
        return PRESETS[PRESET_ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join(sorted([*PRESETS, *PRESET_ALIASES]))
        raise ValueError(f"unknown engine preset {name!r}; known: {known}") from None
