"""The lease protocol (lease.py): exact splits and grants, then its invariants over random sequences.

The exact tests walk the rules one call at a time and assert whole grants; the state machine drives a book with
random joins, renewals (handing back random amounts), departures, expiries and target changes, and checks I1-I4
after every step against its own mirror of what each worker holds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from model_concurrency.lease import (
    SOON,
    Fallback,
    Grant,
    LeaseBook,
    LeaseConfig,
    LeaseConfigError,
    Ledger,
    UnknownWorker,
    renew_in,
    renewal_due,
    split,
)
from model_concurrency.observation import CallStats

CONFIG = LeaseConfig(floor=4, ceiling=512)
LEASE_S = 24.0  # two 12-second polls
INTERVAL = LEASE_S / 2  # a renewal at the latest
SOON_S = SOON * INTERVAL  # a renewal while the worker's split is unsettled


def make_book(target: int = 10) -> LeaseBook:
    return LeaseBook("job-1", "llama", CONFIG, lease_s=LEASE_S, target=target)


def jain(values: list[int]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def grant(
    worker: str, permits: int, held: int, share: int, deadline: float, target: int = 10, renew: float = INTERVAL
) -> Grant:
    return Grant(worker, permits, held, share, None, 0, deadline, LEASE_S, target, None, renew)


# -- the split ---------------------------------------------------------------------------------------------------
def test_equal_claims_split_by_largest_remainder_ties_to_the_smaller_id() -> None:
    assert split(10, {"a": 10, "b": 10, "c": 10}) == {"a": 4, "b": 3, "c": 3}
    assert split(11, {"a": 10, "b": 10, "c": 10}) == {"a": 4, "b": 4, "c": 3}
    assert split(10, {"c": 10, "b": 10, "a": 10}) == {"a": 4, "b": 3, "c": 3}  # join order does not matter
    assert split(12, {"a": 10, "b": 10, "c": 10}) == {"a": 4, "b": 4, "c": 4}


def test_what_one_does_not_need_goes_to_the_others() -> None:
    assert split(10, {"a": 2, "b": 10, "c": 10}) == {"a": 2, "b": 4, "c": 4}
    assert split(10, {"a": 2, "b": 3, "c": 10}) == {"a": 2, "b": 3, "c": 5}
    assert split(10, {"a": 3, "b": 2}) == {"a": 3, "b": 2}  # demand short of the target: everybody gets it
    assert split(10, {"a": 0, "b": 5}) == {"a": 0, "b": 5}
    assert split(0, {"a": 3}) == {"a": 0}
    assert split(5, {}) == {}


def test_weights_split_in_proportion_under_the_demands() -> None:
    assert split(8, {"a": 8, "b": 8}, {"a": 1.0, "b": 3.0}) == {"a": 2, "b": 6}
    assert split(8, {"a": 8, "b": 3}, {"a": 1.0, "b": 3.0}) == {"a": 5, "b": 3}
    # exact 1.25, 1.25, 2.5: the largest remainder takes the spare permit
    assert split(5, {"a": 5, "b": 5, "c": 5}, {"a": 1.0, "b": 1.0, "c": 2.0}) == {"a": 1, "b": 1, "c": 3}


@given(workers=st.integers(1, 8), each=st.integers(0, 20), spare_demand=st.integers(0, 5))
def test_equal_workers_are_split_evenly(workers: int, each: int, spare_demand: int) -> None:
    demands = {f"w{i}": each + spare_demand for i in range(workers)}
    shares = split(each * workers, demands)
    assert jain(list(shares.values())) == 1.0
    assert set(shares.values()) <= {each}


# -- grants ------------------------------------------------------------------------------------------------------
def test_a_first_grant_is_the_share_and_lasts_lease_s() -> None:
    book = make_book(10)
    assert book.target == 10
    assert book.request("a", 6, now=100.0) == grant("a", 6, 6, 6, 124.0, renew=SOON_S)  # a join: others may come
    assert book.inflight() == 6
    assert LeaseBook("j", "m", CONFIG, lease_s=1.0).target == CONFIG.floor  # before the first poll: the floor


def test_a_newcomer_waits_for_headroom_then_the_shares_converge() -> None:
    book = make_book(10)
    assert book.request("a", 10, now=0.0).permits == 10
    assert book.request("b", 10, now=1.0) == grant("b", 0, 0, 5, 25.0, renew=SOON_S)  # share 5, but a holds all 10
    assert book.shares() == {"a": 5, "b": 5}
    assert book.renew("a", 10, unused=0, now=2.0) == grant("a", 5, 10, 5, 26.0, renew=SOON_S)  # 10 running: kept
    assert book.renew("a", 10, unused=6, now=3.0) == grant("a", 5, 5, 5, 27.0)  # 4 running: back to its share
    assert book.renew("b", 10, now=4.0) == grant("b", 5, 5, 5, 28.0)
    assert book.inflight() == 10
    assert jain([book.renew(w, 10, now=5.0).permits for w in ("a", "b")]) == 1.0


def test_a_cut_drains_and_no_grant_rises_above_the_target() -> None:
    book = make_book(12)
    for worker in "abc":
        assert book.request(worker, 4, now=0.0).permits == 4
    book.set_target(6, now=1.0)
    assert (book.shares(), book.inflight()) == ({"a": 2, "b": 2, "c": 2}, 12)  # nothing recalled: overhang 6
    steps = [  # (worker, calls it still runs) -> (permits, held, outstanding after)
        (("a", 4), (2, 4, 12)),
        (("b", 1), (1, 1, 9)),  # room 6 - 9 < 0: it keeps its one call, no more
        (("c", 0), (1, 1, 6)),  # the outstanding total reaches the target ...
        (("a", 2), (2, 2, 4)),
        (("b", 1), (2, 2, 5)),  # ... and is never raised above it again
        (("c", 1), (2, 2, 6)),
    ]
    for (worker, running), (permits, held, outstanding) in steps:
        unused = book.held()[worker] - running
        g = book.renew(worker, 4, unused=unused, now=2.0)
        assert (g.permits, g.held, book.inflight()) == (permits, held, outstanding)
        assert book.inflight() <= book.target + 6
    assert book.ledger() == Ledger(granted=12 + 3, returned=2 + 3 + 4, expired=0, outstanding=6)


def test_a_worker_past_its_deadline_loses_its_grant() -> None:
    book = make_book(10)
    book.request("a", 10, now=0.0)
    book.request("b", 10, now=10.0)
    assert book.expire(24.0) == []  # at the deadline, not past it
    assert book.expire(25.0) == ["a"]
    assert book.ledger() == Ledger(granted=10, returned=0, expired=10, outstanding=0)
    assert book.shares() == {"b": 10}
    assert book.renew("b", 10, now=26.0).permits == 10
    with pytest.raises(UnknownWorker, match="'a' holds no lease"):
        book.renew("a", 10, now=27.0)
    # It comes back with 3 calls it ran on its own meanwhile: they are counted, beyond the target (I1's exception)
    assert book.request("a", 10, inflight=3, now=28.0) == grant("a", 3, 3, 5, 52.0, renew=SOON_S)
    assert book.inflight() == 13
    assert book.ledger() == Ledger(granted=23, returned=0, expired=10, outstanding=13)


def test_a_restarted_worker_id_writes_its_old_grant_off() -> None:
    book = make_book(10)
    book.request("a", 10, now=0.0)
    assert book.request("a", 4, now=5.0).permits == 4
    assert book.ledger() == Ledger(granted=14, returned=0, expired=10, outstanding=4)


def test_leaving_returns_everything_at_once() -> None:
    book = make_book(10)
    book.request("a", 10, now=0.0)
    book.request("b", 10, now=0.0)
    assert book.leave("a", now=1.0) == 10
    assert book.leave("a", now=1.0) == 0  # safe to repeat
    assert book.shares() == {"b": 10}
    assert book.renew("b", 10, now=2.0).permits == 10
    assert book.ledger() == Ledger(granted=20, returned=10, expired=0, outstanding=10)


def test_renewals_hand_back_what_is_unused_and_no_more() -> None:
    book = make_book(10)
    book.request("a", 8, now=0.0)
    assert book.renew("a", 3, unused=5, now=1.0) == grant("a", 3, 3, 3, 25.0)
    with pytest.raises(ValueError, match="hands back 4 permits and 0 tokens but holds 3 and 0"):
        book.renew("a", 3, unused=4, now=2.0)
    with pytest.raises(ValueError, match="unused must be an int >= 0"):
        book.renew("a", 3, unused=-1, now=2.0)
    assert book.ledger() == Ledger(granted=8, returned=5, expired=0, outstanding=3)  # refusals changed nothing
    assert book.renew("a", 0, unused=3, now=3.0).permits == 0  # no demand: share 0
    assert book.ledger() == Ledger(granted=8, returned=8, expired=0, outstanding=0)


def test_reports_are_summed_until_drained() -> None:
    book = make_book(10)
    book.request("a", 5, now=0.0)
    book.request("b", 5, now=0.0)
    first = CallStats(calls=3, errors=1, throttled=1, latency_sum_s=1.5, latency_min_s=0.2, ok_latency_sum_s=1.0)
    second = CallStats(calls=2, latency_sum_s=1.0, latency_min_s=0.1, ok_latency_sum_s=1.0, server_errors=1)
    book.renew("a", 5, report=first, tokens_used=300, now=1.0)
    book.renew("b", 5, report=second, tokens_used=200, now=1.0)
    book.leave("a", report=CallStats(calls=1, latency_sum_s=0.5), now=2.0)
    assert book.drain_stats() == CallStats(
        calls=6,
        errors=1,
        throttled=1,
        latency_sum_s=3.0,
        latency_min_s=0.1,
        ok_latency_sum_s=2.0,
        server_errors=1,
    )
    assert book.drain_tokens_used() == 500
    assert (book.drain_stats(), book.drain_tokens_used()) == (CallStats(), 0)


def test_a_worker_with_another_configuration_is_refused() -> None:
    book = make_book(10)
    book.request("a", 5, config=CONFIG, now=0.0)
    other = LeaseConfig(floor=8, ceiling=512)
    with pytest.raises(LeaseConfigError) as refused:
        book.request("b", 5, config=other, now=0.0)
    assert isinstance(refused.value, ValueError)
    message = str(refused.value)
    assert "LeaseConfig(floor=8, ceiling=512, policy=None)" in message
    assert "LeaseConfig(floor=4, ceiling=512, policy=None)" in message
    assert "'job-1'" in message and "'llama'" in message and "'b'" in message
    assert book.shares() == {"a": 5}
    with pytest.raises(ValueError, match="ceiling must be an int >= 1"):
        LeaseConfig(floor=4, ceiling=0)


def test_the_token_budget_is_leased_by_the_same_rules() -> None:
    book = make_book(10)
    book.set_target(10, tokens=1000, now=0.0)
    a = book.request("a", 5, now=0.0)
    assert (a.tokens, a.held_tokens, a.job_tokens) == (1000, 1000, 1000)
    b = book.request("b", 5, tokens=300, now=0.0)
    assert (b.permits, b.tokens) == (5, 0)  # its token share is 300, but a holds the whole budget
    assert book.renew("a", 5, unused_tokens=600, now=1.0).tokens == 700  # 400 in use; share 1000 - 300
    assert book.renew("b", 5, tokens=300, now=1.0).tokens == 300
    assert book.ledger(tokens=True) == Ledger(granted=1600, returned=600, expired=0, outstanding=1000)
    book.set_target(10, None, now=2.0)  # the budget is dropped: not enforced, counted tokens only come back
    a = book.renew("a", 5, unused_tokens=100, now=3.0)
    assert (a.tokens, a.held_tokens, a.job_tokens) == (None, 600, None)
    assert book.ledger(tokens=True) == Ledger(granted=1600, returned=700, expired=0, outstanding=900)


def test_bad_arguments_are_refused() -> None:
    book = make_book(10)
    for kwargs in ({"weight": 0.0}, {"weight": float("inf")}, {"inflight": -1}, {"tokens": -5}):
        with pytest.raises(ValueError):
            book.request("a", 5, now=0.0, **kwargs)
    with pytest.raises(ValueError, match="demand must be an int >= 0"):
        book.request("a", True, now=0.0)
    with pytest.raises(ValueError, match="lease_s"):
        LeaseBook("j", "m", CONFIG, lease_s=0.0)
    assert book.shares() == {} and book.inflight() == 0


# -- when to renew -----------------------------------------------------------------------------------------------
def test_a_renewal_comes_once_an_interval_sooner_while_unsettled_never_later_than_half_the_lease() -> None:
    assert renew_in(INTERVAL, unsettled=False) == INTERVAL
    assert renew_in(INTERVAL, unsettled=True) == SOON_S
    # On the worker's clock, from the answer; a late answer never pushes the renewal past half the lease
    g = grant("a", 5, 5, 5, 124.0, renew=4.5)
    assert renewal_due(g, sent_at=10.0, answered_at=10.5) == 15.0
    assert renewal_due(g, sent_at=10.0, answered_at=19.0) == 10.0 + INTERVAL


def test_while_the_coordinator_polls_sooner_than_a_renewal_the_renewal_follows_its_next_poll() -> None:
    gap = 1.5  # a first ramp's poll gap, under the 12 s interval
    assert renew_in(INTERVAL, unsettled=False, decide_in=gap) == gap * (1 + SOON)
    assert renew_in(INTERVAL, unsettled=True, decide_in=gap) == SOON_S  # already sooner: unchanged
    assert renew_in(INTERVAL, unsettled=False, decide_in=INTERVAL) == INTERVAL  # regular polls: the interval
    assert renew_in(INTERVAL, unsettled=False, decide_in=0.0) == INTERVAL  # a poll overdue: nothing to wait for
    assert renew_in(INTERVAL, unsettled=False, decide_in=-3.0) == INTERVAL
    book = make_book(10)
    book.set_target(10, now=0.0)
    book.request("a", 10, now=0.0)
    assert book.renew("a", 10, now=1.0).renew_in_s == INTERVAL  # the next poll's time unknown
    book.set_target(10, now=2.0, decide_in=gap)
    assert book.renew("a", 10, now=2.5).renew_in_s == pytest.approx((2.0 + gap - 2.5) * (1 + SOON))
    book.set_target(10, now=4.0, decide_in=INTERVAL)
    assert book.renew("a", 10, now=4.0).renew_in_s == INTERVAL
    with pytest.raises(ValueError, match="decide_in must be a finite number"):
        book.set_target(10, now=5.0, decide_in=float("nan"))


def test_a_worker_joining_a_full_target_has_its_share_after_short_renewals_not_an_interval() -> None:
    """The first worker to ask takes the whole target; the next one's share comes back to it as the first one's
    calls end, a short renewal at a time (before: at the first one's renewal, a whole interval after it joined)."""
    book = make_book(10)
    book.set_target(10, now=0.0)
    a = book.request("a", 10, now=0.0)
    assert (a.permits, a.renew_in_s) == (10, SOON_S)  # a join renews soon: others may be joining too
    b = book.request("b", 10, now=0.0)
    assert (b.permits, b.share, b.renew_in_s) == (0, 5, SOON_S)  # short of its share: soon too
    a = book.renew("a", 10, unused=0, now=SOON_S)  # all 10 of a's calls still run: it drains ...
    assert (a.permits, a.held, a.renew_in_s) == (5, 10, SOON_S)
    b = book.renew("b", 10, now=SOON_S)
    assert (b.permits, b.renew_in_s) == (0, SOON_S)
    a = book.renew("a", 10, unused=6, now=2 * SOON_S)  # ... 6 of them ended: 4 run, topped up to its share
    assert (a.permits, a.held) == (5, 5)
    assert a.renew_in_s == INTERVAL  # settled: an interval from now
    b = book.renew("b", 10, now=2 * SOON_S)
    assert (b.permits, b.held, b.share) == (5, 5, 5)
    assert 2 * SOON_S < INTERVAL / 4


def test_after_a_cut_a_worker_short_of_its_share_renews_soon_and_the_others_an_interval_on() -> None:
    book = make_book(12)
    book.set_target(12, now=0.0)
    first = {w: book.request(w, 4, now=0.0) for w in "abc"}
    assert {g.permits for g in first.values()} == {4}
    settled = {w: book.renew(w, 4, now=g.renew_in_s) for w, g in first.items()}
    assert {g.renew_in_s for g in settled.values()} == {INTERVAL}
    book.set_target(6, now=5.0)  # the poll cuts the target
    cut = {w: book.renew(w, 4, unused=book.held()[w], now=6.0) for w in "abc"}  # their calls all ended
    # a handed back first, while b and c still held 8 of the 6: it waits a short renewal (I1)
    assert {w: (g.permits, g.job_target) for w, g in cut.items()} == {"a": (0, 6), "b": (2, 6), "c": (2, 6)}
    assert cut["a"].renew_in_s == SOON_S
    assert cut["b"].renew_in_s == cut["c"].renew_in_s == INTERVAL
    assert book.renew("a", 4, now=6.0 + SOON_S).permits == 2


# -- the worker's fallback ---------------------------------------------------------------------------------------
def test_a_worker_falls_back_to_its_last_grant_never_the_ceiling() -> None:
    fallback = Fallback(CONFIG, lease_s=LEASE_S, started_at=0.0)
    assert (fallback.lapsed(24.0), fallback.lapsed(24.5)) == (False, True)  # a coordinator that never answered
    assert (fallback.start_target(), fallback.start_tokens()) == (CONFIG.floor, None)
    book = make_book(100)
    book.set_target(100, tokens=5000, now=0.0)
    # The book's clock is another process's: the worker times its lease from when it sent the request.
    fallback.granted(book.request("a", 37, now=1000.0), sent_at=10.0)
    assert (fallback.deadline, fallback.lapsed(34.0), fallback.lapsed(34.5)) == (34.0, False, True)
    assert (fallback.start_target(), fallback.start_tokens()) == (37, 5000)
    fallback.granted(book.renew("a", 0, unused=37, now=1001.0), sent_at=11.0)
    assert fallback.start_target() == CONFIG.floor  # a grant of nothing: the floor, the static configuration
    wide = LeaseBook("j", "m", CONFIG, lease_s=LEASE_S, target=2000)
    fallback.granted(wide.request("a", 2000, now=0.0), sent_at=12.0)
    assert fallback.start_target() == CONFIG.ceiling  # within the bounds, as the worker's own runtime would clamp


# -- invariants over random sequences ----------------------------------------------------------------------------
WORKERS = [f"w{i}" for i in range(6)]
DEMANDS = st.integers(0, 12)
WEIGHTS = st.sampled_from([1.0, 1.0, 0.5, 2.0])
TOKEN_DEMANDS = st.none() | st.integers(0, 60)


class LeaseMachine(RuleBasedStateMachine):
    @initialize(initial=st.integers(0, 30))
    def start(self, initial: int) -> None:
        self.book = LeaseBook("job", "model", CONFIG, lease_s=LEASE_S, target=initial)
        self.now = 0.0
        self.held: dict[str, int] = {}  # the mirror: what each worker holds after its last answer
        self.held_tokens: dict[str, int] = {}
        self.deadline: dict[str, float] = {}
        self.claim: dict[str, tuple[int, float]] = {}  # demand, weight
        self.tally = [0, 0, 0]  # granted, returned, expired, counted from the answers alone
        self.overhang = self._excess()  # X of I2: what is out beyond the target, never raised by a grant

    def _excess(self) -> int:
        return max(0, self.book.inflight() - self.book.target)

    def _after_grant(self, g: Grant, before: int, before_tokens: int, demand: int, *, joined: bool = False) -> None:
        assert 0 <= g.permits <= g.share <= demand  # I4, and a limit never above the share
        assert 0 < g.renew_in_s <= INTERVAL
        unsettled = g.held != g.permits or g.permits < g.share
        if g.tokens is not None:
            unsettled = unsettled or g.held_tokens != g.tokens
        if unsettled or joined:  # just joined, others hold its share, or it holds more than its limit: soon
            assert g.renew_in_s <= SOON_S
        elif g.tokens is None:  # settled (the token side has a share of its own this test does not track)
            assert g.renew_in_s == INTERVAL
        assert g.held == max(g.permits, before) and g.deadline == self.now + LEASE_S
        self.tally[0] += g.held - before
        self.held[g.worker], self.held_tokens[g.worker] = g.held, g.held_tokens
        self.deadline[g.worker] = g.deadline
        budget = self.book.token_target
        if budget is None:
            assert g.tokens is None and g.held_tokens == before_tokens
        else:
            assert g.tokens is not None and g.held_tokens == max(g.tokens, before_tokens)
            assert self.book.ledger(tokens=True).outstanding <= max(budget, self._tokens_before)  # I1 for tokens
        # I1: a grant raises the outstanding total only up to the target
        assert self.book.inflight() <= max(self.book.target, self._before)
        assert self.book.inflight() <= self.book.target + self.overhang  # I2
        self.overhang = min(self.overhang, self._excess())

    def _snapshot(self) -> None:
        self._before = self.book.inflight()
        self._tokens_before = self.book.ledger(tokens=True).outstanding

    @rule(worker=st.sampled_from(WORKERS), demand=DEMANDS, weight=WEIGHTS, inflight=st.integers(0, 3))
    def request(self, worker: str, demand: int, weight: float, inflight: int) -> None:
        old = self.held.pop(worker, 0)  # a restart: the old grant is written off
        self.tally[2] += old
        self.held_tokens.pop(worker, None)
        self.overhang += inflight  # calls brought along exist whatever the book says
        self._snapshot()
        self._before += inflight - old
        self.tally[0] += inflight
        g = self.book.request(worker, demand, weight=weight, inflight=inflight, now=self.now)
        self.claim[worker] = (demand, weight)
        self._after_grant(g, inflight, 0, demand, joined=True)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), demand=DEMANDS, tokens=TOKEN_DEMANDS, report=st.integers(0, 5))
    def renew(self, data: st.DataObject, demand: int, tokens: int | None, report: int) -> None:
        worker = data.draw(st.sampled_from(sorted(self.held)))
        unused = data.draw(st.integers(0, self.held[worker]))
        unused_tokens = data.draw(st.integers(0, self.held_tokens[worker]))
        self.tally[1] += unused
        self._snapshot()
        self._before -= unused
        self._tokens_before -= unused_tokens
        g = self.book.renew(
            worker,
            demand,
            unused=unused,
            unused_tokens=unused_tokens,
            tokens=tokens,
            report=CallStats(calls=report),
            now=self.now,
        )
        self.claim[worker] = (demand, self.claim[worker][1])
        self._after_grant(g, self.held[worker] - unused, self.held_tokens[worker] - unused_tokens, demand)

    @rule(worker=st.sampled_from(WORKERS))
    def leave(self, worker: str) -> None:
        held = self.held.pop(worker, 0)
        self.held_tokens.pop(worker, None)
        self.claim.pop(worker, None)
        assert self.book.leave(worker, now=self.now) == held
        self.tally[1] += held

    @rule(elapsed=st.sampled_from([0.0, 5.0, 12.0, 24.0, 30.0]))
    def expire(self, elapsed: float) -> None:
        self.now += elapsed
        lapsed = sorted(w for w, deadline in self.deadline.items() if w in self.held and self.now > deadline)
        assert self.book.expire(self.now) == lapsed
        for worker in lapsed:
            self.tally[2] += self.held.pop(worker)
            self.held_tokens.pop(worker)
            self.claim.pop(worker)

    @rule(requests=st.integers(0, 40), tokens=st.none() | st.integers(0, 200))
    def set_target(self, requests: int, tokens: int | None) -> None:
        self.book.set_target(requests, tokens, now=self.now)
        self.overhang = self._excess()

    @rule(worker=st.sampled_from(WORKERS))
    def renew_unknown(self, worker: str) -> None:
        if worker not in self.held:
            with pytest.raises(UnknownWorker):
                self.book.renew(worker, 1, now=self.now)

    # -- invariants --------------------------------------------------------------------------------------------
    @invariant()
    def shares_fill_the_target_under_the_demands(self) -> None:
        shares = self.book.shares()
        assert sorted(shares) == sorted(self.claim)
        demand = sum(d for d, _ in self.claim.values())
        assert sum(shares.values()) == min(self.book.target, demand)
        assert all(0 <= shares[w] <= self.claim[w][0] for w in shares)

    @invariant()
    def equal_claims_get_equal_shares(self) -> None:
        shares = self.book.shares()
        groups: dict[tuple[int, float], list[int]] = {}
        for worker, claim in self.claim.items():
            groups.setdefault(claim, []).append(shares[worker])
        for values in groups.values():
            assert max(values) - min(values) <= 1
        if len(groups) == 1 and self.book.target % len(self.claim) == 0:
            assert jain(next(iter(groups.values()))) == 1.0

    @invariant()
    def every_permit_is_accounted_for(self) -> None:
        ledger = self.book.ledger()
        assert self.book.held() == dict(sorted(self.held.items()))
        assert ledger == Ledger(self.tally[0], self.tally[1], self.tally[2], sum(self.held.values()))
        assert ledger.granted == ledger.returned + ledger.expired + ledger.outstanding
        tokens = self.book.ledger(tokens=True)
        assert tokens.granted == tokens.returned + tokens.expired + tokens.outstanding
        assert tokens.outstanding == sum(self.held_tokens.values())

    @invariant()
    def outstanding_stays_within_the_target_and_the_overhang(self) -> None:
        assert self.book.inflight() <= self.book.target + self.overhang


LeaseMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=50, deadline=None)
TestLeaseStateful = LeaseMachine.TestCase
