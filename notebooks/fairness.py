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
# # Multi-client fairness and convergence
#
# Independent fan-out clients (separate processes or machines, no coordinator) share one engine; each runs its
# own controller on the same server-wide gauges. Chiu & Jain (1989): with a shared binary signal, additive
# increase and multiplicative decrease converge to a point that is both *efficient* (the sum at the engine's
# capacity) and *fair* (equal shares); multiplicative increase, or a cut that keeps each client's ratio, does
# not. Three views:
#
# 1. the Chiu–Jain phase plot of two clients' targets (x = client 1, y = client 2) with the fairness line
#    (x = y) and the efficiency line (x + y = the oracle's knee), starting unequal;
# 2. four clients (`multi-client`): Jain's index of their goodputs over time;
# 3. 32 clients on a fleet of four engines (`multi-client-32`).
#
# `FAST = True` shortens the runs (the test suite runs it that way).

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
from model_concurrency.lab.scenario import load_scenario
from model_concurrency.lab.summary import jain_index, summarize
from model_concurrency.policies.registry import load_policy

FAST = fast_mode(FAST)
SIMS = Path("../sims") if Path("../sims").is_dir() else Path("sims")
POLICIES = ["aimd", "adaptive", "capacity"] if FAST else ["aimd", "aimd-slowstart", "queue", "capacity", "adaptive"]

# %% [markdown]
# ## Two clients: the Chiu–Jain phase plot
# Two clients on the `multi-client` engine (256 sequences); client 1 starts with a floor of 4, client 2 with a
# floor of 4 too but 150 s late, so they meet unequal. The trajectory of (target 1, target 2) at each sample.

# %%
four = load_scenario(SIMS / "multi-client.toml")
two = dataclasses.replace(four, name="two-clients", clients=dataclasses.replace(four.clients, count=2)).scaled(
    0.4 if FAST else 1.0
)
knee = Oracle(two).knees()[0][1]


def late_start(policy: str, delay_s: float):
    """A factory whose second policy object ignores its first ``delay_s`` of polls: a client that joins late."""
    made: list[object] = []

    class Late:
        def __init__(self) -> None:
            self.inner = load_policy(policy)

        def next_target(self, target: float, obs):
            return target if obs.time < delay_s else self.inner.next_target(target, obs)

    def factory():
        made.append(Late() if len(made) == 1 else load_policy(policy))
        return made[-1]

    return factory


fig, axes = plt.subplots(1, len(POLICIES), figsize=(4.5 * len(POLICIES), 4.5), squeeze=False)
for ax, policy in zip(axes[0], POLICIES, strict=True):
    trace = simulate(two, policy_factory=late_start(policy, 0.15 * two.duration_s))
    x, y = trace.clients[0].target, trace.clients[1].target
    top = 1.1 * max(float(x.max()), float(y.max()), knee)
    ax.plot([0, top], [0, top], color="tab:green", linestyle="--", linewidth=1, label="fairness (x = y)")
    ax.plot([0, knee], [knee, 0], color="tab:red", linestyle="--", linewidth=1, label=f"efficiency (x + y = {knee})")
    ax.plot(x, y, linewidth=0.8, color="tab:blue", alpha=0.7)
    ax.scatter(x[::10], y[::10], s=4, c=trace.time[::10], cmap="viridis")
    ax.plot(x[0], y[0], "ko", label="start")
    ax.plot(x[-1], y[-1], "k*", markersize=10, label="end")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_aspect("equal")
    ax.set_xlabel("client 1 target")
    ax.set_ylabel("client 2 target")
    ax.set_title(f"{policy}: Jain {jain_index([c.completions[-1] for c in trace.clients]):.3f}")
    ax.legend(fontsize=7, loc="upper right")
fig.tight_layout()
save_figure(fig, "fairness_phase_plot")

# %% [markdown]
# ## Four clients: convergence over time
# Jain's index of the clients' goodputs over a trailing 60 s window, per policy (1 = equal shares).

# %%
sc4 = four.scaled(0.3 if FAST else 1.0)
oracle4 = Oracle(sc4).run()


def rolling_jain(trace, window_s: float = 60.0) -> np.ndarray:
    dt = float(trace.time[1] - trace.time[0])
    lag = max(1, round(window_s / dt))
    done = np.array([c.completions for c in trace.clients])
    rates = done[:, lag:] - done[:, :-lag]
    return np.array([jain_index(rates[:, i]) for i in range(rates.shape[1])])


rows = []
fig, axes = plt.subplots(1, 2, figsize=(14, 4))
for policy in POLICIES:
    trace = simulate(sc4, policy_factory=lambda p=policy: load_policy(p))
    jain = rolling_jain(trace)
    axes[0].plot(trace.time[len(trace.time) - len(jain) :], jain, label=policy)
    axes[1].plot(trace.time, np.sum([c.target for c in trace.clients], axis=0), label=policy)
    rows.append({"clients": 4, "policy": policy, **summarize(trace, oracle4)})
axes[0].set_title("4 clients: Jain index of goodput, 60 s window")
axes[0].set_ylim(0, 1.05)
axes[1].step(
    oracle4.time,
    np.sum([c.target for c in oracle4.clients], axis=0),
    where="post",
    color="k",
    linestyle=":",
    label="oracle (knee)",
)
axes[1].set_title("4 clients: sum of targets")
for ax in axes:
    ax.set_xlabel("simulated time (s)")
    ax.legend(fontsize=8)
fig.tight_layout()
save_figure(fig, "fairness_four_clients")

# %% [markdown]
# ## 32 clients on one fleet
# The hardest case for fairness: many machines share one fleet (2 replicas × 2 engines, 1024 sequences) with no
# coordinator. Left: every client's target over time; right: each client's share of the goodput.

# %%
sc32 = load_scenario(SIMS / "multi-client-32.toml").scaled(0.25 if FAST else 1.0)
oracle32 = Oracle(sc32).run()
policies32 = ["aimd", "adaptive"] if FAST else POLICIES
fig, axes = plt.subplots(len(policies32), 2, figsize=(14, 3.5 * len(policies32)), squeeze=False)
for (left, right), policy in zip(axes, policies32, strict=True):
    trace = simulate(sc32, policy_factory=lambda p=policy: load_policy(p))
    for c in trace.clients:
        left.step(trace.time, c.target, where="post", linewidth=0.6, alpha=0.7)
    left.set_title(f"{policy}: 32 targets (fair share of the knee: {Oracle(sc32).knees()[0][1] / 32:.0f})")
    left.set_xlabel("simulated time (s)")
    shares = np.array([c.completions[-1] for c in trace.clients])
    right.bar(range(32), shares / shares.sum())
    right.axhline(1 / 32, color="k", linestyle=":", label="fair share")
    right.set_title(f"{policy}: goodput share per client (Jain {jain_index(shares):.3f})")
    right.legend(fontsize=8)
    rows.append({"clients": 32, "policy": policy, **summarize(trace, oracle32)})
fig.tight_layout()
save_figure(fig, "fairness_32_clients")

# %%
columns = [
    "clients",
    "policy",
    "goodput_ratio",
    "jain_fairness",
    "saturated_fraction",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
]
display(Markdown(markdown_table(rows, columns)))
