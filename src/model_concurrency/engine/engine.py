"""One vLLM V1 engine core on SimPy: the public API and the loop of continuous-batching steps.

(Over 400 lines: the step loop and the public API share the engine's hot-path state; the layers below it are split
out already.)

The engine is three layers, each readable on its own: :mod:`.bookkeeping` (queues, running set, KV blocks, the
decode aggregates that make a step O(prefills + admissions + finishes), and how a request finishes),
:mod:`.scheduler` (which requests run in the next step, as vLLM V1 decides) and :mod:`.steptime` (how long the
step takes). This module adds what callers use — submit, abort, capacity changes, losing and restarting the
engine, the snapshot of its signals — and the SimPy process that alternates scheduling and completing steps.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from itertools import accumulate
from typing import Any

import simpy
from simpy.events import Event, Timeout

from model_concurrency.engine.bookkeeping import SIGNAL_FIELDS, Signals
from model_concurrency.engine.presets import EnginePreset
from model_concurrency.engine.request import (
    _DECODE,
    _FINISHED,
    _FRONTEND,
    _NEW,
    _PREFILL,
    _WAITING,
    ABORT,
    Request,
)
from model_concurrency.engine.scheduler import Scheduler
from model_concurrency.engine.stats import REQUEST_LATENCY_BUCKETS, EngineStats
from model_concurrency.observation import Buckets, EngineSnapshot

__all__ = [
    "Engine",
    "EngineDownError",
    "RequestTooLargeError",
    "combine_signals",
    "cumulative_buckets",
    "queue_buckets",
    "snapshot_of",
]

# The queue-time histogram's bounds as a page prints them (``le``), +Inf last.
_QUEUE_BOUNDS = (*REQUEST_LATENCY_BUCKETS, float("inf"))


def snapshot_of(
    signals: Signals, waits: Buckets | None = None, *, waiting_capacity: float | None = None
) -> EngineSnapshot:
    """The snapshot of an engine's (or a sum of engines') :data:`Signals` and queue-time buckets.

    An engine's waiting requests all wait for capacity; a sum of pages says how many of its own did
    (``waiting_capacity``)."""
    fields: dict[str, Any] = dict(zip(SIGNAL_FIELDS, signals, strict=True))
    if waiting_capacity is None:
        waiting_capacity = fields["waiting"]
    return EngineSnapshot(**fields, waiting_capacity=waiting_capacity, queue_time_buckets=waits)


def queue_buckets(engines: Iterable[Engine]) -> Buckets:
    """The engines' queue-time histograms summed by bound, as cumulative pairs (what a page's buckets sum to).

    Kept out of :data:`Signals`, which the balancer reads at every step: the buckets are read only by a poll."""
    return cumulative_buckets([sum(column) for column in zip(*(e.queue_counts() for e in engines), strict=True)])


def cumulative_buckets(per_bound: list[int]) -> Buckets:
    """Per-bucket queue-time counts (summed over engines) as a page's cumulative ``(le, count)`` pairs."""
    return tuple(zip(_QUEUE_BOUNDS, map(float, accumulate(per_bound)), strict=True))


def combine_signals(signals: Iterable[Signals]) -> Signals:
    """Sum signals as :func:`~model_concurrency.engine.topology.combine_snapshots` sums snapshots (each count
    added in page order from 0.0, KV usage the maximum, first of equals), so the floats are the same bits."""
    running = waiting = preemptions = success = generated = queue_sum = queue_count = 0.0
    kv_usage = -1.0
    blocks = tokens = 0
    n = 0
    for s in signals:
        running += s[0]
        waiting += s[1]
        if not n or s[2] > kv_usage:
            kv_usage = s[2]
        blocks += s[3]
        tokens += s[4]
        preemptions += s[5]
        success += s[6]
        generated += s[7]
        queue_sum += s[8]
        queue_count += s[9]
        n += 1
    if not n:
        raise EngineDownError("no live engine to read")
    return (running, waiting, kv_usage, blocks, tokens, preemptions, success, generated, queue_sum, queue_count)


class EngineDownError(ConnectionError):
    """The engine (or replica) is down: its ``/metrics`` cannot be read, like a refused connection."""


class RequestTooLargeError(ValueError):
    """A request this engine could never run, refused at submission as vLLM answers it with HTTP 400.

    vLLM refuses a prompt beyond ``max_model_len`` (here: more tokens than the KV cache holds) or, without chunked
    prefill, longer than ``max_num_batched_tokens``. The request is not queued and no engine counter moves; the
    caller fails that one item (the lab's client, the emulator's 400) and the run goes on.
    """


class Engine(Scheduler):
    """One engine core: waiting queue, running batch, KV blocks, one SimPy process stepping them.

    Readable state for the lab: ``waiting`` (deque) and ``running`` (ordered dict) hold live requests;
    ``gauge_running``, ``gauge_waiting``, ``gauge_kv_usage`` are the values exported at the latest step;
    ``free_blocks``, ``kv_usage`` (live), ``steps``, ``busy_time`` (simulated seconds spent stepping),
    ``tokens_scheduled``, and ``stats`` (:class:`EngineStats`: counters and histograms). Capacity fields
    (``max_num_seqs``, ``max_num_batched_tokens``, ``num_gpu_blocks``, ``speed``) change through
    :meth:`set_capacity` only.
    """

    def __init__(self, env: simpy.Environment, preset: EnginePreset, *, index: int = 0, model_name: str | None = None):
        self.env = env
        self.preset = preset
        self.index = index
        self.label = str(index)
        self.model_name = model_name or preset.model_name
        self.block_size = preset.block_size
        self.chunked_prefill = preset.chunked_prefill
        self.max_num_seqs = preset.max_num_seqs
        self.max_num_batched_tokens = preset.max_num_batched_tokens
        self.num_gpu_blocks = preset.num_gpu_blocks
        self.speed = 1.0
        # vLLM's --scheduling-policy priority: the waiting queue is kept in (priority, arrival) order.
        self.by_priority = preset.scheduling_policy == "priority"
        self._set_coefficients()
        self.up = True
        self.server = None
        self.on_request_finished = None
        self._epoch = 0
        self._reset()
        self._start()

    # ------------------------------------------------------------------ state
    def _set_coefficients(self) -> None:
        self._step_seconds = self.preset.step.compile(self.speed)

    def _start(self) -> None:
        self.env.process(self._loop(self._epoch))

    # ------------------------------------------------------------------ public API
    def submit(self, request: Request) -> Any:
        """Queue ``request`` now; returns a SimPy event that succeeds with the request when it finishes."""
        self.check_fits(request)
        request.done = self.env.event()
        self.enqueue(request)
        return request.done

    def submit_callback(self, request: Request, on_finish: Callable[[Request], None]) -> None:
        """Like :meth:`submit` but calls ``on_finish(request)`` at the finish instead of firing an event."""
        self.check_fits(request)
        request.on_finish = on_finish
        self.enqueue(request)

    def enqueue(self, request: Request) -> None:
        """Put a request (completion signal set up, size checked by :meth:`check_fits`) into the waiting queue."""
        now = self.env.now
        if request.arrival_time is None:
            request.arrival_time = now
        self._enqueue(request, now)

    def _enqueue(self, request: Request, now: float) -> None:
        request.queued_time = now
        state = request.state
        if state != _NEW and state != _FRONTEND:
            raise ValueError(f"{request!r} was already submitted; a Request is single-use")
        request.engine = self
        if not self.up:
            self._finish(request, ABORT)
            return
        request.state = _WAITING
        if self.by_priority:
            self._insert_waiting(request)
        else:
            self.waiting.append(request)
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _accept(self, request: Request, now: float) -> None:
        """:meth:`check_fits` then :meth:`enqueue` in one call, for a server's direct path (``arrival_time`` set).

        A saturated run submits a request every few microseconds of wall time and a Python call is ~0.3 µs, so
        the server hands a request over in two calls instead of five (``check_fits``, ``enqueue``, two ``now``):
        the fit is checked inline and raises through :meth:`check_fits` only when the request does not fit.
        """
        prompt = request.prompt_tokens
        if prompt + request.output_tokens > (self.num_gpu_blocks - 1) * self.block_size or (
            prompt > self.max_num_batched_tokens and not self.chunked_prefill
        ):
            self.check_fits(request)  # raises, with the reason
        self._enqueue(request, now)

    def check_fits(self, request: Request) -> None:
        """Refuse what this engine could never run, as vLLM rejects prompts beyond its limits."""
        if request.prompt_tokens + request.output_tokens > (self.num_gpu_blocks - 1) * self.block_size:
            raise RequestTooLargeError(f"{request!r} needs more KV blocks than the engine has ({self.num_gpu_blocks})")
        if not self.chunked_prefill and request.prompt_tokens > self.max_num_batched_tokens:
            raise RequestTooLargeError(
                f"{request!r}: prompt longer than max_num_batched_tokens without chunked prefill"
            )

    def abort(self, request: Request) -> bool:
        """Cancel a request (client gave up); it finishes with ``finished_reason="abort"``. False if not here."""
        state = request.state
        if request.engine is not self or state == _FINISHED:
            return False
        if state == _WAITING:
            self.waiting.remove(request)
        elif state == _PREFILL:
            del self.running[request], self.prefilling[request]
            self.free_blocks += request.blocks
        elif state == _DECODE:
            del self.running[request]
            self.free_blocks += self._leave_decode(request, self.tick, in_step=self._stepping)
        else:
            return False
        self._stale()
        self._finish(request, ABORT)
        return True

    def set_capacity(
        self,
        *,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        num_gpu_blocks: int | None = None,
        speed: float | None = None,
    ) -> None:
        """Change capacity at run time; takes effect from the next step.

        ``speed`` divides every step's duration (2.0 = twice as fast). Growing ``num_gpu_blocks`` frees blocks at
        once; shrinking it below what is held makes the next steps preempt until the running set fits. Running
        requests beyond a lowered ``max_num_seqs`` are not evicted; admission simply waits until they drain.
        """
        seqs = self.max_num_seqs if max_num_seqs is None else int(max_num_seqs)
        budget = self.max_num_batched_tokens if max_num_batched_tokens is None else int(max_num_batched_tokens)
        if seqs < 1 or budget < seqs:
            raise ValueError("need 1 <= max_num_seqs <= max_num_batched_tokens")
        if num_gpu_blocks is not None:
            if num_gpu_blocks < 2:
                raise ValueError("num_gpu_blocks must be >= 2")
            self.free_blocks += int(num_gpu_blocks) - self.num_gpu_blocks
            self.num_gpu_blocks = int(num_gpu_blocks)
        if speed is not None:
            if not speed > 0:
                raise ValueError("speed must be > 0")
            self.speed = float(speed)
            self._set_coefficients()
        self.max_num_seqs, self.max_num_batched_tokens = seqs, budget
        self._stale()
        self._poke()

    def set_down(self) -> None:
        """Lose the engine: every queued and running request is aborted; submissions abort until :meth:`set_up`."""
        if not self.up:
            return
        self.up = False
        self._epoch += 1  # the stepping process notices and exits
        victims = [*self.running, *self.waiting]
        wake = self._wake
        stats = self._stats
        self._reset()
        self._stats = stats  # keep the counters so the lab can read what happened; /metrics is unreachable anyway
        for request in victims:
            self._finish(request, ABORT)
        if wake is not None and not wake.triggered:
            wake.succeed()

    def set_up(self) -> None:
        """Bring a downed engine back as a fresh process: empty queues, counters from zero."""
        if self.up:
            return
        self.up = True
        self._epoch += 1
        self._reset()
        self._start()

    def progress(self, request: Request) -> tuple[int, int]:
        """``(computed tokens, generated tokens)`` of a request now, including a decoding one."""
        if request.state == _DECODE and request.engine is self:
            advanced = self.tick - request.tick_base
            return request.computed + advanced, request.generated + advanced
        return request.computed, request.generated

    @property
    def stats(self) -> EngineStats:
        """Counters and histograms up to now (folding the per-request observations deferred by the hot path)."""
        self._stats.fold()
        return self._stats

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def load(self) -> int:
        """vLLM's data-parallel balancing score: waiting × 4 + running (live, not the last step's gauges)."""
        return 4 * len(self.waiting) + len(self.running)

    @property
    def kv_usage(self) -> float:
        """``1 − free / (num_gpu_blocks − 1)``, clamped to [0, 1] (blocks may be over-held right after a shrink)."""
        usage = 1.0 - self.free_blocks / (self.num_gpu_blocks - 1)
        return min(max(usage, 0.0), 1.0)

    def snapshot(self) -> EngineSnapshot:
        """This engine's signals, exactly as ``parse_vllm_metrics`` reads them from :func:`render_metrics`."""
        if not self.up:
            raise EngineDownError(f"engine {self.label} of {self.model_name} is down")
        return snapshot_of(self.signals(), queue_buckets([self]))

    def queue_counts(self) -> list[int]:
        """The queue-time histogram's per-bucket counts (not cumulative), every finished request folded in."""
        self.signals()  # folds the deferred observations unless nothing changed since the last fold
        return self._stats.queue_time.counts

    def signals(self) -> Signals:
        """What :meth:`snapshot` reports, as a tuple (:data:`Signals`), kept until something it reports changes.

        A read that finds them kept would have folded nothing (every change that leaves observations pending drops
        them), so the fold points, and so the histograms' float sums, are the same however often it is read."""
        cached = self._signals
        if cached is None:
            stats = self._stats
            if stats.pending_finished or stats.pending_first:
                stats.fold()  # the deferred observations (what the ``stats`` property does)
            blocks = self.num_gpu_blocks
            queue = stats.queue_time
            cached = self._signals = (
                float(self.gauge_running),
                float(self.gauge_waiting),
                self.gauge_kv_usage,
                blocks,
                blocks * self.block_size,
                float(stats.num_preemptions),
                float(sum(stats._finished.values())),  # success_total without its second fold
                float(stats.generation_tokens),
                queue.sum,
                float(queue.count),
            )
        return cached

    # ------------------------------------------------------------------ the step loop
    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _loop(self, epoch: int) -> Generator[Any, Any, None]:
        """The step loop: schedule a step, wait for it (or for work), complete it, again.

        A process only to start where a process's first step runs; then callbacks on the same events the loop
        waited on (the step's timeout, the wake event), created at the same moments, so each keeps its place in
        the queue, without a generator resumed per step (a fleet run takes millions of steps). ``epoch``: a loop
        whose engine went down (and maybe came back, with a new loop) stops at its next event.
        """
        env = self.env
        schedule = self._schedule
        complete = self._complete
        stale = self._stale

        def run() -> None:
            dt = schedule()
            stale()  # the step that ended (complete) and the one scheduled changed what a snapshot reads
            if dt is None:
                wake = self._wake = Event(env)
                wake.callbacks.append(woken)
                return
            self._stepping = True
            Timeout(env, dt).callbacks.append(stepped)

        def woken(_event: Event) -> None:
            if epoch != self._epoch:
                return  # downed (and maybe restarted) while idle: the wake slot belongs to the new loop
            self._wake = None
            run()

        def stepped(_event: Event) -> None:
            self._stepping = False
            if epoch != self._epoch:
                return
            stale()
            complete()
            run()

        run()
        return
        yield  # a generator, for env.process
