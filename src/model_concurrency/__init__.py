"""model_concurrency: size LLM and embedding fan-out to the live capacity of the vLLM engines behind it.

Data flow: signal source → Observation → policy → controller (bounds, throttle, fail-safe) → gate → calls.
Importing this package needs only httpx and prometheus_client; the simulator, CLI and emulator are extras.
"""

from model_concurrency.config import ModelSpec, UnknownModelError, load_config, register_model, setting
from model_concurrency.controller import ControllerCore
from model_concurrency.gate import (
    GateStats,
    ModelUnreachable,
    RetryPolicy,
    gate_stats,
    imap_concurrent,
    map_concurrent,
    map_concurrent_sync,
    slot,
)
from model_concurrency.hooks import (
    adaptive_capacity,
    aresolve_capacity,
    get_all_utilization,
    get_utilization,
    resolve_capacity,
)
from model_concurrency.observation import CallStats, EngineLimits, EngineSnapshot, Observation
from model_concurrency.policies import AIMD, Policy
from model_concurrency.runtime import ModelRuntime, reset_controllers, reset_runtimes
from model_concurrency.signals import metrics_url_from_base

__all__ = [
    "AIMD",
    "CallStats",
    "ControllerCore",
    "EngineLimits",
    "EngineSnapshot",
    "GateStats",
    "ModelRuntime",
    "ModelSpec",
    "ModelUnreachable",
    "Observation",
    "Policy",
    "RetryPolicy",
    "UnknownModelError",
    "adaptive_capacity",
    "aresolve_capacity",
    "gate_stats",
    "get_all_utilization",
    "get_utilization",
    "imap_concurrent",
    "load_config",
    "map_concurrent",
    "map_concurrent_sync",
    "metrics_url_from_base",
    "register_model",
    "reset_controllers",
    "reset_runtimes",
    "resolve_capacity",
    "setting",
    "slot",
]

__version__ = "0.2.0"
