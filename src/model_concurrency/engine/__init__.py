"""A discrete-event model of vLLM V1 engines on SimPy, exporting vLLM's own signals.

API overview (everything runs on a ``simpy.Environment``'s simulated clock; nothing reads wall time)::

    env = simpy.Environment()
    server = Server(env, LLAMA_8B_A100_80GB, num_engines=1)          # one `vllm serve`: front-end + engine cores
    done = server.submit(Request(prompt_tokens=1024, output_tokens=256))   # -> simpy.Event, value = the Request
    server.submit_callback(request, on_finish)                   # same, calling on_finish(request) instead
    server.abort(request)                                        # client cancelled: finished_reason "abort"
    server.snapshot()         # EngineSnapshot on simulated time == parse_vllm_metrics(render_metrics(), model)
    server.render_metrics()   # the /metrics page as Prometheus text (raises EngineDownError when down)
    server.set_capacity(max_num_seqs=..., max_num_batched_tokens=..., num_gpu_blocks=..., speed=...)
    server.add_engine()       # one more engine core ("engine" label "1", ...): e.g. a GPU added, data parallel
    server.set_down() / server.set_up()                          # replica lost (aborts what it held) / restarted
    server.inflight, .completed, .aborted, .num_running, .num_waiting, .engines[i].stats  # live accessors

    fleet = Fleet.of(env, LLAMA_8B_H100, replicas=3, balancer="least_loaded")   # or "round_robin"
    fleet.submit(request); fleet.snapshot(); fleet.render_metrics(0); fleet.replicas[1].set_down()

    engine = server.engines[0]   # Engine: the same submit / snapshot / set_capacity / set_down at engine level
    engine.stats                 # EngineStats: counters and Histograms (ttft, itl, e2e, queue_time, ...)

A :class:`Request` is single-use (submit a new one per call) and carries its timestamps (``arrival_time``,
``queued_time``, ``first_scheduled_time``, ``first_token_time``, ``finish_time``), ``finished_reason`` and
``num_preemptions``, so the lab can compute queue time and latency per request. Presets (:data:`PRESETS`):
``llama-8b-h100-80gb``, ``llama-8b-a100-80gb``, ``llama-8b-a100-40gb``, ``bge-m3`` (the short names
``llama-8b-h100`` and ``llama-8b-a100`` are aliases of the 80 GB presets); derive variants with
``preset.replace(max_num_seqs=64, num_gpu_blocks=2000)``. Coefficients and their sources are in :mod:`.presets`
and docs/engine-model.md.

Module map: ``request`` (Request), ``stats`` (counters, histograms, vLLM buckets), ``steptime`` (the roofline
step-time and front-end cost models), ``presets``, ``bookkeeping`` (an engine's state, the end of a step, how a
request finishes), ``scheduler`` (batch building and preemption, as vLLM V1), ``engine`` (Engine: public API and
step loop), ``metrics`` (Prometheus rendering), ``topology`` (Server, Fleet, snapshot summing). The fidelity of
the presets against published vLLM figures is ``scripts/validate_engine.py`` (table in docs/engine-model.md).
"""

from __future__ import annotations

from model_concurrency.engine.engine import Engine, EngineDownError, RequestTooLargeError
from model_concurrency.engine.metrics import VllmCollector, make_registry, render_engines
from model_concurrency.engine.presets import (
    BGE_M3,
    LLAMA_8B_A100,
    LLAMA_8B_A100_40GB,
    LLAMA_8B_A100_80GB,
    LLAMA_8B_H100,
    LLAMA_8B_H100_80GB,
    PRESET_ALIASES,
    PRESETS,
    EnginePreset,
    get_preset,
)
from model_concurrency.engine.request import ABORT, LENGTH, STOP, Request, RequestState
from model_concurrency.engine.stats import ClassLatency, EngineStats, Histogram
from model_concurrency.engine.steptime import FrontEndCost, StepTimeModel
from model_concurrency.engine.topology import Fleet, Server, combine_snapshots

__all__ = [
    "ABORT",
    "BGE_M3",
    "LENGTH",
    "LLAMA_8B_A100",
    "LLAMA_8B_A100_40GB",
    "LLAMA_8B_A100_80GB",
    "LLAMA_8B_H100",
    "LLAMA_8B_H100_80GB",
    "PRESETS",
    "PRESET_ALIASES",
    "STOP",
    "ClassLatency",
    "Engine",
    "EngineDownError",
    "EnginePreset",
    "EngineStats",
    "Fleet",
    "FrontEndCost",
    "Histogram",
    "Request",
    "RequestState",
    "RequestTooLargeError",
    "Server",
    "StepTimeModel",
    "VllmCollector",
    "combine_snapshots",
    "get_preset",
    "make_registry",
    "render_engines",
]
