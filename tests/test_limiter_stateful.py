"""The limiter core against a reference model over random interleavings (hypothesis state machine).

Operations: acquire (immediate or queued) with a random number of units (zero = unweighted), release by any
holder, resize up and down (including shrink-then-grow with holders in), change the units budget (None = not
enforced, down below what is held, up), cancel a queued waiter (also what a timeout does), cancel after grant
(the canceller releases, passing the slot on), and pinned acquires. Invariants: a gated call starts only while
in-flight < limit and its units fit the budget (or nothing else is in flight); no waiter waits while the head of
the queue would fit; admission is FIFO; at teardown every waiter is served and no slot or unit is leaked.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from model_concurrency.gate.limiter import LimiterCore

UNITS = st.integers(0, 12)
BUDGETS = st.none() | st.integers(1, 20)


class LimiterMachine(RuleBasedStateMachine):
    @initialize(limit=st.integers(1, 6), budget=BUDGETS)
    def start(self, limit: int, budget: int | None) -> None:
        self.core: LimiterCore[int] = LimiterCore(limit, budget)
        self.limit = limit
        self.budget = budget
        self.held: dict[int, int] = {}  # named gated holders -> their units, in grant order
        self.pinned: list[int] = []  # units of each pinned holder
        self.queue: list[tuple[int, int]] = []  # the reference FIFO of (waiter, units)
        self.next_id = 0
        self.served: list[int] = []  # every waiter admitted from the queue, in admission order

    # -- the reference rule ----------------------------------------------------------------------------------
    def _inflight(self) -> int:
        return len(self.held) + len(self.pinned)

    def _units(self) -> int:
        return sum(self.held.values()) + sum(self.pinned)

    def _fits(self, units: int) -> bool:
        inflight = self._inflight()
        if inflight >= self.limit:
            return False
        return self.budget is None or units == 0 or inflight == 0 or self._units() + units <= self.budget

    def _expect_admission(self, granted: list[int]) -> None:
        expected = []
        while self.queue and self._fits(self.queue[0][1]):
            waiter, units = self.queue.pop(0)
            self.held[waiter] = units
            self.served.append(waiter)
            expected.append(waiter)
            # a gated call starts only while in-flight < limit, and within the budget unless it runs alone
            assert self._inflight() <= self.limit
            if self.budget is not None and units > 0 and self._inflight() > 1:
                assert self._units() <= self.budget
        assert granted == expected, (granted, expected)

    # -- rules -----------------------------------------------------------------------------------------------
    @rule(units=UNITS)
    def acquire(self, units: int) -> None:
        waiter = self.next_id
        self.next_id += 1
        fits = not self.queue and self._fits(units)
        if self.core.acquire_or_enqueue(waiter, units):
            assert fits
            self.held[waiter] = units
        else:
            assert not fits
            self.queue.append((waiter, units))

    @rule(units=UNITS)
    def try_acquire(self, units: int) -> None:
        fits = not self.queue and self._fits(units)
        assert self.core.try_acquire(units) is fits
        if fits:
            self.held[self.next_id] = units
            self.next_id += 1

    @rule(units=UNITS)
    def acquire_pinned(self, units: int) -> None:
        self.core.acquire_pinned(units)
        self.pinned.append(units)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(sorted(self.held)))
        units = self.held.pop(holder)
        self._expect_admission(self.core.release(units))

    @precondition(lambda self: self.pinned)
    @rule()
    def release_pinned(self) -> None:
        units = self.pinned.pop()
        self._expect_admission(self.core.release(units))

    @rule(limit=st.integers(1, 8))
    def resize(self, limit: int) -> None:
        self.limit = limit
        self._expect_admission(self.core.resize(limit))

    @rule(budget=BUDGETS)
    def set_budget(self, budget: int | None) -> None:
        self.budget = budget
        self._expect_admission(self.core.set_budget(budget))

    @precondition(lambda self: self._inflight() >= 2)
    @rule(low=st.integers(1, 2), high=st.integers(3, 8))
    def shrink_then_grow(self, low: int, high: int) -> None:
        self.resize(low)
        self.resize(high)

    @precondition(lambda self: self._units() >= 2)
    @rule(low=st.integers(1, 2), high=st.integers(10, 30))
    def budget_shrink_then_grow(self, low: int, high: int) -> None:
        self.set_budget(low)
        self.set_budget(high)

    @precondition(lambda self: self.queue)
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.queue))
        assert self.core.cancel(entry[0]) is True
        self.queue.remove(entry)
        # Withdrawing a large head lets the smaller ones behind it in.
        self._expect_admission(self.core.admit())

    @precondition(lambda self: self.queue)
    @rule()
    def timeout_oldest(self) -> None:
        # A timed-out waiter is a cancelled one: withdrawn if still queued.
        waiter, _ = self.queue.pop(0)
        assert self.core.cancel(waiter) is True
        self._expect_admission(self.core.admit())

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def cancel_after_grant(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(sorted(self.held)))
        assert self.core.cancel(holder) is False  # granted already: the canceller passes its slot on
        units = self.held.pop(holder)
        self._expect_admission(self.core.release(units))

    @rule(units=st.integers(-3, -1) | st.sampled_from([True, 1.5]))  # type: ignore[arg-type]
    def bad_units_are_refused(self, units: int) -> None:
        before = (self.core.inflight, self.core.units, self.core.waiting)
        for call in (self.core.try_acquire, self.core.acquire_pinned):
            try:
                call(units)
            except ValueError:
                pass
            else:
                raise AssertionError(f"{units!r} accepted")
        assert (self.core.inflight, self.core.units, self.core.waiting) == before

    # -- invariants ------------------------------------------------------------------------------------------
    @invariant()
    def matches_reference(self) -> None:
        assert self.core.inflight == self._inflight()
        assert self.core.units == self._units()
        assert self.core.waiting == len(self.queue)
        assert self.core.limit == self.limit
        assert self.core.budget == self.budget

    @invariant()
    def nobody_waits_while_the_head_fits(self) -> None:
        if self.queue:
            assert not self.core.fits(self.queue[0][1])

    @invariant()
    def admission_is_fifo(self) -> None:
        assert self.served == sorted(self.served)

    def teardown(self) -> None:
        # Drain: releasing every holder must serve every waiter, in order, and leave nothing held.
        waiting = [w for w, _ in self.queue]
        while self.held or self.pinned:
            units = self.pinned.pop() if self.pinned else self.held.pop(next(iter(self.held)))
            self._expect_admission(self.core.release(units))
        assert not self.queue and self.served[-len(waiting) :] == waiting if waiting else True
        assert self.core.inflight == 0 and self.core.waiting == 0 and self.core.units == 0


LimiterMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestLimiterStateful = LimiterMachine.TestCase
