"""The rules of a policy, as the ablation switches them off (``model-concurrency ablate``, lab/ablation.py).

A rule is one mechanism: a switch, or the group of parameters that serves it. Each names the parameters it owns
and the overrides that switch it off, so an ablation can take it away without touching anything else, and a
default can be counted: its parameters are the core's plus those of the rules it keeps. Pure data, beside the
policies it describes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ADAPTIVE_RULES", "RULES", "Rule", "switch_rule"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One mechanism of a policy: the parameters it owns, and the overrides that switch it off."""

    name: str
    params: tuple[str, ...]
    off: dict[str, Any]
    what: str


def _rule(name: str, params: str, what: str, **off: Any) -> Rule:
    return Rule(name, tuple(params.split()), off, what)


#: The rules of the ``adaptive`` policy. The numbers no variant can do without (the cut, the step, the slow
#: start's factor, what "alone on the engine" means, the capacity samples' window) are not rules: they are the
#: policy.
ADAPTIVE_RULES = (
    _rule("app-limited", "near_full", "grow only when the interval's peak in flight filled the window", near_full=0.0),
    _rule("kv-cap", "kv_high", "KV usage at kv_high is saturated; growth is capped before it", kv_high=1.0),
    _rule(
        "preemption-cut", "cut_on_preemption", "a preemption since the last poll is saturated", cut_on_preemption=False
    ),
    _rule(
        "inferred-saturation",
        "full_is_saturated",
        "running back at the sampled capacity is saturated",
        full_is_saturated=False,
    ),
    _rule(
        "rescale", "rescale_threshold", "a KV block count change rescales target and memory", rescale_threshold=math.inf
    ),
    _rule("idle-reset", "idle_s", "a long idle forgets what was learnt", idle_s=math.inf),
    _rule(
        "startup-exit", "startup_exit", "the first ramp ends when doubling stops raising completions", startup_exit=1.0
    ),
    _rule(
        "engine-full-exit",
        "engine_full_exit",
        "the first ramp ends when the engine stops taking our growth",
        engine_full_exit=False,
    ),
    _rule("kv-jump", "kv_jump jump_fraction", "alone, the first ramp jumps toward the KV cache's bound", kv_jump=False),
    _rule(
        "turnover-ramp",
        "turnover_ramp",
        "alone, the first ramp grows per round trip the poll held",
        turnover_ramp=False,
    ),
    _rule(
        "admission-hold",
        "admission_hold",
        "a queue the engine is still taking in ends the ramp without a cut",
        admission_hold=False,
    ),
    _rule(
        "restore", "restore_fraction", "far below the goal, return to a fraction of it at once", restore_fraction=0.0
    ),
    _rule(
        "slow-start-band",
        "slow_start_below",
        "far below the goal, slow start instead of the additive step",
        slow_start_below=0.0,
    ),
    _rule("probe", "probe_growth", "above the goal, probe steps double each clean poll", probe_growth=1.0),
    _rule(
        "probe-headroom",
        "probe_headroom",
        "a probe on a full engine is capped by our share of its free slots",
        probe_headroom=False,
    ),
    _rule(
        "fleet-step",
        "step_exponent full_step_running fleet_decrease_factor",
        "on a shared engine over 1,024 running, a smaller step and cut",
        step_exponent=0.0,
        fleet_decrease_factor=0.9,
    ),
    _rule(
        "one-step",
        "one_step_pipeline one_step_queue",
        "one-step (pooling) engines: pipelined batch and knee",
        one_step_pipeline=False,
    ),
    _rule("jump-max", "jump_max_factor", "one jump multiplies the target by at most this", jump_max_factor=1e9),
    _rule("felt-queue", "felt_queue", "cut on a queue only where it is a wall", felt_queue=False),
    _rule("shared-restore", "shared_restore", "beside peers, restore after our own cuts too", shared_restore=False),
    _rule("shared-fast-ramp", "shared_fast_ramp", "beside peers, fast first-ramp polls", shared_fast_ramp=False),
    _rule("jump-geometric", "jump_geometric jump_overshoot", "the KV jump bisects in log space", jump_geometric=False),
    _rule("accelerate-shared", "accelerate_shared", "beside peers, probes accelerate too", accelerate_shared=False),
)

#: Rule tables by the policy class's name; any other policy is ablated by its on/off switches (``switch_rule``).
RULES: dict[str, tuple[Rule, ...]] = {"Adaptive": ADAPTIVE_RULES}


def switch_rule(name: str) -> Rule:
    """A policy without a table: each switch that is on is a rule, switched off by setting it False."""
    return Rule(name, (name,), {name: False}, f"the switch {name}")
