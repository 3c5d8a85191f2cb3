"""The emulator's engine core: the SimPy :class:`~model_concurrency.engine.Server`, its wall clock, and the jobs
the front-end submitted, with no HTTP in sight.

Why a separate object: the same core runs in two places. Inside the ASGI app's own event loop (tests, virtual-time
use through httpx's ASGI transport), and alone in an engine process fed by one or more HTTP front-end processes
(``model-concurrency emulate``), as vLLM V1 runs its EngineCore apart from its API servers so that HTTP load never
stalls the engine's clock. Either way the front-end speaks to it in jobs: a job is one HTTP call's requests
(several for a batched embedding call), and the core reports back, through the job's ``sink``:

* ``("tokens", n)``: a streaming job's request has generated ``n`` output tokens so far (sent after every engine
  step that produced some, so a stream follows the engine's step clock);
* ``("done", None)`` when every request finished, or ``("done", message)`` when the engine aborted one.

Everything here runs on one thread (the loop that owns the :class:`SimDriver`); sinks are called on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy

from model_concurrency.emulator.clock import SimDriver
from model_concurrency.emulator.loads import loads_prometheus, loads_report
from model_concurrency.emulator.openai_shapes import ApiError
from model_concurrency.emulator.rejections import check_style, queue_full
from model_concurrency.emulator.tokens import make_counter
from model_concurrency.engine import EngineDownError, EnginePreset, FrontEndCost, Request, Server, get_preset
from model_concurrency.engine.metrics import DEFAULT_FLAVOR, METRICS_FLAVORS, make_registry
from model_concurrency.engine.ratelimit import RateLimited, RateLimiter
from model_concurrency.engine.request import LENGTH, STOP

__all__ = ["EmulatorConfig", "EngineCore", "JobSpec", "Sink"]

Sink = Callable[[str, Any], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorConfig:
    """One emulated ``vllm serve``.

    ``simulate_frontend=False`` drops the preset's API-server CPU cost: the emulator's own HTTP stack is a real
    front-end, and with small embedding models the simulated one would otherwise be the bottleneck, hiding the
    engine capacity a step-response demo changes. ``requests_per_minute`` / ``tokens_per_minute`` turn on a
    hosted-API style limit (429 with ``Retry-After``), counted per *simulated* minute. ``tokenizer`` says how
    prompts are counted (see :mod:`.tokens`). ``frontends`` is the number of HTTP worker processes when served
    with an engine process (:func:`~model_concurrency.emulator.serve.serve`); the in-process app ignores it.
    """

    preset: str | EnginePreset = "bge-m3"
    max_num_seqs: int | None = None
    engines: int = 1
    time_scale: float = 1.0
    served_model_name: str | None = None
    simulate_frontend: bool = True
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    tokenizer: str = "chars4"
    frontends: int = 1
    max_model_len: int = 8192
    # Admission control (emulator/rejections.py): past this many requests queued (accepted, not running) a call is
    # refused in ``reject_style``; the hosted styles name ``reject_retry_after_s`` (wall seconds) as their delay.
    max_num_queued_reqs: int | None = None
    reject_style: str = "vllm"
    reject_retry_after_s: float = 1.0
    # Which engine's /metrics page to serve (engine/metrics.py): vllm-new (vLLM's latest design), vllm (a release
    # without the by-reason gauge) or sglang (SGLang's --enable-metrics page).
    metrics_flavor: str = DEFAULT_FLAVOR
    # vLLM's --scheduling-policy: "fcfs" or "priority" (a request's ``priority`` field, lower first).
    scheduling_policy: str = "fcfs"

    def engine_preset(self) -> EnginePreset:
        preset = get_preset(self.preset) if isinstance(self.preset, str) else self.preset
        changes: dict[str, object] = {}
        if self.max_num_seqs is not None:
            changes["max_num_seqs"] = self.max_num_seqs
            if preset.max_num_batched_tokens < self.max_num_seqs:
                changes["max_num_batched_tokens"] = self.max_num_seqs
        if not self.simulate_frontend:
            changes["frontend"] = FrontEndCost()
        if self.scheduling_policy != preset.scheduling_policy:
            changes["scheduling_policy"] = self.scheduling_policy
        return preset.replace(**changes) if changes else preset

    def validate(self) -> None:
        """Fail before binding anything: unknown preset, impossible counts or limits, unusable tokenizer."""
        self.engine_preset()
        if self.engines < 1:
            raise ValueError("engines must be >= 1")
        if self.frontends < 1:
            raise ValueError("frontends must be >= 1")
        if not self.time_scale > 0 or not math.isfinite(self.time_scale):
            raise ValueError(f"time_scale must be a positive number, got {self.time_scale!r}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        RateLimiter(self.requests_per_minute, self.tokens_per_minute)
        make_counter(self.tokenizer)
        check_style(self.reject_style)
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 0:
            raise ValueError(f"max_num_queued_reqs must be >= 0, got {self.max_num_queued_reqs}")
        if not (math.isfinite(self.reject_retry_after_s) and self.reject_retry_after_s >= 0):
            raise ValueError(f"reject_retry_after_s must be a finite number >= 0, got {self.reject_retry_after_s!r}")
        if self.metrics_flavor not in METRICS_FLAVORS:
            raise ValueError(f"unknown metrics flavor {self.metrics_flavor!r}; known: {', '.join(METRICS_FLAVORS)}")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One engine request of a job: what the engine model needs to know about it, and nothing else."""

    prompt_tokens: int
    output_tokens: int = 1
    embedding: bool = False
    finish_reason: str = STOP  # "stop" or "length": which success counter the engine bumps
    priority: int = 0  # the request's ``priority`` (read by a "priority" engine only)


class _Job:
    __slots__ = ("pending", "requests", "sent", "sink", "stream")

    def __init__(self, requests: list[Request], sink: Sink, stream: bool) -> None:
        self.requests = requests
        self.sink = sink
        self.stream = stream
        self.pending = len(requests)
        self.sent = 0


class EngineCore:
    """The simulated server, driven on the wall clock × ``time_scale``, and the jobs in it."""

    def __init__(self, config: EmulatorConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        config.validate()
        self.config = config
        self.preset = config.engine_preset()
        self.env = simpy.Environment()
        self.server = Server(self.env, self.preset, num_engines=config.engines, model_name=config.served_model_name)
        self.model_name = self.server.model_name
        if config.metrics_flavor != DEFAULT_FLAVOR:
            server = self.server
            server.registry = make_registry(lambda: server.engines, config.metrics_flavor)
        self.limiter = RateLimiter(config.requests_per_minute, config.tokens_per_minute)
        self.driver = SimDriver(self.env, config.time_scale, on_advance=self._advanced, clock=clock)
        self._streams: set[_Job] = set()

    # ------------------------------------------------------------------ jobs
    def submit(self, specs: list[JobSpec], sink: Sink, *, stream: bool = False, budget_tokens: int = 0) -> _Job:
        """Admit a job now or raise :class:`ApiError` (429 rate limited, 503 down, 400 too long)."""
        self.driver.sync()
        if not self.server.up:
            raise ApiError(503, "the engine is down", kind="ServiceUnavailableError")
        cap = self.config.max_num_queued_reqs
        if cap is not None and self.server.inflight - self.server.num_running + len(specs) > cap:
            raise queue_full(self.config.reject_style, cap, self.config.reject_retry_after_s)
        if self.limiter.active:
            try:
                self.limiter.admit(budget_tokens, self.env.now)
            except RateLimited as limited:
                raise ApiError(
                    429,
                    f"Rate limit reached for {limited.which} per minute; retry later",
                    kind="RateLimitError",
                    retry_after_s=limited.retry_after_s / self.driver.time_scale,
                ) from None
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
        requests = [
            Request(
                s.prompt_tokens,
                s.output_tokens,
                embedding=s.embedding,
                stop_reason=LENGTH if s.finish_reason == LENGTH else STOP,
                priority=s.priority,
            )
            for s in specs
        ]
        job = _Job(requests, sink, stream)

        def on_finish(request: Request) -> None:
            self._finished(job, request)

        submitted: list[Request] = []
        try:
            for request in requests:
                self.server.submit_callback(request, on_finish)
                submitted.append(request)
        except ValueError as exc:  # too long for the engine, as vLLM rejects over-long prompts
            for request in submitted:
                self.server.abort(request)
            raise ApiError(400, str(exc), param="input") from None
        if stream:
            self._streams.add(job)
        self.driver.poke()
        return job

    def abort(self, job: _Job) -> None:
        """The client went away: abort what is still running, report nothing more."""
        job.sink = _ignore
        self._streams.discard(job)
        for request in job.requests:
            if request.finished_reason is None:
                self.server.abort(request)
        self.driver.poke()

    def _finished(self, job: _Job, request: Request) -> None:
        job.pending -= 1
        if job.pending == 0:
            self._streams.discard(job)
            failed = any(not r.ok for r in job.requests)
            if job.stream and not failed:
                total = job.requests[0].generated
                if total > job.sent:
                    job.sent = total
                    job.sink("tokens", total)
            job.sink("done", "the engine aborted the request (engine down or capacity lost)" if failed else None)

    def _advanced(self) -> None:
        """After every advance of the simulated clock: report new tokens of every streaming job."""
        for job in self._streams:
            request = job.requests[0]
            engine = request.engine
            if engine is None:
                continue
            generated = engine.progress(request)[1]
            if generated > job.sent:
                job.sent = generated
                job.sink("tokens", generated)

    # ------------------------------------------------------------------ state
    def health(self) -> bool:
        self.driver.sync()
        return bool(self.server.up)

    def metrics(self) -> str:
        self.driver.sync()
        try:
            return self.server.render_metrics()
        except EngineDownError as exc:
            raise ApiError(503, str(exc), kind="ServiceUnavailableError") from None

    def loads(self, prometheus: bool = False) -> dict[str, Any] | str:
        """SGLang's ``/v1/loads`` from the engines now (emulator/loads.py): JSON, or its Prometheus text."""
        self.driver.sync()
        if not self.server.up:
            raise ApiError(503, "the engine is down", kind="ServiceUnavailableError")
        report = loads_report(self.server.engines)
        return loads_prometheus(report) if prometheus else report

    def capacity(self, changes: dict[str, Any] | None) -> dict[str, Any]:
        """Apply ``changes`` (if any) now and return the capacity in force."""
        self.driver.sync()
        if changes is not None:
            self._apply_capacity(changes)
            self.driver.poke()
        return self.capacity_state()

    def _apply_capacity(self, body: dict[str, Any]) -> None:
        known = {"max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "speed", "engines", "up"}
        unknown = set(body) - known
        if unknown:
            raise ApiError(400, f"unknown capacity fields {sorted(unknown)}; known: {sorted(known)}")
        engines = body.get("engines")
        if engines is not None and (
            isinstance(engines, bool) or not isinstance(engines, int) or engines < len(self.server.engines)
        ):
            raise ApiError(400, f"'engines' can only grow (now {len(self.server.engines)})", param="engines")
        changes = {
            k: body[k]
            for k in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "speed")
            if body.get(k) is not None
        }
        for key, value in changes.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or (key != "speed" and value != int(value)):
                raise ApiError(400, f"'{key}' must be a number", param=key)
        seqs = changes.get("max_num_seqs")
        if seqs is not None and "max_num_batched_tokens" not in changes:
            # Raising max_num_seqs past the token budget would be refused; lift the budget with it.
            changes["max_num_batched_tokens"] = max(int(seqs), self.server.engines[0].max_num_batched_tokens)
        try:
            if changes:
                self.server.set_capacity(**changes)
            while engines is not None and len(self.server.engines) < engines:
                new = self.server.add_engine()
                first = self.server.engines[0]
                new.set_capacity(
                    max_num_seqs=first.max_num_seqs,
                    max_num_batched_tokens=first.max_num_batched_tokens,
                    num_gpu_blocks=first.num_gpu_blocks,
                    speed=first.speed,
                )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        up = body.get("up")
        if up is True:
            self.server.set_up()
        elif up is False:
            self.server.set_down()

    def capacity_state(self) -> dict[str, Any]:
        first = self.server.engines[0]
        state = {
            "model": self.model_name,
            "preset": self.preset.name,
            "engines": len(self.server.engines),
            "max_num_seqs": first.max_num_seqs,
            "max_num_batched_tokens": first.max_num_batched_tokens,
            "num_gpu_blocks": first.num_gpu_blocks,
            "speed": first.speed,
            "up": self.server.up,
            "time_scale": self.driver.time_scale,
            "sim_time_s": self.env.now,
            "inflight": self.server.inflight,
            "completed": self.server.completed,
            "aborted": self.server.aborted,
        }
        if self.limiter.active:
            state["rate_limit"] = self.limiter.remaining(self.env.now)
        return state


def _ignore(kind: str, value: Any) -> None:
    return None
