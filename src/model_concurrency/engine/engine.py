"""One vLLM V1 engine core on SimPy: a scheduler loop of continuous-batching steps.

Each step, as ``vllm/v1/core/sched/scheduler.py`` does it (docs/reference vllm.md):

1. running requests are served first: every decoding request gets 1 token, partially prefilled requests get a
   chunk of what remains, all under the ``max_num_batched_tokens`` budget;
2. each scheduled request must hold ``ceil(tokens / 16)`` KV blocks; walking the running list in order, a request
   that cannot get its block preempts the *last* running request (recompute: it loses its blocks and computed
   tokens, returns to the *head* of the waiting queue, ``num_preemptions`` += 1) until it fits or is itself the
   victim;
3. if nothing was preempted, waiting requests are admitted FCFS while ``len(running) < max_num_seqs``, budget
   remains and the head's first chunk gets its blocks; the first head that cannot is head-of-line blocking;
4. the step lasts ``StepTimeModel`` time; at its end prefills that completed sample their first token (embeddings
   finish there), decodes sample one token each, and requests that reached their length finish.

The gauges (running, waiting, KV usage) are recorded right after scheduling, as vLLM's scheduler stats are, so
``waiting > 0`` means a request was refused a slot in the latest step, not that one arrived mid-step.

Why it is fast. A saturated hour is ~10⁵ steps with hundreds of sequences each, so nothing may cost O(batch) per
step. Decoding requests all advance one token per step, so their progress is a function of the step counter
(``tick``): each stores its state at the tick it began decoding, and the engine keeps aggregates — the count, the
sum of context lengths (for the ``c`` term), how many sit at each position modulo the block size (so the new
blocks a step needs are one list lookup), and which tick each one finishes at. A step then costs O(prefills +
admissions + finishes). Only a step that runs out of KV blocks walks the running list (exactly as vLLM does).

Two simplifications, documented in docs/engine-model.md: when the budget cannot cover every running request,
decodes are served before partial prefills (vLLM V1 goes strictly in running-list order; the two differ only when
a long prompt is mid-prefill ahead of decodes and the budget binds), and decodes are never starved by the budget
(``max_num_batched_tokens >= max_num_seqs``, which vLLM enforces).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import Timeout

from model_concurrency.engine.presets import EnginePreset
from model_concurrency.engine.request import ABORT, Request, RequestState
from model_concurrency.engine.stats import FOLD_EVERY, EngineStats
from model_concurrency.observation import EngineSnapshot

if TYPE_CHECKING:
    from model_concurrency.engine.topology import Server

__all__ = ["Engine", "EngineDownError"]

_NEW = RequestState.NEW
_FRONTEND = RequestState.FRONTEND
_WAITING = RequestState.WAITING
_PREFILL = RequestState.PREFILL
_DECODE = RequestState.DECODE
_FINISHED = RequestState.FINISHED


def _admission_order(request: Request) -> int:
    return request.seq


class EngineDownError(ConnectionError):
    """The engine (or replica) is down: its ``/metrics`` cannot be read, like a refused connection."""


class Engine:
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
        self._set_coefficients()
        self.up = True
        # The Server this engine core belongs to: the engine settles its in-flight / completed / aborted counts
        # and calls its ``on_request_finished`` directly at each finish (one hook call per request was measurable).
        self.server: Server | None = None
        # Called for every finished request before its completion signal (after the server's books).
        self.on_request_finished: Callable[[Request], None] | None = None
        self._epoch = 0
        self._reset()
        self._start()

    # ------------------------------------------------------------------ state
    def _set_coefficients(self) -> None:
        step = self.preset.step
        scale = 1.0 / (1000.0 * self.speed)  # ms -> s, and the speed factor, folded into the coefficients
        self._a = step.a_ms * scale
        self._b = step.b_ms_per_token * scale
        self._c = step.c_ms_per_context_token * scale
        self._d = step.d_ms_per_token_sq * scale

    def _reset(self) -> None:
        self._stats = EngineStats()
        self.waiting: deque[Request] = deque()
        # Insertion-ordered dicts are the running list: O(1) removal of a finished request, popitem() is "last".
        self.running: dict[Request, None] = {}
        self.prefilling: dict[Request, None] = {}
        self.free_blocks = self.num_gpu_blocks - 1  # block 0 is vLLM's reserved null block
        self.tick = 0
        self._n_decode = 0
        self._decode_offset_sum = 0  # Σ (computed − tick) over decoding requests
        # Decoding requests by (computed − tick) mod block_size: the members of phase −tick need a block this step.
        self._phases: list[dict[Request, None]] = [{} for _ in range(self.block_size)]
        self._admissions = 0  # admission sequence number: the running list's order
        self._finish_at: dict[int, list[Request]] = {}
        self._sched_prefills: list[Request] = []
        self._sched_decodes = 0
        self._dt = 0.0
        self._stepping = False
        self._wake: Any = None
        self.steps = 0
        self.busy_time = 0.0
        self.tokens_scheduled = 0
        self.gauge_running = 0
        self.gauge_waiting = 0
        self.gauge_kv_usage = 0.0

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
        self.waiting.append(request)
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _accept(self, request: Request, now: float) -> None:
        """:meth:`check_fits` then :meth:`enqueue` in one call, for a server's direct path (``arrival_time`` set).

        A saturated run submits a request every few microseconds of wall time and a Python call is ~0.3 µs, so
        the server hands a request over in one call instead of four (``check_fits``, ``enqueue``, two ``now``).
        """
        prompt = request.prompt_tokens
        if prompt + request.output_tokens > (self.num_gpu_blocks - 1) * self.block_size or (
            prompt > self.max_num_batched_tokens and not self.chunked_prefill
        ):
            self.check_fits(request)  # raises, with the reason
        request.queued_time = now
        state = request.state
        if state != _NEW and state != _FRONTEND:
            raise ValueError(f"{request!r} was already submitted; a Request is single-use")
        request.engine = self
        if not self.up:
            self._finish(request, ABORT)
            return
        request.state = _WAITING
        self.waiting.append(request)
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def check_fits(self, request: Request) -> None:
        """Refuse what this engine could never run, as vLLM rejects prompts beyond its limits."""
        if request.prompt_tokens + request.output_tokens > (self.num_gpu_blocks - 1) * self.block_size:
            raise ValueError(f"{request!r} needs more KV blocks than the engine has ({self.num_gpu_blocks})")
        if not self.chunked_prefill and request.prompt_tokens > self.max_num_batched_tokens:
            raise ValueError(f"{request!r}: prompt longer than max_num_batched_tokens without chunked prefill")

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
        stats = self.stats  # folds deferred observations
        return EngineSnapshot(
            running=float(self.gauge_running),
            waiting=float(self.gauge_waiting),
            waiting_capacity=float(self.gauge_waiting),
            kv_cache_usage=self.gauge_kv_usage,
            kv_num_blocks=self.num_gpu_blocks,
            preemptions_total=float(stats.num_preemptions),
            success_total=float(stats.success_total),
            queue_time_sum_total=stats.queue_time.sum,
            queue_time_count_total=float(stats.queue_time.count),
        )

    # ------------------------------------------------------------------ the step loop
    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _loop(self, epoch: int) -> Generator[Any, Any, None]:
        env = self.env
        schedule = self._schedule
        complete = self._complete
        while True:
            dt = schedule()
            if dt is None:
                self._wake = env.event()
                yield self._wake
                if epoch != self._epoch:
                    return  # downed (and maybe restarted) while idle: the wake slot belongs to the new process
                self._wake = None
                continue
            self._stepping = True
            yield Timeout(env, dt)
            self._stepping = False
            if epoch != self._epoch:
                return
            complete()

    def _schedule(self) -> float | None:
        """Build the next batch; returns its duration, or None when there is nothing to run.

        This and :meth:`_complete` run once per step: locals instead of attribute lookups, and no per-decode work.
        """
        bs = self.block_size
        tick = self.tick
        n_decode = self._n_decode
        budget = self.max_num_batched_tokens - n_decode
        need = len(self._phases[-tick % bs]) if n_decode else 0
        sched = self._sched_prefills
        tokens = n_decode
        quadratic = 0
        # 1. running partial prefills, in running order, under what the decodes left of the budget
        for r in self.prefilling:
            chunk = r.prefill_target - r.computed
            if chunk > budget:
                chunk = budget if budget > 0 else 0
            r.chunk = chunk
            if chunk:
                budget -= chunk
                end = r.computed + chunk
                need += (end + bs - 1) // bs - r.blocks
                quadratic += chunk * end
                tokens += chunk
                sched.append(r)
        # 2. KV blocks for everything scheduled; the slow path walks the running list and preempts
        free = self.free_blocks
        preempted = False
        if need <= free:
            free -= need
            for r in sched:
                r.blocks = (r.computed + r.chunk + bs - 1) // bs
        else:
            preempted = self._allocate_or_preempt()
            free = self.free_blocks
            n_decode = self._n_decode
            sched[:] = [r for r in sched if r.state == _PREFILL]
            tokens = n_decode + sum(r.chunk for r in sched)
            quadratic = sum(r.chunk * (r.computed + r.chunk) for r in sched)
        # 3. admission, FCFS with head-of-line blocking, never in a step that preempted
        waiting = self.waiting
        running = self.running
        if waiting and not preempted:
            max_seqs = self.max_num_seqs
            prefilling = self.prefilling
            now = self.env.now
            admissions = self._admissions
            while waiting and budget > 0 and len(running) < max_seqs:
                r = waiting[0]
                chunk = r.prefill_target
                if chunk > budget:
                    if not self.chunked_prefill:
                        break
                    chunk = budget
                blocks = (chunk + bs - 1) // bs
                if blocks > free:
                    break  # head-of-line blocking: nobody behind may overtake
                waiting.popleft()
                free -= blocks
                budget -= chunk
                r.blocks = blocks
                r.chunk = chunk
                r.state = _PREFILL
                admissions += 1
                r.seq = admissions
                running[r] = None
                prefilling[r] = None
                if r.first_scheduled_time is None:
                    r.first_scheduled_time = now
                sched.append(r)
                tokens += chunk
                quadratic += chunk * chunk
            self._admissions = admissions
        self.free_blocks = free
        # Gauges as vLLM's scheduler stats: sampled right after scheduling.
        self.gauge_running = len(running)
        self.gauge_waiting = len(waiting)
        usage = 1.0 - free / (self.num_gpu_blocks - 1)
        self.gauge_kv_usage = usage if 0.0 <= usage <= 1.0 else min(max(usage, 0.0), 1.0)
        if tokens == 0:
            if preempted:
                return self._schedule()  # everything was preempted: admit afresh from the head
            if waiting and not running:
                # The head can never fit even an empty engine (capacity shrank under it): vLLM would have
                # rejected it, so abort it rather than spin.
                self._finish(waiting.popleft(), ABORT)
                return self._schedule()
            return None
        self._sched_decodes = n_decode
        dt = (
            self._a
            + self._b * tokens
            + self._c * (self._decode_offset_sum + n_decode * (tick + 1))
            + self._d * quadratic
        )
        self._dt = dt
        self.steps += 1
        self.busy_time += dt
        self.tokens_scheduled += tokens
        return dt

    def _allocate_or_preempt(self) -> bool:
        """vLLM's walk: each running request in order takes its blocks, preempting from the tail when short.

        Only requests that need a block this step can trigger a preemption (the rest take nothing), so the walk
        visits just those — the decodes in this tick's phase and the scheduled prefills — in running-list order
        (admission sequence), which is the same outcome as walking the whole list.
        """
        bs = self.block_size
        running = self.running
        free = self.free_blocks
        preempted = False
        candidates = [*self._phases[-self.tick % bs], *(r for r in self._sched_prefills if r.chunk)]
        candidates.sort(key=_admission_order)
        for r in candidates:
            state = r.state
            if state == _DECODE:
                need = 1
            elif state == _PREFILL:
                need = (r.computed + r.chunk + bs - 1) // bs - r.blocks
            else:
                break  # preempted already: so is everything after it
            while need > free:
                victim, _ = running.popitem()
                free += self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.state != state:
                break
            free -= need
            if state == _PREFILL:
                r.blocks += need
        self.free_blocks = free
        return preempted

    def _preempt(self, r: Request) -> int:
        """Recompute preemption: back to the head of the queue with nothing computed. Returns blocks freed."""
        if r.state == _DECODE:
            freed = self._leave_decode(r, self.tick, in_step=False)
        else:
            del self.prefilling[r]
            freed = r.blocks
            r.chunk = 0
        r.computed = 0
        r.blocks = 0
        r.prefill_target = r.prompt_tokens + r.generated
        r.state = _WAITING
        r.num_preemptions += 1
        self._stats.num_preemptions += 1
        self.waiting.appendleft(r)
        return freed

    def _leave_decode(self, r: Request, tick: int, *, in_step: bool) -> int:
        """Take a decoding request out of the aggregates, materialise its progress; returns the blocks it held."""
        offset = r.computed - r.tick_base
        self._n_decode -= 1
        self._decode_offset_sum -= offset
        del self._phases[offset % self.block_size][r]
        finish_tick = r.tick_base + r.output_tokens - r.generated
        advanced = tick - r.tick_base
        if finish_tick != tick:  # not the bucket being finished right now
            self._finish_at[finish_tick].remove(r)
        r.computed += advanced
        r.generated += advanced
        r.last_token_time = self.env.now
        # Mid-step, the block for the token being computed is already allocated.
        held = r.computed + 1 if in_step else r.computed
        return (held + self.block_size - 1) // self.block_size

    def _complete(self) -> None:
        """End of a step: decodes emit a token each, prefills advance, finished requests leave.

        Runs once per step and touches each finishing or prefill-completing request once, so the per-request work
        (leaving the decode aggregates, joining them, and :meth:`_finish`) is written out inline with the engine's
        state in locals: at a few hundred thousand requests per simulated hour, each Python call per request costs
        about a percent of the run. Callbacks fired from here (the server's hook, ``on_finish``) may re-enter the
        engine (``abort`` another request, ``submit``); containers are shared with ``self``, and everything a
        callback can read (``free_blocks``, stats, the server's counts) is updated before each callback in the
        same order as the one-call-per-request version (``_finish``).
        """
        now = self.env.now
        tick = self.tick = self.tick + 1
        stats = self._stats
        n = self._sched_decodes
        if n:
            stats.generation_tokens += n
            itl = stats.itl  # every decode of this step waited exactly one step for its token
            itl.counts[bisect_left(itl.bounds, self._dt)] += n
            itl.sum += self._dt * n
            itl.count += n
        server = self.server
        finishing = self._finish_at.pop(tick, None)
        if finishing:
            bs = self.block_size
            phases = self._phases
            running = self.running
            freed = 0
            offsets = 0
            for r in finishing:
                # _leave_decode: the request has reached its length exactly at this tick. The decode aggregates
                # are settled after the loop (nothing a callback can call reads them).
                base = r.tick_base
                offset = r.computed - base
                offsets += offset
                del phases[offset % bs][r]
                advanced = tick - base
                computed = r.computed = r.computed + advanced
                r.generated += advanced
                r.last_token_time = now
                freed += (computed + bs - 1) // bs
                del running[r]
                # _finish(r, r.stop_reason)
                reason = r.stop_reason
                r.state = _FINISHED
                r.finish_time = now
                r.finished_reason = reason
                r.blocks = 0
                stats = self._stats
                pending = stats.pending_finished
                pending.append(r)
                if len(pending) >= FOLD_EVERY:
                    stats.fold()
                if server is not None:
                    server.inflight -= 1
                    if reason != ABORT:
                        server.completed += 1
                    else:
                        server.aborted += 1
                    if server.on_request_finished is not None:
                        server.on_request_finished(r)
                if self.on_request_finished is not None:
                    self.on_request_finished(r)
                done = r.done
                if done is not None:
                    done.succeed(r)
                elif r.on_finish is not None:
                    r.on_finish(r)
            self._n_decode -= len(finishing)
            self._decode_offset_sum -= offsets
            self.free_blocks += freed
        sched = self._sched_prefills
        if sched:
            prefilling = self.prefilling
            phases = self._phases
            finish_at = self._finish_at
            bs = self.block_size
            joined = 0
            offsets = 0
            for r in sched:
                if r.state != _PREFILL:
                    continue  # preempted or aborted during the step
                computed = r.computed = r.computed + r.chunk
                r.chunk = 0
                if computed < r.prefill_target:
                    continue
                # The prompt (or its recompute) is complete: the first token, then decode or finish.
                del prefilling[r]
                stats = self._stats
                embedding = r.embedding
                if r.first_token_time is None:
                    r.first_token_time = now
                    stats.pending_first.append(r)  # TTFT and prompt tokens, folded on read
                elif not embedding:
                    stats.itl.observe(now - r.last_token_time)  # type: ignore[operator]  # after a recompute
                r.last_token_time = now
                if not embedding:
                    generated = r.generated = r.generated + 1
                    stats.generation_tokens += 1
                    if generated < r.output_tokens:
                        # Join the decode aggregates (module docstring): from here progress follows the tick. The
                        # count and offset sum are settled after the loop, like the finishing loop's.
                        offset = computed - tick
                        r.state = _DECODE
                        r.tick_base = tick
                        joined += 1
                        offsets += offset
                        phases[offset % bs][r] = None
                        finish_tick = tick + r.output_tokens - generated
                        bucket = finish_at.get(finish_tick)
                        if bucket is None:
                            finish_at[finish_tick] = [r]
                        else:
                            bucket.append(r)
                        continue
                self.free_blocks += r.blocks
                del self.running[r]
                # _finish(r, r.stop_reason)
                reason = r.stop_reason
                r.state = _FINISHED
                r.finish_time = now
                r.finished_reason = reason
                r.blocks = 0
                pending = stats.pending_finished
                pending.append(r)
                if len(pending) >= FOLD_EVERY:
                    stats.fold()
                if server is not None:
                    server.inflight -= 1
                    if reason != ABORT:
                        server.completed += 1
                    else:
                        server.aborted += 1
                    if server.on_request_finished is not None:
                        server.on_request_finished(r)
                if self.on_request_finished is not None:
                    self.on_request_finished(r)
                done = r.done
                if done is not None:
                    done.succeed(r)
                elif r.on_finish is not None:
                    r.on_finish(r)
            sched.clear()
            self._n_decode += joined
            self._decode_offset_sum += offsets

    def _finish(self, r: Request, reason: str) -> None:
        """A request leaves the engine: timestamps, counters, the owning server's books, its completion signal.

        :meth:`_complete` writes the same sequence out inline for the requests a step finishes (the hot path).
        """
        r.state = _FINISHED
        r.finish_time = self.env.now
        r.finished_reason = reason
        r.blocks = 0
        stats = self._stats
        pending = stats.pending_finished
        pending.append(r)  # counted and bucketed in batches on read (EngineStats.fold)
        if len(pending) >= FOLD_EVERY:
            stats.fold()
        server = self.server
        if server is not None:
            server.inflight -= 1
            if reason != ABORT:
                server.completed += 1
            else:
                server.aborted += 1
            hook = server.on_request_finished
            if hook is not None:
                hook(r)
        hook = self.on_request_finished
        if hook is not None:
            hook(r)
        if r.done is not None:
            r.done.succeed(r)
        elif r.on_finish is not None:
            r.on_finish(r)
