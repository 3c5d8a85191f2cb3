"""The policy interface: one pure function from (target, Observation) to the next target.

A policy does no I/O and reads time only from ``obs.time``, so the same object runs live, in threads and in the
simulator. It needs no floor or ceiling: the controller clamps whatever it returns to ``[floor, ceiling]`` and
treats a non-finite answer as "hold". It is never called for a failed poll; the controller's grace rule owns
those.

Three declarations complete the interface, all with defaults so a plug-in that only writes ``next_target`` (see
``policies/example_plugin.py``) keeps loading: ``grace_polls`` (None: the operator's
``MODEL_CONCURRENCY_GRACE_POLLS``; an int pins the policy's own, ``seed-aimd`` pins 0),
``uses_engine_signals`` (True: the model's ``/metrics`` page is scraped; False: only this process's own calls are
observed, so a hosted endpoint without ``/metrics`` still adapts) and ``wants_fast_polls`` (False; True while the
policy climbs from the floor toward a capacity it has not met yet and can use a poll every
``MODEL_CONCURRENCY_POLL_S / MODEL_CONCURRENCY_RAMP_POLL_DIVISOR``). Not ``ramping``: ``gradient`` has a
``ramping`` state whose rate test counts completions per 12 s poll, and a 2 s poll would end it early. Deriving
from :class:`PolicyBase` declares the first two; :func:`declared_grace_polls`, :func:`uses_engine_signals` and
:func:`wants_fast_polls` read all three for any policy object.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from model_concurrency.observation import Observation

__all__ = ["Policy", "PolicyBase", "Target", "declared_grace_polls", "uses_engine_signals", "wants_fast_polls"]


class Target(float):
    """A policy's answer in two dimensions, as the engine schedules: requests in flight and the tokens they hold.

    It *is* the request count (a float), so code that treats a policy's answer as a number (the controller's
    bounds, a wrapping policy, every test written for plain floats) keeps working; ``tokens`` rides along. None
    leaves the token budget unenforced, which is what a plain float answer means. The budget binds only calls
    that pass a weight (``map_concurrent(..., weight=)``, ``slot(tokens=)``); the controller clamps the request
    count to its bounds, and drops the tokens (not enforced) when its fail-safe drops to the floor."""

    tokens: float | None

    def __new__(cls, requests: float, tokens: float | None = None) -> Target:
        self = super().__new__(cls, requests)
        object.__setattr__(self, "tokens", None if tokens is None else float(tokens))
        return self

    @property
    def requests(self) -> float:
        return float(self)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Target is immutable")

    def __reduce__(self) -> tuple[type[Target], tuple[float, float | None]]:
        return (Target, (float(self), self.tokens))

    def __repr__(self) -> str:
        return f"Target(requests={float(self)!r}, tokens={self.tokens!r})"


@runtime_checkable
class Policy(Protocol):
    """Anything with ``next_target``; plug-in authors implement this (and may declare the two traits below)."""

    def next_target(self, target: float, obs: Observation) -> float: ...


class PolicyBase:
    """The declared traits with their defaults; every built-in policy derives from it."""

    __slots__ = ()

    #: Failed polls the last good target survives; None defers to ``MODEL_CONCURRENCY_GRACE_POLLS``.
    grace_polls: ClassVar[int | None] = None
    #: Whether the policy reads engine gauges (False: client-side signals only, no ``/metrics`` scrape).
    uses_engine_signals: ClassVar[bool] = True


def require_fractions(policy: object, *names: str) -> None:
    """Each named field strictly between 0 and 1 (a cut factor: 0 would stop the fan-out, 1 would never cut), or a
    ValueError naming the field and its value: a preset's typo fails at load, not as a policy that never backs off."""
    for name in names:
        value = getattr(policy, name)
        if not 0 < value < 1:
            raise ValueError(f"{name} must be in (0, 1), got {value}")


def declared_grace_polls(policy: Policy) -> int | None:
    """The policy's pinned grace, or None (the documented default) when it declares none or an invalid one."""
    value = getattr(policy, "grace_polls", PolicyBase.grace_polls)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def uses_engine_signals(policy: Policy) -> bool:
    """Whether the policy needs the engine's gauges (the documented default: True)."""
    return getattr(policy, "uses_engine_signals", PolicyBase.uses_engine_signals) is not False


def wants_fast_polls(policy: Policy) -> bool:
    """Whether the policy asks for the first ramp's faster polls now (the documented default: False).

    Only a real ``True`` counts, and a property that raises reads as False: a plug-in's bug may cost the faster
    polls, never a poll loop. Not a :class:`PolicyBase` attribute: a policy declares it as a property of its
    state, and a class-level default would clash with a dataclass field of the same name."""
    try:
        value = getattr(policy, "wants_fast_polls", False)
    except Exception:
        return False
    return value is True
