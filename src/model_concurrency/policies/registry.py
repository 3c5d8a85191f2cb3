"""Policies by name: built-ins, ``module:Class`` references, and the ``model_concurrency.policies`` entry points.

A name is resolved in that order; a string with a colon is imported. Keyword parameters go to the constructor,
so a preset can say ``policy = "aimd"`` with ``increase_fraction = 0.5``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from model_concurrency.policies.aimd import AIMD
from model_concurrency.policies.base import Policy
from model_concurrency.policies.static import Static

__all__ = ["BUILTIN_POLICIES", "make_policy", "policy_names"]

ENTRY_POINT_GROUP = "model_concurrency.policies"

BUILTIN_POLICIES: dict[str, Callable[..., Policy]] = {
    "aimd": AIMD,
    "static": Static,
}


def policy_names() -> list[str]:
    names = set(BUILTIN_POLICIES)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _import(ref: str) -> Callable[..., Policy]:
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load policy {ref!r}: {exc}") from None
    if not callable(obj):
        raise ValueError(f"policy {ref!r} is not a class or factory")
    return obj  # type: ignore[no-any-return]


def make_policy(name: str, **params: Any) -> Policy:
    """Build a policy from a built-in name, ``module:Class``, or an entry point name."""
    if name in BUILTIN_POLICIES:
        factory = BUILTIN_POLICIES[name]
    elif ":" in name:
        factory = _import(name)
    else:
        matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not matches:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
        factory = matches[0].load()
    policy = factory(**params)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {name!r} has no next_target(target, obs) method")
    return policy
