"""The limiter core against a reference model over random interleavings (hypothesis state machine).

Operations: acquire (immediate or queued), release by any holder, resize up and down (including shrink-then-grow
with holders in), cancel a queued waiter (also what a timeout does), cancel after grant (the canceller releases,
passing the slot on), and pinned acquires. Invariants: a gated call starts only while in-flight < limit; no
waiter waits while a slot is free; admission is FIFO; at teardown every waiter is served and no slot is leaked.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from model_concurrency.gate.limiter import LimiterCore


class LimiterMachine(RuleBasedStateMachine):
    @initialize(limit=st.integers(1, 6))
    def start(self, limit: int) -> None:
        self.core: LimiterCore[int] = LimiterCore(limit)
        self.limit = limit
        self.held: list[int] = []  # named gated holders, in grant order
        self.pinned = 0
        self.queue: list[int] = []  # the reference FIFO
        self.next_id = 0
        self.served: list[int] = []  # every waiter admitted from the queue, in admission order

    # -- reference admission ---------------------------------------------------------------------------------
    def _expect_admission(self, granted: list[int]) -> None:
        inflight = len(self.held) + self.pinned
        room = max(0, self.limit - inflight)
        expected = self.queue[: min(room, len(self.queue))]
        assert granted == expected, (granted, expected)
        for waiter in granted:
            self.queue.remove(waiter)
            self.held.append(waiter)
            self.served.append(waiter)
            # a gated call starts only while in-flight < limit
            assert len(self.held) + self.pinned <= self.limit

    # -- rules -----------------------------------------------------------------------------------------------
    @rule()
    def acquire(self) -> None:
        waiter = self.next_id
        self.next_id += 1
        before = len(self.held) + self.pinned
        if self.core.acquire_or_enqueue(waiter):
            assert not self.queue and before < self.limit
            self.held.append(waiter)
            assert len(self.held) + self.pinned <= self.limit
        else:
            assert self.queue or before >= self.limit
            self.queue.append(waiter)

    @rule()
    def acquire_pinned(self) -> None:
        self.core.acquire_pinned()
        self.pinned += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self.held))
        self.held.remove(holder)
        self._expect_admission(self.core.release())

    @precondition(lambda self: self.pinned)
    @rule()
    def release_pinned(self) -> None:
        self.pinned -= 1
        self._expect_admission(self.core.release())

    @rule(limit=st.integers(1, 8))
    def resize(self, limit: int) -> None:
        self.limit = limit
        self._expect_admission(self.core.resize(limit))

    @precondition(lambda self: len(self.held) + self.pinned >= 2)
    @rule(low=st.integers(1, 2), high=st.integers(3, 8))
    def shrink_then_grow(self, low: int, high: int) -> None:
        self.resize(low)
        self.resize(high)

    @precondition(lambda self: self.queue)
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        waiter = data.draw(st.sampled_from(self.queue))
        assert self.core.cancel(waiter) is True
        self.queue.remove(waiter)

    @precondition(lambda self: self.queue)
    @rule()
    def timeout_oldest(self) -> None:
        # A timed-out waiter is a cancelled one: withdrawn if still queued.
        waiter = self.queue[0]
        assert self.core.cancel(waiter) is True
        self.queue.pop(0)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def cancel_after_grant(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self.held))
        assert self.core.cancel(holder) is False  # granted already: the canceller passes its slot on
        self.held.remove(holder)
        self._expect_admission(self.core.release())

    # -- invariants ------------------------------------------------------------------------------------------
    @invariant()
    def matches_reference(self) -> None:
        assert self.core.inflight == len(self.held) + self.pinned
        assert self.core.waiting == len(self.queue)
        assert self.core.limit == self.limit

    @invariant()
    def nobody_waits_while_a_slot_is_free(self) -> None:
        if self.queue:
            assert self.core.inflight >= self.core.limit

    @invariant()
    def admission_is_fifo(self) -> None:
        assert self.served == sorted(self.served)

    def teardown(self) -> None:
        # Drain: releasing every holder must serve every waiter, in order, and leave nothing held.
        waiting = list(self.queue)
        while self.held or self.pinned:
            if self.pinned:
                self.pinned -= 1
            else:
                self.held.pop(0)
            self._expect_admission(self.core.release())
        assert not self.queue and self.served[-len(waiting) :] == waiting if waiting else True
        assert self.core.inflight == 0 and self.core.waiting == 0


LimiterMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestLimiterStateful = LimiterMachine.TestCase
