"""The token budget: how many tokens our weighted calls may hold at once, from the engine's own KV cache.

vLLM admits a request only while its KV blocks fit, so the second limit a gate can mirror is tokens. The
engine states its pool outright: ``vllm:cache_config_info`` gives ``num_gpu_blocks × block_size`` per engine,
summed over engines (``Observation.kv_tokens``, ``C``). Two gauges calibrate it on every poll:

* ``c``, the KV tokens one unit of weight actually occupies: ``u × C × s / U`` with ``u`` the KV usage, ``U``
  our weighted tokens in flight and ``s`` our share of the engine's load. A weight is prompt plus ``max_tokens``,
  an upper bound of what the request ever holds (the answer is not written yet, or ends sooner), so ``c <= 1``
  and the budget may grow past the pool by ``1 / c``; other clients' load on a shared engine raises ``c``.
* the trim: ``B = U + s × (kv_high − u) × C / c``. Below ``kv_high`` that is the room left, in our units; above,
  it cuts in proportion to the overshoot. Alone on the engine it reduces to ``U × kv_high / u``, the Prime-RL
  rollout controller's escape from the KV-thrash spiral (in flight × target usage / usage).

Both of these scale what each client holds, so clients sharing a cache would keep whatever split they reached
(multiplicative steps both ways never converge; Chiu & Jain). With ``steps`` on and others on the engine, the
budget moves as the request count does: over ``kv_high`` it falls to at most ``decrease`` × what we hold, the
larger client giving back more; from there (usage at or over ``decrease × kv_high``) up to ``kv_high`` it grows
by one call of ours (our mean weight in flight), the same step for every client; further below, it fills the
room as above, or by that one call if more. A shared cache then splits evenly, as the request count does on a
shared engine. Alone (our share of the engine's load at least ``alone_share``) there is nobody to even out with,
and the proportional trim keeps the cache fullest.

The budget never exceeds ``overcommit × s × C`` but by that one call: with weights that really are upper bounds
and ``overcommit`` 1, what we admit fits the cache even if every request reached its longest, so the engine never
preempts on our account. It is never below the largest single request the pool holds (``C / engines`` is not
known per engine, so ``min_fraction × C``): a request larger than the budget still runs, alone (the limiter's
rule).

Without the pool's size (an older vLLM, the Prometheus API source) there is no budget: None, not enforced.
A pure helper a policy owns (``Adaptive`` sets it next to its request target); it keeps no state.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from model_concurrency.observation import Observation
from model_concurrency.policies._common import own_share
from model_concurrency.policies.base import Target

__all__ = ["KV_HIGH", "TokenBudget", "TokenSide"]

#: The KV usage the budget steers to, and above which a cache counts as full.
KV_HIGH = 0.92


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """The token budget rule (module docstring).

    Parameters:
        kv_high: the KV usage the budget steers to (default :data:`KV_HIGH`, 0.92), in (0, 1].
        overcommit: the budget's ceiling as a multiple of our share of the pool (default 1.0, > 0): above 1 trusts
            the calibration to admit more weight than the pool holds (weights that overstate, like a generous
            ``max_tokens``), at the risk of preemptions when requests do reach their length together.
        min_fraction: the budget's floor as a fraction of the pool (default 0.05, in (0, 1]).
        decrease: with ``steps``, over ``kv_high`` the budget falls to at most this share of what we hold (the
            request rule's ``decrease_factor``), in (0, 1).
        steps: one call up at or under ``kv_high``, ``decrease`` down over it (module docstring); ``adaptive``
            turns them on (its rule ``token-steps``), ``adaptive-core`` keeps the proportional rule.
        alone_share: our share of the engine's load from which we are alone on it and take no steps (the
            request rule's ``jump_share``), in [0, 1].
    """

    kv_high: float = KV_HIGH
    overcommit: float = 1.0
    min_fraction: float = 0.05
    decrease: float = 0.9
    steps: bool = False
    alone_share: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.kv_high <= 1:
            raise ValueError(f"kv_high must be in (0, 1], got {self.kv_high}")
        if not (self.overcommit > 0 and math.isfinite(self.overcommit)):
            raise ValueError(f"overcommit must be a finite number > 0, got {self.overcommit}")
        if not 0 < self.min_fraction <= 1:
            raise ValueError(f"min_fraction must be in (0, 1], got {self.min_fraction}")
        if not 0 < self.decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {self.decrease}")
        if not 0 <= self.alone_share <= 1:
            raise ValueError(f"alone_share must be in [0, 1], got {self.alone_share}")

    def budget(self, obs: Observation) -> float | None:
        """Tokens our weighted calls may hold after this poll; None without the pool's size (not enforced)."""
        pool = obs.kv_tokens
        if not pool or pool <= 0:
            return None
        share = own_share(obs) if obs.inflight > 0 else 1.0
        ceiling = max(self.overcommit * share * pool, self.min_fraction * pool)
        held, usage = obs.inflight_tokens or 0, obs.kv_cache_usage
        if held <= 0 or usage is None or not 0 < usage <= 1:
            return ceiling  # nothing weighted in flight to calibrate by: the pool itself
        occupancy = max(usage * pool * share / held, 1e-3)  # above 1: weights understate, or neighbours
        budget = held + share * (self.kv_high - usage) * pool / occupancy
        if self.steps and obs.inflight > 0 and share < self.alone_share:
            if usage > self.kv_high:
                budget = min(budget, self.decrease * held)
            else:
                step = held + held / obs.inflight  # one more call of ours, at our mean weight
                # Where a cut lands, the same step for every client, not the room in proportion to what each holds.
                budget = step if usage >= self.decrease * self.kv_high else max(budget, step)
                ceiling = max(ceiling, step)
        return min(max(budget, self.min_fraction * pool), ceiling)


@dataclass(slots=True)
class TokenSide:
    """The token side of a request-count policy: the budget it answers, and the view its count rule reads.

    While a budget binds our weighted calls, the KV cache is the budget's to watch, so its signals leave the
    count rule's view: KV usage is held just under ``kv_high`` (the rule's estimates still see a nearly full
    cache, its saturation test never fires) and preemptions are the budget's trim. Capacity-waiting leaves it
    too while our tokens in flight reach ``near_full`` of the budget and the engine runs fewer sequences than
    it has ever run: the engine then waits for KV blocks the budget handed out, not for sequence slots, and a cut
    of the request count only starves the short requests once the long ones finish (the lab's ``heavy-tail``:
    the count collapsed on every burst of long prompts). At the most
    sequences ever seen running, waiting is the sequence limit's, and the count rule cuts as it always did.
    Without weighted calls in flight, or without a budget, the view is the observation itself."""

    rule: TokenBudget
    near_full: float = 0.8
    budget: float | None = None  # the budget answered last
    running_max: float = 0.0  # the most sequences the engine has run (forgotten when its KV pool changes)
    pool: int | None = None

    def view(self, obs: Observation) -> Observation:
        if obs.kv_tokens != self.pool:
            self.pool, self.running_max = obs.kv_tokens, 0.0
        running_max, self.running_max = self.running_max, max(self.running_max, obs.running)
        held, budget = obs.inflight_tokens or 0, self.budget
        if budget is None or held <= 0:
            return obs
        kv = obs.kv_cache_usage
        changes: dict[str, object] = {"preemptions": 0.0}
        if kv is not None:
            changes["kv_cache_usage"] = min(kv, self.rule.kv_high * 0.999)
        if held >= self.near_full * budget and obs.running < running_max - 0.5:
            changes["waiting_capacity"] = 0.0
        return dataclasses.replace(obs, **changes)  # type: ignore[arg-type]

    def answer(self, requests: float, obs: Observation) -> Target:
        """The count rule's answer with this poll's budget riding along."""
        self.budget = self.rule.budget(obs)
        return Target(requests, self.budget)
