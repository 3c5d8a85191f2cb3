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
# # Step response: a GPU set added, then removed
#
# The `gpu-added` scenario (one engine of 128 sequences, three more at 10 min: capacity ×4), extended here with
# the reverse step: the three engines go away again later. A good policy uses the new capacity within a poll or
# two, and after the removal stops queueing as fast. Compared: the production `aimd`, the original `seed-aimd`,
# `aimd-slowstart`, `capacity` and `adaptive`. `FAST = True` shortens the run (the test suite runs it that way).

# %% tags=["parameters"]
FAST = False

# %%
import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from model_concurrency.lab.compare import markdown_table
from model_concurrency.lab.notebook import fast_mode, save_figure
from model_concurrency.lab.oracle import Oracle
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import Event, load_scenario
from model_concurrency.policies.registry import load_policy

FAST = fast_mode(FAST)
SIMS = Path("../sims") if Path("../sims").is_dir() else Path("sims")
base = load_scenario(SIMS / "gpu-added.toml")
# Add at 600 s, remove at 1200 s, end at 1800 s (the oracle's sweeps of both phases are shared with gpu-added).
scenario = dataclasses.replace(
    base,
    name="gpu-added-removed",
    duration_s=1800.0,
    events=(Event(at_s=600.0, action="add_engines", count=3), Event(at_s=1200.0, action="remove_engines", count=3)),
).scaled(0.3 if FAST else 1.0)
ADD, REMOVE = (e.at_s for e in scenario.events)
POLICIES = (
    ["seed-aimd", "aimd", "capacity", "adaptive"]
    if FAST
    else ["seed-aimd", "aimd", "aimd-slowstart", "capacity", "adaptive"]
)
oracle = Oracle(scenario).run()
traces = {p: simulate(scenario, policy_factory=lambda p=p: load_policy(p)) for p in POLICIES}

# %%
fig, axes = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
for p, trace in traces.items():
    axes[0].step(trace.time, trace.clients[0].target, where="post", label=p)
    axes[1].plot(trace.time, trace.throughput(10.0), linewidth=1, label=p)
axes[0].step(oracle.time, oracle.clients[0].target, where="post", color="k", linestyle=":", label="oracle (knee)")
axes[1].plot(oracle.time, oracle.throughput(10.0), color="k", linestyle=":", label="oracle")
for ax in axes:
    for t in (ADD, REMOVE):
        ax.axvline(t, color="0.4", linestyle="--", linewidth=1)
    ax.legend(fontsize=8, ncol=3)
axes[0].set_ylabel("target (requests)")
axes[1].set_ylabel("goodput, 10 s window (items/s)")
axes[1].set_xlabel("simulated time (s)")
axes[0].set_title("GPU set added (×4 capacity), then removed")
fig.tight_layout()
save_figure(fig, "step_response")

# %% [markdown]
# Figures per step: *time to 90 %* is from the event until the 10 s goodput first reaches 90 % of the oracle's
# settled goodput in the new phase (for the removal: the new, lower one); *queued requests* is the mean
# capacity-waiting gauge over the 60 s after the event (the overshoot still being drained).


# %%
def settled_rate(trace, start: float, end: float) -> float:
    t = trace.time
    rate = trace.throughput(10.0)
    mask = (t >= start + 0.5 * (end - start)) & (t < end)
    return float(np.median(rate[mask]))


def step_figures(trace, start: float, end: float, reference: float) -> tuple[float | None, float]:
    t = trace.time
    rate = trace.throughput(10.0)
    hit = np.nonzero((t >= start) & (t < end) & (rate >= 0.9 * reference))[0]
    window = (t >= start) & (t < start + 60.0)
    return (float(t[hit[0]] - start) if len(hit) else None), float(trace.waiting_capacity[window].mean())


rows = []
for p, trace in {**traces, "oracle": oracle}.items():
    row: dict[str, object] = {"policy": p}
    for label, start, end in (("add", ADD, REMOVE), ("remove", REMOVE, scenario.duration_s)):
        reference = settled_rate(oracle, start, end)
        row[f"{label}: time to 90 % (s)"], row[f"{label}: queued (mean, 60 s)"] = step_figures(
            trace, start, end, reference
        )
    rows.append(row)
display(Markdown(markdown_table(rows, list(rows[0]))))

# %% [markdown]
# AIMD grows 25 % a poll, so ×4 takes about six polls; `seed-aimd` grows as fast (its growth is the same rule).
# `adaptive` sees the summed KV block count quadruple on the first poll after the change and scales its target
# by the same factor at once; `capacity` finds the new level by probing and doubling. After the removal every
# engine-aware policy sees capacity-waiting at once and cuts to the served share.
