"""Fit the linear-layer term of the engine step-time model from Vidur operator profiles.

Vidur (MLSys 2024) profiles each transformer operator of a model on a GPU at many batch sizes (``num_tokens``)
and writes one CSV per model and GPU, with min/max/mean/median/std columns per operator in milliseconds. The
token-linear part of one engine step is the sum of the per-layer operators (norms, QKV and output projections,
rotary embedding, MLP up/act/down, residual add) times the number of layers, plus the embedding lookup once.
Attention itself is not in these files: it is the ``c`` (decode context) and ``d`` (prefill length squared) terms,
taken from the sources listed in docs/engine-model.md.

Usage::

    python scripts/calibrate_engine.py /work/shared/data/vidur/*.csv [--layers 32] [--max-tokens 8192]

For every file it prints the summed step cost at a few batch sizes, the least-squares line ``a + b × tokens``
through all profiled batch sizes up to ``--max-tokens`` (tensor parallel degree 1, the older linear step model),
and the roofline the presets use, ``(M^p + (b × tokens)^p)^(1/p)``, fitted by minimising the relative RMS error
over a grid (``fit_roofline``). The presets take ``b`` and ``p`` from it; ``M`` comes from HBM bandwidth instead,
because the profiles run eagerly (each operator launched on its own), which a CUDA-graph decode does not pay.
The presets in ``src/model_concurrency/engine/presets.py`` carry the fitted numbers, so this data is never
needed at run time.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import numpy as np

__all__ = ["fit_file", "fit_roofline", "main", "step_costs"]

PER_LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
ONCE_OPS = ("emb",)


def step_costs(path: Path, layers: int, tensor_parallel: int = 1) -> dict[int, float]:
    """Milliseconds of token-linear work per step, by number of tokens (median over repeated profile rows)."""
    samples: dict[int, list[float]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if int(row["num_tensor_parallel_workers"]) != tensor_parallel:
                continue
            per_layer = sum(float(row[f"time_stats.{op}.median"]) for op in PER_LAYER_OPS)
            once = sum(float(row[f"time_stats.{op}.median"]) for op in ONCE_OPS)
            samples.setdefault(int(row["num_tokens"]), []).append(per_layer * layers + once)
    return {tokens: statistics.median(values) for tokens, values in sorted(samples.items())}


def fit_file(path: Path, layers: int, max_tokens: int) -> tuple[float, float, float, dict[int, float]]:
    """Least-squares ``a + b × tokens`` over the profiled sizes up to ``max_tokens``: (a_ms, b_ms, r2, costs)."""
    costs = step_costs(path, layers)
    points = [(t, c) for t, c in costs.items() if t <= max_tokens]
    if len(points) < 2:
        raise SystemExit(f"{path}: fewer than two profiled batch sizes up to {max_tokens} tokens")
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - (a + b * x)
    r2 = 1.0 - float(residual @ residual) / float(((y - y.mean()) @ (y - y.mean())) or 1.0)
    return float(a), float(b), r2, costs


def fit_roofline(path: Path, layers: int, max_tokens: int) -> tuple[float, float, float, float]:
    """Grid fit of ``(M^p + (b·n)^p)^(1/p)`` minimising relative RMS error: (memory_ms, b_ms, p, rel_rms)."""
    costs = step_costs(path, layers)
    n = np.array([t for t in costs if t <= max_tokens], dtype=float)
    y = np.array([costs[int(t)] for t in n])
    memory = np.arange(2.0, 15.0, 0.05)[:, None, None]
    slope = np.arange(0.010, 0.100, 0.0005)[None, :, None]
    best = (np.inf, 0.0, 0.0, 0.0)
    for p in np.arange(1.0, 6.01, 0.25):
        predicted = (memory**p + (slope * n[None, None, :]) ** p) ** (1.0 / p)
        rms = np.sqrt(np.mean(((predicted - y) / y) ** 2, axis=2))
        i, j = np.unravel_index(int(np.argmin(rms)), rms.shape)
        if rms[i, j] < best[0]:
            best = (float(rms[i, j]), float(memory[i, 0, 0]), float(slope[0, j, 0]), float(p))
    rms_best, m_best, b_best, p_best = best
    return m_best, b_best, p_best, rms_best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", type=Path, help="Vidur data_profiling_compute_*_mlp.csv files")
    parser.add_argument("--layers", type=int, default=32, help="transformer layers of the model (32 for 7B/8B)")
    parser.add_argument("--max-tokens", type=int, default=8192, help="fit batch sizes up to this many tokens")
    args = parser.parse_args(argv)
    for path in args.csv:
        a, b, r2, costs = fit_file(path, args.layers, args.max_tokens)
        shown = ", ".join(f"{t}: {costs[t]:.1f}" for t in (1, 128, 256, 512, 1024, 2048, 4096, 8192) if t in costs)
        print(f"{path.name}")
        print(f"  step cost ms by tokens: {shown}")
        print(f"  fit (tokens <= {args.max_tokens}, {sum(t <= args.max_tokens for t in costs)} sizes):")
        print(f"    a = {a:.3f} ms, b = {b * 1000:.2f} us/token ({b:.5f} ms/token), R^2 = {r2:.4f}")
        memory, slope, p, rms = fit_roofline(path, args.layers, args.max_tokens)
        print(f"  roofline fit: M = {memory:.2f} ms, b = {slope:.4f} ms/token, p = {p:.2f}, relative RMS {rms:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
