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

The budget never exceeds ``overcommit × s × C``: with weights that really are upper bounds and ``overcommit`` 1,
what we admit fits the cache even if every request reached its longest, so the engine never preempts on our
account. It is never below the largest single request the pool holds (``C / engines`` is not known per engine,
so ``min_fraction × C``): a request larger than the budget still runs, alone (the limiter's rule).

Without the pool's size (an older vLLM, the Prometheus API source) there is no budget: None, not enforced.
A pure helper a policy owns (``Adaptive`` sets it next to its request target); it keeps no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model_concurrency.observation import Observation
from model_concurrency.policies._common import own_share

__all__ = ["TokenBudget"]


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """The token budget rule (module docstring).

    Parameters:
        kv_high: the KV usage the budget steers to (default 0.92, as ``Adaptive.kv_high``), in (0, 1].
        overcommit: the budget's ceiling as a multiple of our share of the pool (default 1.0, > 0): above 1 trusts
            the calibration to admit more weight than the pool holds (weights that overstate, like a generous
            ``max_tokens``), at the risk of preemptions when requests do reach their length together.
        min_fraction: the budget's floor as a fraction of the pool (default 0.05, in (0, 1]).
    """

    kv_high: float = 0.92
    overcommit: float = 1.0
    min_fraction: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.kv_high <= 1:
            raise ValueError(f"kv_high must be in (0, 1], got {self.kv_high}")
        if not (self.overcommit > 0 and math.isfinite(self.overcommit)):
            raise ValueError(f"overcommit must be a finite number > 0, got {self.overcommit}")
        if not 0 < self.min_fraction <= 1:
            raise ValueError(f"min_fraction must be in (0, 1], got {self.min_fraction}")

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
        occupancy = min(1.0, max(usage * pool * share / held, 1e-3))
        budget = held + share * (self.kv_high - usage) * pool / occupancy
        return min(max(budget, self.min_fraction * pool), ceiling)
