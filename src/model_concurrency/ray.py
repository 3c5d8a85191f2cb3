"""The fan-out inside Ray: Ray Data ``map_batches``, plain actors and tasks.

Each Ray worker process is one client, with its own registry, controller and limiter, like one TCP flow, unless
the fan-out names a job: ``FanOut(..., job="name")`` makes the workers of that job share one runtime per model,
owned by a coordinator actor (:func:`coordinator_name`), which alone polls the engine and leases each worker its
share of the job's target (:mod:`model_concurrency.ray_job`; docs/scale-out.md). What every worker must share
is the configuration, so a :class:`FanOut` carries it (a TOML path, a parsed ``{"models": {...}}`` mapping, or
:class:`ModelSpec` objects) with the model and the per-item function. It is plain data, pickled to each worker,
where :func:`configure` registers the models once per process before the first item.

Ray is imported only by :func:`fan_out_actor` and :func:`fan_out_task`, so this module imports without the
``[ray]`` extra; :class:`MapBatches` needs numpy, which Ray Data brings.

The signal source is one setting. By default each worker scrapes the model's ``/metrics`` every poll interval;
with ``MODEL_CONCURRENCY_PROMETHEUS_URL`` set in the workers' environment (``runtime_env={"env_vars": ...}``)
or ``FanOut(prometheus_url=...)``, every model without its own ``prometheus_url`` or ``metrics_url`` reads the
fleet from that Prometheus server instead, which scrapes each engine once for the whole cluster.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from model_concurrency import (
    ModelSpec,
    get_utilization,
    load_config,
    map_concurrent_sync,
    register_model,
)
from model_concurrency import config as _config
from model_concurrency.config import registered_models, spec_fields
from model_concurrency.extras import require
from model_concurrency.ray_job import NAMESPACE, coordinator_name, prepare_job, run_in_job

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "NAMESPACE",
    "PROMETHEUS_URL",
    "FanOut",
    "FanOutWorker",
    "MapBatches",
    "ModelsConfig",
    "configure",
    "coordinator_name",
    "fan_out_actor",
    "fan_out_task",
    "run_fan_out",
]

# The one setting that moves every worker from scraping engines to one Prometheus server (config.py owns it).
PROMETHEUS_URL = _config.PROMETHEUS_URL

# A TOML file readable on every node, the parsed TOML (``{"models": {...}}``), or specs built in the driver.
ModelsConfig = str | os.PathLike[str] | Mapping[str, Any] | Sequence[ModelSpec]

_SPEC_FIELDS = {f.name for f in fields(ModelSpec)} - {"name"}
_lock = threading.Lock()
_configured: dict[str, tuple[ModelSpec, ...]] = {}  # fingerprint of a configuration -> the models it registered


def _fingerprint(config: ModelsConfig, prometheus_url: str) -> str:
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        stat = os.stat(path)
        return f"path:{os.path.abspath(path)}:{stat.st_mtime_ns}:{stat.st_size}:{prometheus_url}"
    return f"object:{config!r}:{prometheus_url}"


def _specs_from_mapping(config: Mapping[str, Any]) -> list[ModelSpec]:
    tables = config.get("models", config)
    if not isinstance(tables, Mapping):
        raise ValueError("a models config maps model names to tables: {'models': {name: {...}}}")
    specs = []
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            raise ValueError(f"model {name!r}: expected a table, got {type(table).__name__}")
        fields = spec_fields(str(name), table)  # the secret is read here, where it is used
        fields.setdefault("base_url", None)
        specs.append(register_model(str(name), **fields))
    return specs


def _register(config: ModelsConfig) -> list[ModelSpec]:
    if isinstance(config, (str, os.PathLike)):
        return load_config(config)
    if isinstance(config, Mapping):
        return _specs_from_mapping(config)
    specs = list(config)
    for spec in specs:
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"expected ModelSpec objects, got {type(spec).__name__}")
    return [_reregister(spec) for spec in specs]


def _reregister(spec: ModelSpec, **changes: Any) -> ModelSpec:
    spec = replace(spec, **changes)
    return register_model(spec.name, **{name: getattr(spec, name) for name in _SPEC_FIELDS})


def configure(config: ModelsConfig, *, prometheus_url: str | None = None) -> tuple[ModelSpec, ...]:
    """Register ``config``'s models in this process, once; returns them as registered.

    Workers are reused across tasks and a re-registration would drop the model's controller (and what it has
    learnt), so a configuration already registered here, and still in the registry as registered, is a no-op.
    A changed TOML file (mtime or size) counts as a new configuration. ``prometheus_url`` (else
    ``MODEL_CONCURRENCY_PROMETHEUS_URL``) becomes the signal source of every model that names neither its own
    ``prometheus_url`` nor a ``metrics_url``.
    """
    prom = prometheus_url if prometheus_url is not None else _config.fleet_prometheus_url()
    key = _fingerprint(config, prom)
    with _lock:
        known = _configured.get(key)
        if known is not None:
            current = registered_models()
            if all(current.get(spec.name) == spec for spec in known):
                return known
        specs = _register(config)
        if prom:
            specs = [
                _reregister(spec, prometheus_url=prom) if not (spec.prometheus_url or spec.metrics_url) else spec
                for spec in specs
            ]
        _configured[key] = tuple(specs)
        return _configured[key]


@dataclass(frozen=True, slots=True)
class FanOut:
    """One fan-out as every worker runs it: call ``fn`` on each item under ``model``'s live target.

    Picklable when ``fn`` is (a module-level function or a picklable callable object; Ray pickles closures with
    cloudpickle too). ``return_exceptions=True`` puts each failed item's exception in its place instead of
    raising the first one, so a batch is never lost to one bad item.

    ``job``: the workers running this fan-out under that name are one client of the model, not one each. The
    first to run it creates the (job, model) coordinator actor; each then runs under a lease of the job's target
    (:mod:`model_concurrency.ray_job`). The floor and ceiling are then the job's, and every worker must state the
    same ones (and the same policy): one that does not is refused with an error naming both.
    """

    fn: Callable[[Any], Any]
    model: str
    config: ModelsConfig
    return_exceptions: bool = False
    timeout: float | None = None
    prometheus_url: str | None = None
    job: str | None = None

    def configure(self) -> tuple[ModelSpec, ...]:
        """Register the models in this process (once) and check that ``model`` names one of them (or a role)."""
        specs = configure(self.config, prometheus_url=self.prometheus_url)
        if not any(self.model == spec.name or self.model in spec.roles for spec in specs):
            raise ValueError(f"model {self.model!r} is not in the configuration (it has {[s.name for s in specs]})")
        return specs

    def __call__(self, items: Iterable[Any]) -> list[Any]:
        self.configure()
        if self.job is None:
            return self._run(items, self.fn)
        return run_in_job(self.job, self._creator(), self.fn, list(items), self._run)

    def prepare(self) -> None:
        """Configure this process and, for a job, bring its coordinator up before the first item."""
        self.configure()
        if self.job is not None:
            prepare_job(self.job, self._creator())

    def _creator(self) -> FanOut:
        """What a job's coordinator is built from: this fan-out without its function (it makes no call)."""
        return replace(self, fn=_no_call, job=None)

    def _run(self, items: Iterable[Any] | AsyncIterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        # Two literal branches, so the gate's overloads (result types by return_exceptions) apply.
        if self.return_exceptions:
            return list(map_concurrent_sync(items, fn, model=self.model, return_exceptions=True, timeout=self.timeout))
        return list(map_concurrent_sync(items, fn, model=self.model, timeout=self.timeout))


def _no_call(item: Any) -> Any:
    raise RuntimeError("a job's coordinator runs no item")


def run_fan_out(fan_out: FanOut, items: Sequence[Any]) -> list[Any]:
    """The body of a fan-out task: results in input order (the function :func:`fan_out_task` makes remote)."""
    return fan_out(items)


class FanOutWorker:
    """A Ray actor's state: one client that keeps its controller between calls (see :func:`fan_out_actor`)."""

    def __init__(self, fan_out: FanOut) -> None:
        self.fan_out = fan_out
        fan_out.prepare()
        self.models = [spec.name for spec in fan_out.configure()]

    def map(self, items: Sequence[Any]) -> list[Any]:
        return self.fan_out(items)

    def utilization(self) -> dict[str, Any]:
        """This client's view of its model: target, floor, ceiling, what the last poll saw; plus its pid."""
        return {**get_utilization(self.fan_out.model), "pid": os.getpid(), "models": self.models}


class MapBatches:
    """A callable class for ``Dataset.map_batches``: each actor of the pool is one client.

    ``ds.map_batches(MapBatches, fn_constructor_args=(fan_out,), compute=ActorPoolStrategy(size=n),
    num_cpus=0.25)``. The items are ``batch[column]``; the results go to ``batch[output_column]`` in the same
    order (an object column unless every result is a number or an equal-length vector).
    """

    def __init__(self, fan_out: FanOut, column: str = "item", output_column: str = "result") -> None:
        self.fan_out = fan_out
        self.column = column
        self.output_column = output_column
        fan_out.prepare()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        np = require("numpy", "ray", "model_concurrency.ray.MapBatches")

        if self.column not in batch:
            raise KeyError(f"batch has no column {self.column!r} (it has {sorted(batch)})")
        results = self.fan_out(batch[self.column].tolist())
        try:
            column = np.asarray(results)
            if column.dtype == object or column.shape[:1] != (len(results),):
                raise ValueError
        except ValueError:
            column = np.empty(len(results), dtype=object)
            column[:] = results
        return {**batch, self.output_column: column}


def fan_out_actor(**ray_options: Any) -> Any:
    """``ray.remote(**ray_options)(FanOutWorker)``: ``fan_out_actor(num_cpus=0.25).remote(fan_out)``."""
    ray = require("ray", "ray", "model_concurrency.ray.fan_out_actor")

    return ray.remote(**ray_options)(FanOutWorker) if ray_options else ray.remote(FanOutWorker)


def fan_out_task(**ray_options: Any) -> Any:
    """``ray.remote(**ray_options)(run_fan_out)``: ``fan_out_task(num_cpus=0.25).remote(fan_out, items)``."""
    ray = require("ray", "ray", "model_concurrency.ray.fan_out_task")

    return ray.remote(**ray_options)(run_fan_out) if ray_options else ray.remote(run_fan_out)
