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
# # The default policy's ramp, rule by rule
#
# The default policy, `adaptive` (`policies/adaptive.py`, its first ramp in `policies/first_ramp.py`;
# docs/policies.md, "The default"), on two bundled scenarios:
#
# * `ramp`: a cold start at the floor (4) against an idle engine that can run 256 sequences at once;
# * `gpu-added`: one engine of 128 sequences, three more added at 10 minutes (capacity ×4).
#
# Each run is drawn against the lab's oracle, a client told the capacity at every moment that holds the knee of
# each phase (`lab/oracle.py`), with the rule that answered every poll. `ramp` runs twice: as bundled, and with the
# engine's sequence limit stated to the clients (`[clients] stated_limits = true`, which tells them
# `max_num_seqs`). A last run switches the KV jump off to show what it buys.
#
# `FAST = True` shortens every scenario to a quarter of its length (the test suite runs it that way).

# %% tags=["parameters"]
FAST = False

# %%
import dataclasses
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from model_concurrency.lab.compare import markdown_table
from model_concurrency.lab.notebook import fast_mode, save_figure
from model_concurrency.lab.oracle import Oracle
from model_concurrency.lab.plot import change_labels, draw_run, figure_legend, legend_entries
from model_concurrency.lab.run import simulate
from model_concurrency.lab.scenario import Scenario, load_scenario
from model_concurrency.lab.summary import summarize
from model_concurrency.observation import Observation
from model_concurrency.policies import Adaptive

FAST = fast_mode(FAST)
SCALE = 0.25 if FAST else 1.0
SIMS = Path("../sims") if Path("../sims").is_dir() else Path("sims")


def stated(scenario: Scenario) -> Scenario:
    """The same scenario with the engines' limits stated to the clients, as an operator states them."""
    clients = dataclasses.replace(scenario.clients, stated_limits=True)
    return dataclasses.replace(scenario, name=f"{scenario.name} (stated)", clients=clients)


ramp = load_scenario(SIMS / "ramp.toml").scaled(SCALE)
SCENARIOS = {
    "ramp": ramp,
    "ramp, max_num_seqs stated": stated(ramp),
    "gpu-added": load_scenario(SIMS / "gpu-added.toml").scaled(SCALE),
}
for name, scenario in SCENARIOS.items():
    knees = ", ".join(f"{k} from {t:.0f} s" for t, k in Oracle(scenario).knees())
    print(f"{name}: {scenario.duration_s:.0f} s simulated, oracle knee {knees}")

# %% [markdown]
# ## Which rule answered each poll
#
# The lab's trace keeps the target over time and the poll times, not the reason for each step (the controller's
# decision names the policy, not the branch inside it). `Narrated` below is `Adaptive` unchanged, except that it
# writes down which of its rules produced each answer. The rules, in the order a poll tries them:
#
# * **rescale**: the summed KV block count changed by more than 10 %, so engines were added or lost; the target
#   and everything learnt scale by the same factor at once.
# * **cut (engine)**: requests wait for capacity. The target is cut to 0.9 × the served share (our in-flight
#   times the share of the engine's load it runs), and that share is remembered as the level `W` the engine ran
#   out at. **cut (inferred)**: nothing waits at this instant, but `running` is back at the most the engine ran
#   while saturated; the engine is full, and the cut is the same.
# * **hold: queue being admitted**: on the first ramp, a queue no larger than what `running` took in since the
#   previous poll, or the KV jump's step still being admitted: the engine is taking the step in, so the target
#   holds one poll instead of cutting.
# * **hold: application-limited**: our peak in flight did not reach 0.8 × the target, so growing would teach
#   nothing; the target holds.
# * **first ramp: slow start**: nothing is learnt yet. The target grows ×2 per round trip of our calls that the
#   poll's interval held, at most ×8 a poll and never past the bound the KV cache puts on our in-flight.
# * **first ramp: KV jump**: alone on the engine and with its KV figures, the ramp also jumps half of the way to
#   the bound the KV cache (and a stated sequence limit) puts on our in-flight, at most ×8 a poll. While on this
#   path the policy asks the controller for polls six times as often (every 2 s rather than 12 s). The poll's
#   answer is the larger of the jump and slow start.
# * **first ramp ends**: the jump ran a poll without a queue (its level becomes `W`), or the engine stopped taking
#   our growth (`running` rose by less than half of it). Either way the ramp ends without a cut.
# * **slow start to the goal**: far below `W` (under 0.85 × it), ×2 a poll back to 0.9 × `W`.
# * **additive increase**: below `W`, +1 a poll: the same absolute step for every client, so shares converge.
# * **probe**: at or above `W`, a step that doubles each clean poll alone on the engine (1, 2, 4, ...).
# * **stated limit**: with `max_num_seqs` stated, growth stops at our share of the engines' sequence slots (beside
#   peers after the first ramp, only the additive step goes past it).


# %%
class Narrated(Adaptive):
    """``Adaptive``, noting for each poll ``(time, target before, answer, rule)`` in ``decisions``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.decisions: list[tuple[float, float, float, str]] = []
        self.fired: str | None = None
        self.grown: float | None = None

    def _requests(self, target: float, obs: Observation) -> float:
        self.fired, self.grown = None, None
        answer = float(super()._requests(target, obs))
        rule = self.fired or ("hold: application-limited" if answer == target else "rescale")
        if self.grown is not None and answer < self.grown - 1e-9:
            rule = "stated limit"
        self.decisions.append((obs.time, target, answer, rule))
        return answer

    def _rescale(self, obs: Observation) -> float | None:
        factor = super()._rescale(obs)
        if factor is not None:
            self.fired = "rescale"
        return factor

    def _on_queue(
        self, target: float, obs: Observation, capacity: float | None, risen: float | None, why: str
    ) -> float:
        answer = super()._on_queue(target, obs, capacity, risen, why)
        self.fired = "hold: queue being admitted" if answer >= target else f"cut ({why})"
        return answer

    def _grow(self, target: float, obs: Observation) -> float:
        ramping, jump = self.ramping, self._jump(target, obs)
        answer = super()._grow(target, obs)
        self.grown = answer
        if ramping:
            if not self.ramping:
                self.fired = "first ramp ends"
            elif jump is not None and answer > target and abs(answer - jump) < 1e-6:
                self.fired = "first ramp: KV jump"
            else:
                self.fired = "first ramp: slow start"
        elif self.probes > 0:
            self.fired = "probe"
        elif abs(answer - target - self.increase_step) < 1e-9:
            self.fired = "additive increase"
        else:
            self.fired = "slow start to the goal"
        return answer

    def _jump(self, target: float, obs: Observation) -> float | None:
        """Where the KV jump takes the target this poll, capped as the first ramp caps it; None without the KV
        figures or with the jump switched off (the first ramp then grows by slow start alone)."""
        estimate = self.kv_estimate(obs)
        if estimate is None or not self.on("kv-jump"):
            return None
        bound = min(estimate.bound, self.stated_bound(obs))
        step = min(target + self.jump_fraction * (bound - target), self.jump_max_factor * target)
        return min(step, max(target, bound))


def run(scenario: Scenario, **params: object) -> tuple[object, list[tuple[float, float, float, str]]]:
    """One run of the default (``params`` passed to it), with the decisions of its single client."""
    policies: list[Narrated] = []

    def factory() -> Narrated:
        policies.append(Narrated(**params))  # type: ignore[arg-type]
        return policies[-1]

    trace = simulate(scenario, policy_factory=factory)
    return trace, policies[0].decisions


oracles = {name: Oracle(sc).run() for name, sc in SCENARIOS.items()}
runs = {name: run(sc) for name, sc in SCENARIOS.items()}

# %%
RULE_STYLE = {
    "first ramp: slow start": ("tab:blue", "^"),
    "first ramp: KV jump": ("tab:purple", "^"),
    "hold: queue being admitted": ("tab:orange", "s"),
    "first ramp ends": ("tab:cyan", "D"),
    "probe": ("tab:olive", "P"),
    "additive increase": ("0.55", "."),
    "slow start to the goal": ("tab:pink", ">"),
    "cut (engine)": ("tab:red", "v"),
    "cut (inferred)": ("darkred", "v"),
    "hold: application-limited": ("0.3", "x"),
    "rescale": ("tab:green", "*"),
    "stated limit": ("tab:brown", "o"),
}
FIRST_RAMP_S = 60.0


def draw_rules(ax: plt.Axes, name: str, xmax: float) -> None:
    trace, decisions = runs[name]
    scenario, oracle = SCENARIOS[name], oracles[name]
    c = scenario.clients
    ax.step(trace.time, trace.clients[0].target, where="post", color="tab:blue", alpha=0.35, linewidth=3,
            label="target")  # fmt: skip
    ax.plot(trace.time, trace.clients[0].inflight, color="tab:orange", linewidth=0.8, label="in-flight")
    ax.step(oracle.time, oracle.clients[0].target, where="post", color="k", linestyle=":", label="oracle (knee)")
    if c.stated_limits:
        ax.axhline(scenario.fleet.engine["max_num_seqs"], color="tab:brown", linestyle="--", linewidth=0.8,
                   label="stated max_num_seqs")  # fmt: skip
    for t, label in change_labels(scenario):
        if t > xmax:
            continue
        ax.axvline(t, color="0.45", linestyle="--", linewidth=1)
        ax.annotate(f" {label}", (t, 1.0), xycoords=("data", "axes fraction"), va="top", fontsize=8)
    for rule, (colour, marker) in RULE_STYLE.items():
        points = [(t, np.clip(a, c.floor, c.ceiling)) for t, _, a, r in decisions if r == rule and t <= xmax]
        if points:
            ts, ys = zip(*points, strict=True)
            ax.scatter(ts, ys, color=colour, marker=marker, s=36, zorder=5, label=rule)
    ax.set_xlim(0, xmax)
    ax.set_xlabel("simulated time (s)")


fig, axes = plt.subplots(len(SCENARIOS), 2, figsize=(14, 3.4 * len(SCENARIOS)))
for row, name in zip(axes, SCENARIOS, strict=True):
    draw_rules(row[0], name, FIRST_RAMP_S)
    draw_rules(row[1], name, SCENARIOS[name].duration_s)
    row[0].set_title(f"{name}: the first {FIRST_RAMP_S:.0f} s")
    row[1].set_title(f"{name}: the whole run")
    row[0].set_ylabel("requests")
figure_legend(fig, *legend_entries(fig), ncol=6)
save_figure(fig, "default_ramp_rules")

# %% [markdown]
# On `ramp`, two KV jumps take the target from 4 to 256 within 4 s of fast polls (×8 each, the most one poll may
# grow; slow start alone would have reached 64). The engine takes the step in over the next poll (held), the next
# clean poll ends the ramp, and the first probe above it meets a queue: the cut lands just under the oracle's knee.
# From there the additive step climbs back, a probe finds the wall again, and the cycle repeats every few minutes.
#
# With `max_num_seqs` stated, the jump's bound is the stated limit rather than the KV cache's (which has room for
# far more than 256 of these requests): the second jump goes halfway from 32 to 256, to 144, and the ramp ends
# there. Probes that double each clean poll climb the rest, and growth stops at the limit: the target settles at
# 256 and no poll cuts.
#
# On `gpu-added`, the two jumps overshoot the 128-sequence engine and the first queue cuts the target to just under
# the knee. When the three engines arrive, the KV block count quadruples and the target is rescaled ×4 in one
# poll; a probe then finds the new wall.

# %%
rows = []
for name, (_, decisions) in runs.items():
    first_cut = next((i for i, d in enumerate(decisions) if d[3].startswith("cut")), len(decisions))
    for t, before, answer, rule in decisions[: min(first_cut + 1, 8)]:
        rows.append({"scenario": name, "time_s": round(t, 1), "target": before, "answer": answer, "rule": rule})
display(Markdown("**The first polls of each run, to the first cut (at most 8)**\n\n"
                 + markdown_table(rows, ["scenario", "time_s", "target", "answer", "rule"])))  # fmt: skip

counts = {name: Counter(r for *_, r in decisions) for name, (_, decisions) in runs.items()}
rules = [r for r in RULE_STYLE if any(r in c for c in counts.values())]
table = [{"rule": r, **{name: counts[name].get(r, 0) for name in runs}} for r in rules]
display(Markdown("**Polls answered by each rule**\n\n" + markdown_table(table, ["rule", *runs])))

# %% [markdown]
# The lab's usual figure of each run: concurrency against the engine's queue (top), goodput against the oracle's
# with the KV cache's use (bottom).

# %%
fig, axes = plt.subplots(2, len(SCENARIOS), figsize=(5.5 * len(SCENARIOS), 6.5), sharex="col")
for col, name in enumerate(SCENARIOS):
    draw_run(axes[:, col], runs[name][0], oracles[name], title=name, legend=False,
             changes=change_labels(SCENARIOS[name]))  # fmt: skip
figure_legend(fig, *legend_entries(fig), ncol=5)
save_figure(fig, "default_ramp_runs")

# %%
COLUMNS = [
    "run",
    "goodput_ratio",
    "time_to_90pct_s",
    "oracle_time_to_90pct_s",
    "saturated_fraction",
    "queue_time_p99_s",
    "oracle_queue_time_p99_s",
    "oscillation",
]
summaries = {name: summarize(runs[name][0], oracles[name]) for name in SCENARIOS}
display(Markdown(markdown_table([{"run": name, **s} for name, s in summaries.items()], COLUMNS)))

# %% [markdown]
# ## What the KV jump buys
#
# The same `ramp` with the KV jump switched off (`Adaptive(without=("kv-jump",))`; the rules that can be switched
# off are `adaptive.RULES`). The first ramp is then slow start alone, and without the jump the policy does not ask
# for the fast polls: each step waits a full 12-second poll, which holds enough round trips of our calls for ×8,
# and the third step overshoots to the client's ceiling (512) before the first queue cuts it back.

# %%
without_jump = run(SCENARIOS["ramp"], without=("kv-jump",))
summaries["ramp, without kv-jump"] = summarize(without_jump[0], oracles["ramp"])

window = 120.0
fig, (ax, queue) = plt.subplots(1, 2, figsize=(14, 3.8))
for label, (trace, _), colour in (("default", runs["ramp"], "tab:blue"), ("without kv-jump", without_jump, "tab:red")):
    ax.step(trace.time, trace.clients[0].target, where="post", color=colour, linewidth=1.8, label=f"target, {label}")
    queue.fill_between(trace.time, 0, trace.waiting_capacity, step="post", color=colour, alpha=0.4, label=label)
ax.step(oracles["ramp"].time, oracles["ramp"].clients[0].target, where="post", color="k", linestyle=":",
        label="oracle (knee)")  # fmt: skip
ax.set_title("ramp: target, with and without the KV jump")
ax.set_ylabel("requests")
queue.set_title("requests waiting for capacity (engine queue)")
for a in (ax, queue):
    a.set_xlim(0, window)
    a.set_xlabel("simulated time (s)")
    a.legend(fontsize=8, loc="upper right")
fig.tight_layout()
save_figure(fig, "default_ramp_kv_jump")

display(Markdown(markdown_table([{"run": n, **summaries[n]} for n in ("ramp", "ramp, without kv-jump")], COLUMNS)))

# %% [markdown]
# With the jump, the first ramp runs on 2-second polls: it reaches the engine within seconds, and the first queue
# is a probe's single step above the wall. Without it, reaching the engine takes three full polls, the last one
# overshoots to twice the engine's sequences, and every request above them waits until the next poll's cut: a
# later time to 90 % of the oracle's goodput and a queue-time p99 many times the default's.
