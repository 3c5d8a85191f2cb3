"""An engine core's scheduler: which requests run in the next step, as vLLM V1's scheduler decides.

Each step, as ``vllm/v1/core/sched/scheduler.py`` does it (docs/reference vllm.md):

1. running requests are served first: every decoding request gets 1 token, partially prefilled requests get a
   chunk of what remains, all under the ``max_num_batched_tokens`` budget;
2. each scheduled request must hold ``ceil(tokens / 16)`` KV blocks; walking the running list in order, a request
   that cannot get its block preempts the *last* running request (recompute: it loses its blocks and computed
   tokens, returns to the *head* of the waiting queue, ``num_preemptions`` += 1) until it fits or is itself the
   victim;
3. if nothing was preempted, waiting requests are admitted in queue order (FCFS; with
   ``scheduling_policy="priority"`` by (priority, arrival), and a preemption evicts the running request with the
   largest (priority, arrival) instead of the last) while ``len(running) < max_num_seqs``, budget
   remains and the head's first chunk gets its blocks; the first head that cannot is head-of-line blocking;
4. the step lasts what the preset's step-time model says for the batch (:mod:`.steptime`).

The gauges (running, waiting, KV usage) are recorded right after scheduling, as vLLM's scheduler stats are, so
``waiting > 0`` means a request was refused a slot in the latest step, not that one arrived mid-step.

Two simplifications, documented in docs/engine-model.md: when the budget cannot cover every running request,
decodes are served before partial prefills (vLLM V1 goes strictly in running-list order; the two differ only when
a long prompt is mid-prefill ahead of decodes and the budget binds), and decodes are never starved by the budget
(``max_num_batched_tokens >= max_num_seqs``, which vLLM enforces).
"""

from __future__ import annotations

from collections.abc import Callable

from model_concurrency.engine.bookkeeping import Bookkeeping, priority_key
from model_concurrency.engine.request import _DECODE, _PREFILL, _WAITING, ABORT, Request

__all__ = ["Scheduler"]


def _admission_order(request: Request) -> int:
    return request.seq


class Scheduler(Bookkeeping):
    """Builds each step's batch on the books of :class:`Bookkeeping` and prices it with the step-time model."""

    # (scheduled tokens, Σ decode context, Σ prefill chunk × (chunk start + chunk)) -> seconds, speed included
    _step_seconds: Callable[[int, int, int], float]

    def _schedule(self) -> float | None:
        """Build the next batch; returns its duration, or None when there is nothing to run.

        This and ``_complete`` run once per step: locals instead of attribute lookups, and no per-decode work.
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
        dt = self._step_seconds(tokens, self._decode_offset_sum + n_decode * (tick + 1), quadratic)
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
        # FCFS evicts the tail, so a request found preempted means everything after it is too; priority evicts
        # the largest (priority, arrival) wherever it sits, so the walk goes on past a victim.
        by_priority = self.by_priority
        took: set[Request] = set()  # decodes that took their block in this walk (a priority victim may be one)
        for r in candidates:
            state = r.state
            if state == _DECODE:
                need = 1
            elif state == _PREFILL:
                need = (r.computed + r.chunk + bs - 1) // bs - r.blocks
            elif by_priority:
                continue
            else:
                break  # preempted already: so is everything after it
            while need > free:
                if by_priority:
                    victim = max(running, key=priority_key)
                    del running[victim]
                    # A victim earlier in the walk already took this step's block: it comes back too.
                    free += victim in took
                else:
                    victim, _ = running.popitem()
                free += self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r.state != state:
                if by_priority:
                    continue
                break
            free -= need
            if state == _PREFILL:
                r.blocks += need
            elif by_priority:
                took.add(r)
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
        if self.by_priority:
            self._insert_waiting(r)
        else:
            self.waiting.appendleft(r)
        return freed
