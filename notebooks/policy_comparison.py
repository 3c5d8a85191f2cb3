# ruff: noqa: E402  (a notebook imports after its parameters cell)
# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Policy comparison
#
# Every scenario under `sims/` × a set of policies, side by side with the lab's oracle, in one run: the same
# engine model, the same seeds. This is `model-concurrency compare` (src/model_concurrency/lab/compare.py) in a
# notebook, plus the charts the table is hard to read without. docs/results.md holds the full-size study and the
# choice of default it supports. `FAST = True` runs a few scaled-down scenarios (the test suite runs it that way).

# %% tags=["parameters"]
FAST = False

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from model_concurrency.lab.compare import markdown_table, run_study, write_grid
from model_concurrency.lab.notebook import fast_mode, figure_dir, save_figure
from model_concurrency.lab.scenario import load_scenario

FAST = fast_mode(FAST)
SIMS = Path("../sims") if Path("../sims").is_dir() else Path("sims")
if FAST:
    scenarios = [load_scenario(SIMS / f"{n}.toml").scaled(0.25) for n in ("ramp", "gpu-added", "multi-client")]
    policies = ["seed-aimd", "aimd", "capacity", "adaptive"]
else:
    # fleet-1000 (1,000 clients) is a study of its own (docs/scale-out.md): too slow for eight policies here.
    scenarios = [load_scenario(p) for p in sorted(SIMS.glob("*.toml")) if p.stem != "fleet-1000"]
    policies = ["seed-aimd", "aimd", "aimd-slowstart", "queue", "gradient", "setpoint", "capacity", "adaptive"]
study = run_study(scenarios, policies, jobs=min(2, os.cpu_count() or 1) if FAST else None)

# %%
columns = [
    "scenario",
    "policy",
    "goodput_ratio",
    "time_to_90pct_s",
    "oracle_time_to_90pct_s",
    "saturated_fraction",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
    "oscillation",
    "jain_fairness",
]
display(Markdown(markdown_table(study.rows, columns)))

# %% [markdown]
# ## Goodput against queueing
# Each point is one scenario × policy: right is more of the oracle's goodput, down is less queueing (p99 queue
# time as a multiple of the oracle's, log scale). The goal region is shaded: ≥ 95 % of the goodput
# with at most twice the oracle's p99 queue time.

# %%
fig, ax = plt.subplots(figsize=(8, 5.5))
markers = dict(zip([s.name for s in scenarios], "os^vD<>ph*", strict=False))
colors = dict(zip(policies, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
for row in study.rows:
    if row["goodput_ratio"] is None or not row["oracle_queue_time_p99_s"]:
        continue
    ratio = max(row["queue_time_p99_s"] / row["oracle_queue_time_p99_s"], 1e-2)
    ax.scatter(row["goodput_ratio"], ratio, marker=markers[row["scenario"]], color=colors[row["policy"]], s=40)
ax.axvspan(0.95, 1.05, ymin=0, ymax=1, color="tab:green", alpha=0.06)
ax.axhline(2.0, color="tab:green", linestyle="--", linewidth=1)
ax.axvline(0.95, color="tab:green", linestyle="--", linewidth=1)
ax.set_yscale("log")
ax.set_xlabel("goodput / oracle")
ax.set_ylabel("p99 queue time / oracle's")
for p, c in colors.items():
    ax.scatter([], [], color=c, label=p)
for s, m in markers.items():
    ax.scatter([], [], marker=m, color="0.3", label=s)
ax.legend(fontsize=7, ncol=2, loc="upper left")
fig.tight_layout()
save_figure(fig, "comparison_scatter")

# %%
fig, axes = plt.subplots(1, 2, figsize=(14, 4))
names = [s.name for s in scenarios]
width = 0.8 / len(policies)
for k, p in enumerate(policies):
    xs = np.arange(len(names)) + k * width
    axes[0].bar(xs, [study.row(n, p)["goodput_ratio"] or 0 for n in names], width, label=p, color=colors[p])
    axes[1].bar(xs, [study.row(n, p)["saturated_fraction"] for n in names], width, label=p, color=colors[p])
for ax, title in zip(axes, ["goodput / oracle", "saturated fraction"], strict=True):
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=20, fontsize=8)
    ax.set_title(title)
axes[0].axhline(0.95, color="k", linestyle=":", linewidth=1)
axes[0].set_ylim(0.5, 1.05)
axes[1].legend(fontsize=7, ncol=2)
fig.tight_layout()
save_figure(fig, "comparison_bars")

# %% [markdown]
# ## Every run
# Rows are scenarios, columns policies; in each cell the target (and the oracle's, dotted) over capacity-waiting,
# and below it the goodput.

# %%
write_grid(study, figure_dir() / "comparison_grid.png", dpi=50 if FAST else 60)
