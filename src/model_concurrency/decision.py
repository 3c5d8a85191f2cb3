"""Every decision carries its reason: the new target, the rule that fired, and the figures behind it.

The controller core (:mod:`model_concurrency.controller`) makes one :class:`Decision` per poll (and one per
429/503 cut between polls). That one record feeds everything a user or a test reads about why the target is where
it is: the ``-v`` log line, ``get_utilization(...)["limited_by"]`` and ``["last_decision"]``, the exported
``model_concurrency_limited_by{model,reason}`` gauge, and the lab's traces.

``limited_by`` names what holds the target back, one of :data:`LIMITS`, or None while it grows freely:

* ``ceiling``: the policy asked for at least ``MODEL_MAX_CONCURRENCY``;
* ``guard``: the growth guard capped growth that bought no completions, or the target is held through a metrics
  outage (the grace polls, then the guard's hand-over);
* ``saturation``: the policy held or cut because the engine is full (requests waiting for capacity, preemptions,
  or the policy's own estimate of the knee: latency, queue time);
* ``stated-limit``: the policy held or cut while the engines ran every sequence slot their operator or page
  states (``Observation.limits.max_num_seqs``) with nothing waiting for capacity: more of our calls could only
  queue;
* ``app-limited``: this process did not fill the window it had (peak in flight below 0.8 × the target), so
  there was nothing to learn by growing;
* ``throttled``: calls came back 429/503, and the target was cut to, or capped at, what the server allowed;
* ``floor``: the fail-safe: signals lost and the client's own calls in trouble (or the hand-over off);
* ``metrics-never-read``: the metrics page has not answered a single poll since the model's runtime started, so
  no policy has ever decided and the target stays at the floor, through the grace polls and after them (once the
  page has answered before, the same polls read ``guard`` or ``floor``: a last good target exists to hold, and
  the client's calls have a latency baseline to be judged by); :func:`outage_limit` tells them apart;
* ``off``: ``KG_ADAPTIVE_CONCURRENCY`` is off, so nothing is polled and the limit is pinned at the floor; no
  decision is made, so this is the static view's reason (:func:`static_limit`), never a :class:`Decision`'s.

:data:`MEANINGS` holds the same, one sentence each, for what a command prints beside the reason.

The classification reads only the Observation and the figures of the step; it never changes a decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_concurrency.observation import Observation

__all__ = [
    "LIMITS",
    "MEANINGS",
    "NEVER_READ",
    "OFF",
    "STATED",
    "Decision",
    "describe_observation",
    "explain_limit",
    "limited_by_policy",
    "outage_limit",
    "static_limit",
]

NEVER_READ = "metrics-never-read"
OFF = "off"
# New reasons go at the end: the exported gauge carries one label per reason, and dashboards key on them.
STATED = "stated-limit"
LIMITS = ("ceiling", "guard", "saturation", "app-limited", "throttled", "floor", NEVER_READ, OFF, STATED)
MEANINGS: dict[str, str] = {
    "ceiling": "the policy asked for at least the ceiling (MODEL_MAX_CONCURRENCY)",
    "guard": "the growth guard capped growth that bought no completions, or the target is held through a "
    "metrics outage",
    "saturation": "the engine is full (requests waiting for capacity, preemptions, or the policy's estimate of "
    "the knee)",
    "app-limited": "this process did not fill the window it had",
    "throttled": "calls came back 429/503; the target is cut to, or capped at, what the server allowed",
    "floor": "the fail-safe: metrics lost and this process's own calls in trouble",
    NEVER_READ: "the metrics page has never answered a poll: the target stays at the floor until it does",
    OFF: "adaptive control is off (KG_ADAPTIVE_CONCURRENCY): pinned at the floor",
    STATED: "the engines run every sequence slot they state (max_num_seqs): more calls could only queue",
}
# A window used below this share of the target at its fullest moment was not filled (policies/_common.app_limited).
NEAR_FULL = 0.8


@dataclass(frozen=True, slots=True)
class Decision:
    """One step of the controller: ``previous`` → ``target`` at ``time``, by ``rule``, for ``limited_by``."""

    time: float
    previous: int
    target: int
    rule: str  # the rule that fired, in words ("policy", "growth guard", "grace 1/3", "throttle cut", ...)
    limited_by: str | None  # one of LIMITS (never OFF: no decision is made then), or None while growing freely
    # The figures behind it: the poll's Observation (formatted only when read: the lab makes millions of these),
    # or a sentence for a decision between polls.
    basis: Observation | str

    @property
    def observation(self) -> str:
        """The figures behind the decision, in one clause (describe_observation)."""
        return self.basis if isinstance(self.basis, str) else describe_observation(self.basis)

    def __str__(self) -> str:
        """The short form (``get_utilization(...)["last_decision"]``): ``"16 -> 24: policy"`` plus the limit."""
        limit = f" [{self.limited_by}]" if self.limited_by else ""
        return f"{self.previous} -> {self.target}: {self.rule}{limit}"

    def log_line(self, model: str) -> str:
        """The ``-v`` line: previous → new target, the rule, the observation behind it."""
        return f"model {model}: target {self} ({self.observation})"


def limited_by_policy(obs: Observation, before: float) -> str:
    """Why a policy that did not grow held or cut, from what the poll showed (see the module docstring)."""
    if obs.client_throttled > 0:
        return "throttled"
    if obs.waiting_capacity > 0 or obs.preemptions > 0:
        return "saturation"
    if obs.inflight_peak < NEAR_FULL * before:
        return "app-limited"
    slots = obs.limits.max_num_seqs if obs.limits is not None else None
    if slots is not None and obs.running >= slots:
        return STATED
    return "saturation"


def outage_limit(read_once: bool, limit: str) -> str:
    """What holds the target through a failed poll: ``limit`` (``guard`` or ``floor``) once the page has been read.

    Before any poll was read there is no last good target to hold and no latency baseline to judge the calls by:
    the target is the floor the runtime started at whatever the outage rule says, and a user reading ``guard`` or
    ``floor`` would look for a guard that never acted or calls in trouble instead of at the metrics URL."""
    return limit if read_once else NEVER_READ


def static_limit(adaptive_flag: bool) -> str | None:
    """The reason of a static view (no controller applies): ``off`` when the flag switched the control off.

    Otherwise a static model (no metrics URL, or not registered) is held by nothing that decided: None."""
    return None if adaptive_flag else OFF


def explain_limit(limit: str | None) -> str:
    """``limit`` with its meaning, as the command line prints it; None is a target growing freely."""
    if limit is None:
        return "nothing (growing freely)"
    meaning = MEANINGS.get(limit)
    return f"{limit} ({meaning})" if meaning else limit


def describe_observation(obs: Observation) -> str:
    """The figures a decision stands on, in one short clause."""
    if not obs.ok:
        return f"no signals; in flight {obs.inflight}, calls {obs.client_calls} ({obs.client_errors} failed)"
    kv = "n/a" if obs.kv_cache_usage is None else f"{obs.kv_cache_usage:.2f}"
    parts = [
        f"running {obs.running:g}",
        f"waiting {obs.waiting:g} (capacity {obs.waiting_capacity:g})",
        f"kv {kv}",
        f"in flight {obs.inflight} (peak {obs.inflight_peak})",
        f"calls {obs.client_calls}",
    ]
    if obs.client_throttled:
        parts.append(f"throttled {obs.client_throttled}")
    if obs.preemptions:
        parts.append(f"preemptions {obs.preemptions:g}")
    return ", ".join(parts)
