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


def _without(name: str, params: str, what: str) -> Rule:
    """A rule with no number to switch it off by: ``without`` names it."""
    return Rule(name, tuple(params.split()), {"without": [name]}, what)


#: The rules of the ``adaptive`` policy. The numbers no variant can do without (the cut, the step, the slow start's
#: factor, what "alone on the engine" means) are not rules: they are the policy.
ADAPTIVE_RULES = (
    _rule("app-limited", "near_full", "grow only when the interval's peak in flight filled the window", near_full=0.0),
    _rule(
        "rescale", "rescale_threshold", "a KV block count change rescales target and memory", rescale_threshold=math.inf
    ),
    _rule(
        "startup-exit",
        "startup_exit",
        "the first ramp ends when a doubling stops raising completions",
        startup_exit=1.0,
    ),
    _without("engine-full-exit", "", "the first ramp ends when the engine stops taking our growth"),
    _without("kv-jump", "jump_fraction", "alone, the first ramp jumps toward the KV cache's bound"),
    _rule("jump-max", "jump_max_factor", "one poll multiplies the target by at most this", jump_max_factor=1e9),
    _without("turnover-ramp", "", "alone, the first ramp grows per round trip the poll held"),
    _without("admission-hold", "", "a queue the engine is still taking in ends the ramp without a cut"),
    _without("inferred-saturation", "", "running back at the sampled capacity is saturated, queue or not"),
    _without("capacity-samples", "window_polls window_s", "the most the engine ran while saturated bounds the goal"),
    _without("prefill-waits", "", "a small queue below the sampled capacity, with KV room, is no wall"),
    _rule(
        "slow-start-band",
        "slow_start_below",
        "far below the goal, slow start instead of the additive step",
        slow_start_below=0.0,
    ),
    _without("probe", "", "above the goal, probe steps double each clean poll"),
    _without("one-step", "", "one-step (pooling) engines: a pipelined batch, their knee, growth once calls return"),
    _without("stated-limits", "", "a stated sequence limit bounds growth; a queue below it is no wall"),
    _without("token-steps", "", "the token budget climbs by one call and cuts by decrease_factor over kv_high"),
)

#: Rule tables by the policy class's name; any other policy is ablated by its on/off switches (``switch_rule``).
RULES: dict[str, tuple[Rule, ...]] = {"Adaptive": ADAPTIVE_RULES}


def switch_rule(name: str) -> Rule:
    """A policy without a table: each switch that is on is a rule, switched off by setting it False."""
    return Rule(name, (name,), {name: False}, f"the switch {name}")
