"""Servers (one ``/metrics`` page, several engine cores) and fleets of replicas behind a balancer.

(Over 400 lines: Server and Fleet share the balancer's hot path and the page cache; split, each would reach into the
other.)

* :class:`Server` is one ``vllm serve`` process: an API front-end (a FIFO of per-request CPU work, see
  :class:`~model_concurrency.engine.steptime.FrontEndCost`) feeding one or more engine cores labelled "0", "1", ...
  through vLLM's data-parallel router (least ``4 × waiting + running``, or round-robin). It renders one page.
* :class:`Fleet` is several servers behind a load balancer (round-robin, or least outstanding requests as nginx's
  ``least_conn``). Each replica renders its own page; :meth:`Fleet.snapshot` is what a Prometheus
  ``sum by (model_name)`` over all live replicas would give.

Losing a replica aborts what it held (the client sees errors) and the balancer stops sending to it, as a health
check would; its page becomes unreachable (:class:`EngineDownError`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from operator import add, attrgetter
from typing import Any, Literal

import simpy
from prometheus_client import generate_latest
from simpy.events import Timeout

from model_concurrency.engine.bookkeeping import SIGNAL_FIELDS, Signals
from model_concurrency.engine.engine import (
    Engine,
    EngineDownError,
    RequestTooLargeError,
    combine_signals,
    cumulative_buckets,
    snapshot_of,
)
from model_concurrency.engine.metrics import make_registry
from model_concurrency.engine.presets import EnginePreset
from model_concurrency.engine.request import _FRONTEND, ABORT, Request, RequestState
from model_concurrency.observation import Buckets, EngineSnapshot

__all__ = ["Fleet", "Server", "combine_snapshots"]

Router = Literal["least_loaded", "round_robin"]
# The fleet's balancer key, in C: it picks a replica for every request.
_INFLIGHT = attrgetter("inflight")
# A snapshot's values as a :data:`Signals` tuple, in C.
_SIGNALS_OF = attrgetter(*SIGNAL_FIELDS)


def combine_snapshots(snapshots: Iterable[EngineSnapshot]) -> EngineSnapshot:
    """Sum snapshots the way ``parse_vllm_metrics`` sums engines: counts added in order, KV usage the maximum.

    Adding in page order from 0.0 keeps float sums bit-identical to the parser's.
    """
    items = list(snapshots)
    if not items:
        raise EngineDownError("no live engine to read")
    combined = _combine_complete(items)
    if combined is not None:
        return combined

    def total(name: str) -> Any:
        values = [getattr(s, name) for s in items]
        if all(v is None for v in values):
            return None
        acc = 0.0
        for v in values:
            if v is not None:
                acc += v
        return acc

    kv_values = [s.kv_cache_usage for s in items if s.kv_cache_usage is not None]
    waits = [s.queue_time_buckets for s in items if s.queue_time_buckets is not None]
    blocks = [s.kv_num_blocks for s in items if s.kv_num_blocks is not None]
    kv_tokens = [s.kv_tokens for s in items if s.kv_tokens is not None]
    return EngineSnapshot(
        running=total("running"),
        waiting=total("waiting"),
        waiting_capacity=total("waiting_capacity"),
        kv_cache_usage=max(kv_values) if kv_values else None,
        kv_num_blocks=sum(blocks) if blocks else None,
        kv_tokens=sum(kv_tokens) if kv_tokens else None,
        preemptions_total=total("preemptions_total"),
        success_total=total("success_total"),
        generation_tokens_total=total("generation_tokens_total"),
        queue_time_sum_total=total("queue_time_sum_total"),
        queue_time_count_total=total("queue_time_count_total"),
        queue_time_buckets=add_buckets(waits) if waits else None,
    )


def add_buckets(histograms: list[Buckets]) -> Buckets | None:
    """Cumulative histograms summed bound by bound, as the parser sums engines (None if the bounds differ)."""
    first = histograms[0]
    bounds = [bound for bound, _ in first]
    if any([bound for bound, _ in h] != bounds for h in histograms[1:]):
        return None
    totals = [0.0] * len(first)
    for h in histograms:
        totals = [acc + count for acc, (_, count) in zip(totals, h, strict=True)]
    return tuple(zip(bounds, totals, strict=True))


def add_counts(histograms: list[list[int]]) -> list[int]:
    """Bucket counts (equal lengths) added bucket by bucket: a few list-wide ``map(add)`` instead of a ``sum`` per
    bucket (a fleet's polls add a server's four engines, then sixteen servers, every poll)."""
    total = histograms[0]
    for counts in histograms[1:]:
        total = list(map(add, total, counts))
    return total if len(histograms) > 1 else list(total)


def _combine_complete(items: list[EngineSnapshot]) -> EngineSnapshot | None:
    """:func:`combine_snapshots` of snapshots that report every signal (the engine model's), in one pass.

    Their :data:`Signals` are summed by :func:`combine_signals`, the rule a fleet's own snapshot sums its servers'
    with: each field added in the same order from 0.0 as the general path, so the sums are the same bits. None if
    some snapshot lacks a signal (the general path then skips the missing ones)."""
    signals: list[Signals] = []
    waits: list[Buckets] = []
    waiting_capacity = 0.0
    for s in items:
        values = _SIGNALS_OF(s)
        capacity = s.waiting_capacity
        buckets = s.queue_time_buckets
        if buckets is None or capacity is None or None in values:
            return None
        signals.append(values)
        waits.append(buckets)
        waiting_capacity += capacity
    return snapshot_of(combine_signals(signals), add_buckets(waits), waiting_capacity=waiting_capacity)


def _abort_outside(request: Request, now: float) -> None:
    """Fail a request no engine holds (server down, or lost in the front-end): no engine counter moves."""
    request.state = RequestState.FINISHED
    request.finish_time = now
    request.finished_reason = ABORT
    if request.arrival_time is None:
        request.arrival_time = now
    if request.done is not None:
        request.done.succeed(request)
    elif request.on_finish is not None:
        request.on_finish(request)


class Server:
    """One vLLM server: front-end, router and ``num_engines`` engine cores; one ``/metrics`` page."""

    def __init__(
        self,
        env: simpy.Environment,
        preset: EnginePreset,
        *,
        num_engines: int = 1,
        model_name: str | None = None,
        router: Router = "least_loaded",
        name: str = "server",
    ) -> None:
        if num_engines < 1:
            raise ValueError("num_engines must be >= 1")
        if router not in ("least_loaded", "round_robin"):
            raise ValueError(f"unknown router {router!r}")
        self.env = env
        self.preset = preset
        self.model_name = model_name or preset.model_name
        self.router = router
        self.name = name
        self.up = True
        self._signals: Signals | None = None  # the page's sum while no engine of it changes
        # The live engines' queue-time bucket counts summed, and the signals they were summed with (the key: a new
        # signals tuple means an engine changed since).
        self._counts: list[int] = []
        self._counts_of: Signals | None = None
        self.engines: list[Engine] = []
        self.frontend = preset.frontend
        self._frontend_free = preset.frontend.free
        self._frontend_free_at = [0.0] * preset.frontend.workers  # a heap of when each API worker is free
        self._in_frontend: dict[Request, None] = {}
        self._on_frontend_done = self._frontend_done  # bound once: the callback of every front-end timeout
        self._rr = itertools.count()
        self.inflight = 0  # accepted and not finished: what a least-connections balancer counts
        self.submitted = 0
        self.completed = 0  # finished with a result
        self.aborted = 0
        self.on_request_finished: Callable[[Request], None] | None = None
        for _ in range(num_engines):
            self.add_engine()
        self.registry = make_registry(lambda: self.engines)

    # ------------------------------------------------------------------ topology
    def add_engine(self) -> Engine:
        """Add an engine core (the next ``engine`` label), e.g. "a GPU was added" as data parallelism."""
        engine = Engine(self.env, self.preset, index=len(self.engines), model_name=self.model_name)
        engine.server = self
        self.engines.append(engine)
        self._signals = None
        return engine

    def set_capacity(self, **changes: Any) -> None:
        """Apply :meth:`Engine.set_capacity` to every engine of this server."""
        for engine in self.engines:
            engine.set_capacity(**changes)

    def set_down(self) -> None:
        """The replica is lost: everything it holds is aborted and its page is unreachable."""
        if not self.up:
            return
        self.up = False
        self._signals = None
        for request in list(self._in_frontend):
            del self._in_frontend[request]
            self.count_finish(request, False)
            _abort_outside(request, self.env.now)
        for engine in self.engines:
            engine.set_down()

    def set_up(self) -> None:
        """The replica is back, as a fresh process: empty, counters from zero."""
        if self.up:
            return
        self.up = True
        self._signals = None
        self._frontend_free_at = [0.0] * self.frontend.workers
        for engine in self.engines:
            engine.set_up()

    # ------------------------------------------------------------------ requests
    def submit(self, request: Request) -> Any:
        """Send a request; returns a SimPy event that succeeds with the request when it finishes (or aborts).

        The common case (server up, no front-end cost, one engine core) hands the request to the engine in two
        calls (:meth:`_send`, the engine's ``_accept``): at hundreds of thousands of requests per simulated hour,
        each Python call on this path costs about a percent of the run.
        """
        done = request.done = simpy.Event(self.env)
        self._send(request)
        return done

    def submit_callback(self, request: Request, on_finish: Callable[[Request], None]) -> None:
        """Send a request; ``on_finish(request)`` is called when it finishes (or aborts). No event is created."""
        request.on_finish = on_finish
        self._send(request)

    def _send(self, request: Request) -> None:
        """The common case (server up, no front-end cost, one engine core) straight to the engine; else
        :meth:`_accept`."""
        engines = self.engines
        if self.up and self._frontend_free and len(engines) == 1:
            now = self.env.now
            request.arrival_time = now
            self.submitted += 1
            self.inflight += 1
            try:
                engines[0]._accept(request, now)
            except RequestTooLargeError:  # refused as vLLM answers 400: never accepted, so not counted
                self.submitted -= 1
                self.inflight -= 1
                raise
        else:
            self._accept(request)

    def abort(self, request: Request) -> bool:
        """Cancel a request wherever it is (front-end or engine)."""
        if request in self._in_frontend:
            del self._in_frontend[request]
            self.count_finish(request, False)
            _abort_outside(request, self.env.now)
            return True
        engine = request.engine
        return isinstance(engine, Engine) and engine in self.engines and engine.abort(request)

    def _accept(self, request: Request) -> None:
        now = self.env.now
        request.arrival_time = now
        engines = self.engines
        first = engines[0]
        prompt = request.prompt_tokens
        # check_fits' conditions first (as Engine._accept does): the call only to raise, with its reason, before
        # the request counts as accepted (a refused request is never in flight).
        if self.up and (
            prompt + request.output_tokens > (first.num_gpu_blocks - 1) * first.block_size
            or (prompt > first.max_num_batched_tokens and not first.chunked_prefill)
        ):
            first.check_fits(request)
        self.submitted += 1
        self.inflight += 1
        if not self.up:
            self.count_finish(request, False)
            _abort_outside(request, now)
            return
        if self._frontend_free:
            self._route(request)
            return
        # The API server works requests FIFO on its workers; the engine sees the request when that work is done.
        frontend = self.frontend
        free_workers = self._frontend_free_at
        free_at = free_workers[0]  # the worker free first takes it (heapreplace: the pop and the push in one call)
        done_at = max(now, free_at) + (frontend.fixed_ms + frontend.per_token_ms * prompt) / 1000.0
        heapq.heapreplace(free_workers, done_at)
        request.state = _FRONTEND
        self._in_frontend[request] = None
        # The transit latency holds no worker: it delays the request, not the ones behind it. The timeout carries
        # the request as its value, so one bound method serves every arrival (no closure per request).
        delay = done_at - now + frontend.latency_ms / 1000.0
        Timeout(self.env, delay, request).callbacks.append(self._on_frontend_done)

    def _frontend_done(self, event: simpy.Event) -> None:
        request: Request = event.value  # type: ignore[assignment]  # the timeout was given the request
        in_frontend = self._in_frontend
        if request not in in_frontend:
            return  # aborted meanwhile
        del in_frontend[request]
        engines = self.engines
        if len(engines) == 1:
            engines[0]._enqueue(request, self.env.now)  # arrival_time is set; a down engine aborts it
        else:
            self._route(request)

    def _route(self, request: Request) -> None:
        engines = self.engines
        if len(engines) == 1:
            engines[0].enqueue(request)  # a down engine aborts it
            return
        if self.router != "round_robin":
            # min(live engines, key=load) written out (first of equals), without a property call per engine: every
            # request of a data-parallel server is routed here.
            engine = None
            best = 0
            for candidate in engines:
                if candidate.up:
                    load = 4 * len(candidate.waiting) + len(candidate.running)
                    if engine is None or load < best:
                        engine, best = candidate, load
                        if not load:
                            break  # an idle engine: none after it can be less loaded (first of equals)
            if engine is not None:
                engine._enqueue(request, self.env.now)  # enqueue(): arrival_time is set (_accept) before routing
                return
        live = [e for e in engines if e.up]
        if not live:
            self.count_finish(request, False)
            _abort_outside(request, self.env.now)
            return
        live[0 if len(live) == 1 else next(self._rr) % len(live)].enqueue(request)

    def count_finish(self, request: Request, ok: bool) -> None:
        """Settle one request's end in this server's books: in flight -1, completed (``ok``) or aborted +1, then the
        server's hook. Each engine core calls it at each finish (:class:`OwningServer`), the server itself for a
        request no engine holds."""
        self.inflight -= 1
        if ok:
            self.completed += 1
        else:
            self.aborted += 1
        hook = self.on_request_finished
        if hook is not None:
            hook(request)

    # ------------------------------------------------------------------ signals
    def snapshot(self) -> EngineSnapshot:
        """The page's signals summed over engines, equal to ``parse_vllm_metrics(render_metrics(), model_name)``."""
        if not self.up:
            raise EngineDownError(f"{self.name} is down")
        return snapshot_of(self.signals(), cumulative_buckets(self.queue_counts()))

    def queue_counts(self) -> list[int]:
        """The live engines' queue-time histogram counts summed by bucket (not cumulative), kept with the signals.

        A fleet's every poll sums the buckets of every engine; summing a server's once per change of its signals
        (counts are ints: the order of the additions does not matter) leaves the poll a sum over replicas."""
        signals = self.signals()  # folds every live engine first (what Engine.queue_counts does for one)
        if self._counts_of is not signals:
            self._counts = add_counts([e._stats.queue_time.counts for e in self.engines if e.up])
            self._counts_of = signals
        return self._counts

    def signals(self) -> Signals:
        """:meth:`snapshot`'s values, kept until an engine of this server changes (``Engine._stale`` drops them)."""
        cached = self._signals
        if cached is None:
            cached = self._signals = combine_signals([e.signals() for e in self.engines if e.up])
        return cached

    def render_metrics(self) -> str:
        """The ``/metrics`` page as Prometheus text."""
        if not self.up:
            raise EngineDownError(f"{self.name} is down")
        return generate_latest(self.registry).decode("utf-8")

    @property
    def num_running(self) -> int:
        return sum(e.num_running for e in self.engines)

    @property
    def num_waiting(self) -> int:
        return sum(e.num_waiting for e in self.engines)


class Fleet:
    """Replicas behind a balancer: ``round_robin`` or ``least_loaded`` (fewest outstanding requests)."""

    def __init__(
        self,
        env: simpy.Environment,
        replicas: Iterable[Server] = (),
        *,
        balancer: Router = "round_robin",
    ) -> None:
        if balancer not in ("least_loaded", "round_robin"):
            raise ValueError(f"unknown balancer {balancer!r}")
        self.env = env
        self.balancer = balancer
        self.replicas: list[Server] = list(replicas)
        self._rr = itertools.count()

    @classmethod
    def of(
        cls,
        env: simpy.Environment,
        preset: EnginePreset,
        *,
        replicas: int = 2,
        engines_per_replica: int = 1,
        balancer: Router = "round_robin",
        model_name: str | None = None,
    ) -> Fleet:
        """``replicas`` identical servers of ``preset``."""
        servers = [
            Server(env, preset, num_engines=engines_per_replica, model_name=model_name, name=f"replica-{i}")
            for i in range(replicas)
        ]
        return cls(env, servers, balancer=balancer)

    @property
    def live(self) -> Sequence[Server]:
        return [s for s in self.replicas if s.up]

    def pick(self) -> Server | None:
        live = self.live
        if not live:
            return None
        if self.balancer == "round_robin":
            return live[next(self._rr) % len(live)]
        return min(live, key=_INFLIGHT)  # the first of equals, as before

    def submit(self, request: Request) -> Any:
        server = self.pick()
        if server is None:
            request.done = self.env.event()
            _abort_outside(request, self.env.now)
            return request.done
        return server.submit(request)

    def submit_callback(self, request: Request, on_finish: Callable[[Request], None]) -> None:
        if self.balancer == "least_loaded":
            # pick() written out (the first of the fewest in flight among live replicas): every client request of
            # a fleet comes through here, and the property, list and min(key=) cost a few percent of a fleet run.
            server = None
            best = 0
            for candidate in self.replicas:
                if candidate.up:
                    load = candidate.inflight
                    if server is None or load < best:
                        server, best = candidate, load
        else:
            server = self.pick()
        if server is None:
            request.on_finish = on_finish
            _abort_outside(request, self.env.now)
            return
        server.submit_callback(request, on_finish)

    def set_capacity(self, **changes: Any) -> None:
        for server in self.replicas:
            server.set_capacity(**changes)

    def snapshot(self) -> EngineSnapshot:
        """``sum by (model_name)`` over live replicas, KV usage the maximum (a Prometheus-API fleet source)."""
        up = [s for s in self.replicas if s.up]
        signals = combine_signals([s.signals() for s in up])
        return snapshot_of(signals, cumulative_buckets(add_counts([s.queue_counts() for s in up])))

    def render_metrics(self, replica: int) -> str:
        return self.replicas[replica].render_metrics()

    @property
    def inflight(self) -> int:
        return sum(s.inflight for s in self.replicas)

    @property
    def completed(self) -> int:
        return sum(s.completed for s in self.replicas)
