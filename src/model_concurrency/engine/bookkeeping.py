"""An engine core's books: the running set's state, the end of a step, and how a request leaves.

Why the state looks like this. A saturated hour is ~10⁵ steps with hundreds of sequences each, so nothing may cost
O(batch) per step. Decoding requests all advance one token per step, so their progress is a function of the step
counter (``tick``): each stores its state at the tick it began decoding, and the engine keeps aggregates — the
count, the sum of context lengths (for the attention term of the step time), how many sit at each position modulo
the block size (so the new blocks a step needs are one list lookup), and which tick each one finishes at. A step
then costs O(prefills + admissions + finishes). Only a step that runs out of KV blocks walks the running list
(:mod:`.scheduler`, exactly as vLLM does).

:class:`Bookkeeping` holds that state and its per-request transitions (joining and leaving the decode
aggregates, finishing); :class:`~model_concurrency.engine.scheduler.Scheduler` builds batches on it and
:class:`~model_concurrency.engine.engine.Engine` adds the public API and the step loop.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import simpy

from model_concurrency.engine.presets import EnginePreset
from model_concurrency.engine.request import _DECODE, _FINISHED, _PREFILL, ABORT, Request
from model_concurrency.engine.stats import FOLD_EVERY, EngineStats

__all__ = ["SIGNAL_FIELDS", "Bookkeeping", "OwningServer", "Signals"]

# What a snapshot reads, as a plain tuple (an EngineSnapshot costs ~3 µs to build; a fleet's polls read 64 engines
# 80 times a second): the EngineSnapshot fields named in SIGNAL_FIELDS, in that order; counters as floats, exactly
# the values EngineSnapshot carries.
Signals = tuple[float, float, float, int, int, float, float, float, float, float]
SIGNAL_FIELDS = (
    "running",
    "waiting",
    "kv_cache_usage",
    "kv_num_blocks",
    "kv_tokens",
    "preemptions_total",
    "success_total",
    "generation_tokens_total",
    "queue_time_sum_total",
    "queue_time_count_total",
)


class OwningServer(Protocol):
    """What an engine core settles at each finish in the server that owns it (``topology.Server`` is one).

    The engine settles the server's books (in flight, completed or aborted, the server's hook) through one call per
    finish, the same the server makes for a request no engine holds; declaring it here keeps the engine below the
    topology that owns it, with no import up.
    """

    def count_finish(self, request: Request, ok: bool) -> None: ...

    _signals: Signals | None


def priority_key(r: Request) -> tuple[int, float]:
    """vLLM's order under ``--scheduling-policy priority``: lower priority value first, then earlier arrival."""
    return (r.priority, r.arrival_time or 0.0)


class Bookkeeping:
    """Queues, running set, KV blocks and decode aggregates of one engine core, and their per-request updates."""

    env: simpy.Environment
    preset: EnginePreset
    block_size: int
    chunked_prefill: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    by_priority: bool  # scheduling_policy "priority": waiting in (priority, arrival) order, victims by the same key
    # The Server this engine core belongs to: the engine settles its in-flight / completed / aborted counts and
    # calls its ``on_request_finished`` directly at each finish (one hook call per request was measurable).
    server: OwningServer | None
    # Called for every finished request before its completion signal (after the server's books).
    on_request_finished: Callable[[Request], None] | None
    # The last snapshot's values, until something it reports changes (:meth:`_stale`).
    _signals: Signals | None

    def _stale(self) -> None:
        """What a snapshot reports may have changed: drop this engine's cached signals and its server's.

        Everything a snapshot reads (the step's gauges, the counters, the block count, up or down) changes only
        in a step (:meth:`_complete` then ``_schedule``), an abort, a capacity change or a restart, and each of
        those calls this. A fleet's clients read every engine at every poll, most of them between two steps."""
        self._signals = None
        server = self.server
        if server is not None:
            server._signals = None

    def _reset(self) -> None:
        self._stale()
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

    def _insert_waiting(self, r: Request) -> None:
        """Queue ``r`` behind every waiting request of a smaller or equal (priority, arrival), as vLLM's priority
        queue orders them (a preempted request goes back to its place by the same key, not to the head)."""
        waiting = self.waiting
        waiting.insert(bisect_right(waiting, priority_key(r), key=priority_key), r)

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
        of leaving and joining the decode aggregates is written out inline with the engine's state in locals; the
        finish itself is one :meth:`_finish` call. Callbacks fired from there (the server's hook, ``on_finish``)
        may re-enter the engine (``abort`` another request, ``submit``): containers are shared with ``self``, and
        the decode count and offset sum, which no callback path reads, are settled after each loop.
        """
        now = self.env.now
        tick = self.tick = self.tick + 1
        stats = self._stats
        finish = self._finish
        bs = self.block_size
        n = self._sched_decodes
        if n:
            stats.generation_tokens += n
            itl = stats.itl  # every decode of this step waited exactly one step for its token
            itl.counts[bisect_left(itl.bounds, self._dt)] += n
            itl.sum += self._dt * n
            itl.count += n
        finishing = self._finish_at.pop(tick, None)
        if finishing:
            phases = self._phases
            running = self.running
            freed = 0
            offsets = 0
            for r in finishing:
                # _leave_decode for a request that reached its length exactly at this tick
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
                finish(r, r.stop_reason)
            self._n_decode -= len(finishing)
            self._decode_offset_sum -= offsets
            self.free_blocks += freed
        sched = self._sched_prefills
        if sched:
            prefilling = self.prefilling
            phases = self._phases
            finish_at = self._finish_at
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
                        # Join the decode aggregates: from here progress follows the tick.
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
                finish(r, r.stop_reason)
            sched.clear()
            self._n_decode += joined
            self._decode_offset_sum += offsets

    def _finish(self, r: Request, reason: str) -> None:
        """A request leaves the engine: timestamps, counters, the owning server's books, its completion signal.

        Every finish goes through here: a step's completions (:meth:`_complete`), aborts, a lost engine.
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
            server.count_finish(r, reason != ABORT)
        hook = self.on_request_finished
        if hook is not None:
            hook(r)
        if r.done is not None:
            r.done.succeed(r)
        elif r.on_finish is not None:
            r.on_finish(r)
