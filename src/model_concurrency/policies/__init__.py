"""Policies: pure decisions from an Observation to the next concurrency target.

Built-ins (docs/policies.md): ``adaptive`` (the production default), ``adaptive-core`` (a small DCTCP-style policy),
``aimd``, ``seed-aimd`` (the original rules, flaws kept), ``aimd-slowstart``, ``queue``, ``gradient``,
``setpoint``, ``capacity`` and ``static``.
:func:`load_policy` builds any of them, a preset (``policies/*.toml``), a ``module:Class`` or an entry point by name.
"""

from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.aimd import AIMD
from model_concurrency.policies.aimd_slowstart import AIMDSlowStart
from model_concurrency.policies.base import Policy, Target
from model_concurrency.policies.capacity import Capacity
from model_concurrency.policies.core import AdaptiveCore
from model_concurrency.policies.gradient import Gradient
from model_concurrency.policies.queue import QueuePolicy
from model_concurrency.policies.registry import (
    BUILTIN_POLICIES,
    PolicyPreset,
    find_preset,
    load_policy,
    load_preset,
    policy_names,
)
from model_concurrency.policies.seed_aimd import SeedAIMD
from model_concurrency.policies.setpoint import Setpoint
from model_concurrency.policies.static import Static

__all__ = [
    "AIMD",
    "BUILTIN_POLICIES",
    "AIMDSlowStart",
    "Adaptive",
    "AdaptiveCore",
    "Capacity",
    "Gradient",
    "Policy",
    "PolicyPreset",
    "QueuePolicy",
    "SeedAIMD",
    "Setpoint",
    "Static",
    "Target",
    "find_preset",
    "load_policy",
    "load_preset",
    "policy_names",
]
