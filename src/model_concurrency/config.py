"""Knobs from the environment and the model registry.

Knobs are read on every call, never cached at import, so an operator can flip ``KG_ADAPTIVE_CONCURRENCY`` or
change the ceiling in a long-running worker (through its environment) and the next poll obeys. A knob holding
garbage falls back to its default with one warning, rather than taking a worker down.

The registry maps a model name (or a role such as ``embedding``) to a :class:`ModelSpec`. Models come from
:func:`register_model` calls and from a TOML file named by ``MODEL_CONCURRENCY_CONFIG``; an explicit call wins
over the file for the same name.
"""

from __future__ import annotations

import logging
import os
import threading
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from model_concurrency._fork import reset_in_forked_child
from model_concurrency.policies.base import Policy
from model_concurrency.signals.scrape import check_metrics_url, has_control_characters, metrics_url_from_base

__all__ = [
    "ModelSpec",
    "UnknownModelError",
    "get_model",
    "load_config",
    "register_model",
    "registered_models",
    "registration",
    "setting",
    "spec_fields",
    "spec_from_table",
    "unregister_all",
]

log = logging.getLogger("model_concurrency")
T = TypeVar("T")

# Knob names and defaults live in knobs.py, in one table the CLI prints and docs/operations.md carries; the
# (name, default) pairs are re-exported here, where callers have always read them.
from model_concurrency.knobs import (  # noqa: E402
    ADAPTIVE_FLAG,
    CONFIG_PATH,
    GRACE_POLLS,
    GROWTH_GUARD,
    MAX_CONCURRENCY,
    OUTAGE_HANDOVER,
    POLICY,
    POLL_JITTER,
    POLL_S,
    PROMETHEUS_URL,
    RAMP_POLL_DIVISOR,
    THREAD_IDLE_S,
    TIMEOUT_S,
    setting,
)

__all__ += [
    "ADAPTIVE_FLAG",
    "CONFIG_PATH",
    "GRACE_POLLS",
    "GROWTH_GUARD",
    "MAX_CONCURRENCY",
    "OUTAGE_HANDOVER",
    "POLICY",
    "POLL_JITTER",
    "POLL_S",
    "PROMETHEUS_URL",
    "RAMP_POLL_DIVISOR",
    "THREAD_IDLE_S",
    "TIMEOUT_S",
]


def _prometheus_url(raw: str) -> str:
    return check_metrics_url(raw) if raw else ""


def fleet_prometheus_url() -> str:
    """``MODEL_CONCURRENCY_PROMETHEUS_URL`` now, or "" (unset, empty, or not an http(s) URL: warned once)."""
    return setting(PROMETHEUS_URL[0], PROMETHEUS_URL[1], _prometheus_url)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """One model as the registry knows it. ``api_key`` never appears in reprs or logs."""

    name: str
    base_url: str | None = None
    served_model_name: str | None = None
    metrics_url: str | None = None
    prometheus_url: str | None = None
    parallel_instances: int = 1
    max_parallel_calls: int = 1
    roles: tuple[str, ...] = ()
    api_key: str | None = field(default=None, repr=False)
    policy: str | Policy | None = None
    # vLLM's per-request ``priority`` our calls carry (``priority = 10`` in the TOML); None: the field is not sent.
    # Lower runs first on an engine served with ``--scheduling-policy priority``: a batch job gives itself a larger
    # value than the interactive traffic it shares the engine with. (vLLM rejects a non-zero priority on an FCFS
    # engine, so set it only where the engine runs the priority policy.)
    priority: int | None = None
    # The limits each engine behind the URL was started with (``vllm serve --max-num-seqs``,
    # ``--max-num-batched-tokens``; SGLang's ``--max-running-requests``), per engine: ``parallel_instances`` is the
    # engine count. No vLLM page states them, so a policy knows them only when the operator says so here; a stated
    # figure wins over a page's (signals/limits.py), and a ``max_num_seqs`` the page contradicts is ignored.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @property
    def static_capacity(self) -> int:
        """The configured concurrency: the floor the adaptive target never goes below."""
        return max(1, self.parallel_instances * self.max_parallel_calls)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.name

    @property
    def resolved_metrics_url(self) -> str | None:
        if self.metrics_url:
            return self.metrics_url
        return metrics_url_from_base(self.base_url) if self.base_url else None


_lock = threading.RLock()


# A parent thread may have held the registry lock at fork time; the child's copy would stay locked forever.
reset_in_forked_child(globals(), "_lock", threading.RLock)
_explicit: dict[str, ModelSpec] = {}
_from_file: dict[str, ModelSpec] = {}
_loaded_path: str | None = None
_generations: dict[str, int] = {}  # register_model calls per name (registration())


def _make_spec(name: str, **kwargs: Any) -> ModelSpec:
    if not name or not isinstance(name, str):
        raise ValueError("a model needs a non-empty name")
    base_url = kwargs.get("base_url")
    if base_url is not None:
        metrics_url_from_base(base_url)  # validates scheme, userinfo, query
    if kwargs.get("metrics_url") is not None:
        check_metrics_url(kwargs["metrics_url"])
    if kwargs.get("prometheus_url") is not None:
        check_metrics_url(kwargs["prometheus_url"])
    api_key = kwargs.get("api_key")
    if api_key is not None:
        # A secret read from a mounted file often ends in a newline; HTTP forbids it in a header, and the
        # resulting protocol error would quote the header, key included. Strip whitespace, refuse the rest.
        api_key = kwargs["api_key"] = str(api_key).strip() or None
        if api_key is not None and has_control_characters(api_key):
            raise ValueError(f"model {name!r}: api_key contains control characters")
    for knob, least in (("parallel_instances", 0), ("max_parallel_calls", 1)):
        value = kwargs.get(knob, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"model {name!r}: {knob} must be an int >= {least}, got {value!r}")
    priority = kwargs.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise ValueError(f"model {name!r}: priority must be an int, got {priority!r}")
    for knob in ("max_num_seqs", "max_num_batched_tokens"):
        value = kwargs.get(knob)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"model {name!r}: {knob} must be a positive int (per engine), got {value!r}")
    kwargs["roles"] = tuple(kwargs.get("roles") or ())
    return ModelSpec(name=name, **kwargs)


def register_model(
    name: str,
    *,
    base_url: str | None,
    served_model_name: str | None = None,
    metrics_url: str | None = None,
    prometheus_url: str | None = None,
    parallel_instances: int = 1,
    max_parallel_calls: int = 1,
    roles: Iterable[str] = (),
    api_key: str | None = None,
    policy: str | Policy | None = None,
    priority: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> ModelSpec:
    """Register (or replace) a model. Its runtime, if any, is rebuilt on next use (:func:`registration`).

    ``max_num_seqs`` and ``max_num_batched_tokens``: what each engine was started with, if known (ModelSpec)."""
    spec = _make_spec(
        name,
        base_url=base_url,
        served_model_name=served_model_name,
        metrics_url=metrics_url,
        prometheus_url=prometheus_url,
        parallel_instances=parallel_instances,
        max_parallel_calls=max_parallel_calls,
        roles=tuple(roles),
        api_key=api_key,
        policy=policy,
        priority=priority,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    with _lock:
        _explicit[name] = spec
        _generations[name] = _generations.get(name, 0) + 1
    return spec


def registration(name: str) -> int:
    """How many times ``name`` was registered by :func:`register_model` (0: never).

    The registry knows no runtime: a runtime remembers this number when it is built and is rebuilt on its next
    use once the number moved, so re-registering a model (even with the same spec) starts it afresh.
    """
    return _generations.get(name, 0)


def spec_fields(name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """A ``[models.NAME]`` table as :func:`register_model`'s keyword arguments; unknown keys are an error.

    ``api_key_env`` is resolved here, in the process that makes the calls, so a secret never travels inside a
    config (a file, or a mapping pickled to Ray workers)."""
    fields = dict(table)
    key_env = fields.pop("api_key_env", None)
    if key_env:
        fields["api_key"] = setting(str(key_env), None, str)
    unknown = set(fields) - set(ModelSpec.__dataclass_fields__)
    if unknown:
        raise ValueError(f"model {name!r}: unknown keys {sorted(unknown)}")
    fields.pop("name", None)
    return fields


def spec_from_table(name: str, table: Mapping[str, Any]) -> ModelSpec:
    """The spec a ``[models.NAME]`` table describes, checked but not registered."""
    return _make_spec(name, **spec_fields(name, table))


def load_config(path: str | os.PathLike[str]) -> list[ModelSpec]:
    """Load ``[models.NAME]`` tables from a TOML file into the registry (file entries; explicit ones win)."""
    global _loaded_path
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ValueError(f"{path}: [models] must be a table of tables")
    specs = [spec_from_table(name, table) for name, table in models.items()]
    with _lock:
        _from_file.clear()
        _from_file.update({spec.name: spec for spec in specs})
        _loaded_path = str(Path(path))
    return specs


def _sync_config_file() -> None:
    global _loaded_path
    path = setting(*CONFIG_PATH)
    if not path or path == _loaded_path:
        return
    try:
        load_config(path)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        _loaded_path = path  # do not retry (and log) on every lookup
        log.error("cannot load MODEL_CONCURRENCY_CONFIG=%s: %s", path, exc)


def registered_models() -> dict[str, ModelSpec]:
    """Every model known now, file entries overridden by explicit registrations."""
    _sync_config_file()
    with _lock:
        return {**_from_file, **_explicit}


class UnknownModelError(ValueError):
    """A fan-out or ``slot`` named a model the registry does not know (a typo would otherwise run at capacity 1).

    ``model`` is the name asked for, ``registered`` the names known then. ``resolve_capacity`` never raises it;
    ``map_concurrent``, ``map_concurrent_sync``, ``imap_concurrent`` and ``slot`` do unless called with
    ``allow_unregistered=True`` (then the model runs at the floor, capacity 1, with one warning per name)."""

    def __init__(self, model: str, registered: Iterable[str]) -> None:
        self.model = model
        self.registered = tuple(sorted(registered))
        known = ", ".join(self.registered) or "none"
        super().__init__(
            f"model {model!r} is not registered (registered: {known}); register it with register_model() or "
            "MODEL_CONCURRENCY_CONFIG, fix the name, or pass allow_unregistered=True to run it at the floor"
        )


def get_model(name_or_role: str | None) -> ModelSpec | None:
    """A model by name, else the model claiming that role (``embedding``, ``default`` ...); None if unknown."""
    models = registered_models()
    key = name_or_role or "default"
    if key in models:
        return models[key]
    for spec in models.values():
        if key in spec.roles:
            return spec
    return None


def unregister_all() -> None:
    """Forget every model (tests, and workers that reload their configuration)."""
    global _loaded_path
    with _lock:
        _explicit.clear()
        _from_file.clear()
        _loaded_path = None
