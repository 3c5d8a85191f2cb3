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
# # AIMD ramp behaviour against its parameters
#
# The production AIMD (`aimd`, docs/policies.md) on the `ramp` scenario: a cold start at the floor (4) against an
# idle engine that can run 256 sequences at once. Three knobs, one at a time, the others at their defaults:
#
# * `increase_fraction` (growth per near-full poll, 0.25): how fast the ramp is, and how far each growth step
#   overshoots the engine once it is reached;
# * `decrease_factor` (0.8): how deep a saturated poll cuts;
# * the poll interval (`poll_s`, 12 s): how often the controller can react at all.
#
# Every run is judged against the lab's oracle (a client that holds the knee from t = 0).
# `FAST = True` shortens the scenario (the test suite runs it that way).

# %% tags=["parameters"]
FAST = False

# %%
import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from model_concurrency.lab.compare import markdown_table
from model_concurrency.lab.notebook import fast_mode, save_figure
from model_concurrency.lab.oracle import Oracle
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.lab.summary import summarize
from model_concurrency.policies import AIMD

FAST = fast_mode(FAST)
SIMS = Path("../sims") if Path("../sims").is_dir() else Path("sims")
scenario = load_scenario(SIMS / "ramp.toml").scaled(0.25 if FAST else 1.0)
oracle = Oracle(scenario).run()
print(f"{scenario.name}: {scenario.duration_s:.0f} s simulated, oracle knee {Oracle(scenario).knees()[0][1]}")

# %%
SWEEPS = {
    "increase_fraction": [0.1, 0.25, 0.5],
    "decrease_factor": [0.5, 0.8, 0.9],
    "poll_s": [5.0, 12.0, 30.0],
}


def run(knob: str, value: float) -> tuple[object, dict[str, object]]:
    sc = scenario
    params: dict[str, float] = {}
    if knob == "poll_s":
        sc = dataclasses.replace(scenario, clients=dataclasses.replace(scenario.clients, poll_s=value))
    else:
        params[knob] = value
    trace = simulate(sc, policy_factory=lambda: AIMD(**params))
    return trace, {"knob": knob, "value": value, **summarize(trace, oracle)}


results = {(knob, v): run(knob, v) for knob, values in SWEEPS.items() for v in values}

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
for ax, (knob, values) in zip(axes, SWEEPS.items(), strict=True):
    for v in values:
        trace, _ = results[(knob, v)]
        ax.step(trace.time, trace.clients[0].target, where="post", label=f"{knob} = {v:g}")
    ax.step(oracle.time, oracle.clients[0].target, where="post", color="k", linestyle=":", label="oracle (knee)")
    ax.axhline(256, color="0.6", linewidth=0.8, linestyle="--", label="max_num_seqs")
    ax.set_title(f"AIMD target vs {knob}")
    ax.set_xlabel("simulated time (s)")
    ax.legend(fontsize=8)
axes[0].set_ylabel("target (requests)")
fig.tight_layout()
save_figure(fig, "aimd_ramp_targets")

# %% [markdown]
# The ramp is multiplicative (+25 % a poll: 22 polls from 4 to 512), so the time to reach the engine scales with
# the poll interval and with `1 / log(1 + increase_fraction)`. Once there, each step above 256 queues requests
# until the next poll; the depth of the cut decides how long the target then sits below the knee.

# %%
rows = [summary for _, summary in results.values()]
columns = [
    "knob",
    "value",
    "goodput_ratio",
    "time_to_90pct_s",
    "saturated_fraction",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
    "oscillation",
]
display(Markdown(markdown_table(rows, columns)))

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3.5))
for ax, key, label in zip(
    axes,
    ["goodput_ratio", "queue_time_p99_s", "saturated_fraction"],
    ["goodput / oracle", "queue time p99 (s)", "saturated fraction"],
    strict=True,
):
    for knob, values in SWEEPS.items():
        xs = range(len(values))
        ax.plot(xs, [results[(knob, v)][1][key] for v in values], marker="o", label=knob)
    ax.set_xticks(range(3), ["low", "default", "high"])
    ax.set_title(label)
    ax.legend(fontsize=8)
if oracle.queue_times.size:
    axes[1].axhline(
        2 * float(summarize(oracle, oracle)["queue_time_p99_s"]), color="k", linestyle=":", label="2 × oracle"
    )
    axes[1].legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "aimd_ramp_tradeoffs")

# %% [markdown]
# Read with the table: a larger `increase_fraction` reaches the engine sooner (more goodput on a short run) but
# overshoots further every cycle (more queueing); a gentler cut (`decrease_factor` 0.9) keeps the target nearer
# the knee; a longer poll interval slows everything and leaves each overshoot in place longer.
