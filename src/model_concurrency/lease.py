"""Permits leased by one coordinator per (job, model) to the workers of a fan-out: the protocol as bookkeeping.

(Over 400 lines: the whole protocol in one place, its split, invariants, renewal timing and the worker's fall-back,
so the Ray coordinator, the Ray worker and the lab's job import one definition of each.)

A fan-out over many Ray workers should behave as one client of the model: one runtime polls the engine and
decides the job's target, and the workers share it. The :class:`LeaseBook` is that sharing, with no Ray, no I/O
and no clock of its own (every call is told ``now``), so a Ray actor, the lab's simulator and the tests run the
same rules. A worker ``request``s once, ``renew``s when its grant says (:func:`renewal_due`) and ``leave``s at the
end; the coordinator calls ``set_target`` on every poll and ``expire`` to take back what killed workers held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from fractions import Fraction

from model_concurrency.observation import CallStats

__all__ = ["Fallback", "Grant", "LeaseBook", "LeaseConfig", "LeaseConfigError", "Ledger", "UnknownWorker"]
__all__ += ["add_stats", "renew_in", "renewal_due", "split"]

# A permit is one call in flight. A grant names two figures: ``permits``, the most calls the worker may have in
# flight until its deadline (its own limiter is resized to it), and ``held``, what the book counts with it:
# ``permits``, or more while calls it had in flight when its share fell still run (a call cannot be recalled, so a
# shrink drains, as in the limiter core). At each renewal the worker lowers its own limit and hands back what it
# does not use, ``unused = held - its calls in flight now``, so no permit is ever counted twice.
#
# Shares: the job's target split among the workers with demand, by weight, water-filling (nobody above its demand;
# what one does not need goes to the others); integers by largest remainder, ties to the smaller worker id. Redone
# on every operation: a poll, a demand that changed, a worker that came or went.
#
# A grant raises a worker's holding towards its share only within the headroom, the target less what all hold.
# With O the outstanding total (the sum of ``held``) and T the target:
#
# I1  no grant over the target: a request or a renewal leaves O <= max(T, O before it), plus only the calls a
#     (re)joining worker declares it already runs (``inflight=``): they exist whatever the book says;
# I2  hence the overhang drains: O <= T + X, X being what was out beyond the target right after it was last cut
#     (plus what rejoining workers brought); no grant raises X, and it falls as workers hand permits back;
# I3  every permit is accounted for: granted = returned + expired + outstanding (:meth:`LeaseBook.ledger`);
# I4  0 <= share <= demand, and the shares add up to min(T, total demand).
#
# A token budget, when the job has one, is a second dimension under the same rules; without one, grants carry
# ``tokens=None`` (not enforced) and tokens already counted only come back.
#
# When to renew (:func:`renew_in`, the grant's ``renew_in_s``): once per renewal interval (half the lease), and
# sooner (a fraction of the interval) while the split is unsettled for this worker: it just joined (others may hold
# its share), it holds less than its share (others still hold the difference), or more than its limit (calls from
# before a cut still run, and what ends is handed back). Seconds from the answer, so the workers' clocks need not
# agree with the book's. Renewals are not timed to the coordinator's regular polls: a job whose workers all take
# each new target right after the poll acts on it in one step, and jobs sharing a fleet that way keep it queued.
# Only while the coordinator decides sooner than a renewal interval (its first ramp polls every few round trips)
# is a renewal due just after its next decision (:func:`renew_in`'s ``decide_in``): a ramp's step that reached the
# workers an interval late would leave the job at its floor while its policy reads the unused target as
# application-limited and holds.

# The sooner renewal while unsettled, as a fraction of the renewal interval.
SOON = 0.0625


class LeaseConfigError(ValueError):
    """A worker joined a job with a configuration that differs from the one the job runs."""


class UnknownWorker(LookupError):
    """A renewal from a worker the book does not hold (it expired or never joined): it must request again."""


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """What every worker of a job must agree on; compared whole, so a new field joins the check by itself."""

    floor: int
    ceiling: int
    # The coordinator runs one policy for the whole job: a worker configured with another is refused. None: unstated.
    policy: str | None = None

    def __post_init__(self) -> None:
        _whole(self.floor, 1, "floor")
        _whole(self.ceiling, 1, "ceiling")

    def clamp(self, value: int) -> int:
        """The controller's bounds: the floor wins over a lower ceiling."""
        return max(self.floor, min(value, max(self.floor, self.ceiling)))


@dataclass(frozen=True, slots=True)
class Grant:
    """A worker's lease until ``deadline`` (the book's clock); ``lease_s`` lets the worker time it on its own."""

    worker: str
    permits: int  # the most calls the worker may have in flight from now
    held: int  # what the book counts with it: permits, or more while calls from before a shrink drain
    share: int  # its split of the target; permits fall short of it while others still hold the difference
    tokens: int | None  # its token limit; None: the job has no token budget
    held_tokens: int
    deadline: float
    lease_s: float
    job_target: int
    job_tokens: int | None
    renew_in_s: float  # when to renew, in seconds from this answer (:func:`renewal_due`)


@dataclass(frozen=True, slots=True)
class Ledger:
    """Where every permit (or token) ever granted went (I3)."""

    granted: int
    returned: int
    expired: int
    outstanding: int


def _whole(value: int, least: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
    return value


def _maybe(value: int | None, what: str) -> int | None:
    return None if value is None else _whole(value, 0, what)


def _weight(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"weight must be a finite number > 0, got {value!r}")
    return float(value)


def split(target: int, demands: Mapping[str, int], weights: Mapping[str, float] | None = None) -> dict[str, int]:
    """Water-filling by weight under each demand, in exact fractions (equal claims get equal exact shares), then
    integers by largest remainder with ties to the smaller id: the rounding never depends on join order."""
    shares = dict.fromkeys(demands, 0)
    want = {w: d for w, d in demands.items() if d > 0}
    if target <= 0 or not want:
        return shares
    weight = {w: Fraction(weights.get(w, 1.0)) if weights else Fraction(1) for w in want}
    exact: dict[str, Fraction] = {}
    open_, left = set(want), Fraction(target)
    while open_:
        level = left / sum(weight[w] for w in open_)
        full = {w for w in open_ if want[w] <= level * weight[w]}
        if not full:
            exact.update((w, level * weight[w]) for w in open_)
            break
        for w in full:
            exact[w] = Fraction(want[w])
            left -= want[w]
        open_ -= full
    for w, x in exact.items():
        shares[w] = math.floor(x)
    spare = min(target, sum(want.values())) - sum(shares.values())
    # Only shares below their demand have a remainder, so a +1 never lifts one above its demand.
    for w in sorted(exact, key=lambda w: (shares[w] - exact[w], w))[:spare]:
        shares[w] += 1
    return shares


def renew_in(interval: float, *, unsettled: bool, decide_in: float | None = None) -> float:
    """Seconds from the answer until a worker renews: the renewal interval (half the lease), a fraction of it while
    ``unsettled``; and no later than just after the coordinator's next decision when that is ``decide_in`` seconds
    away and sooner than the renewal (a fraction ``SOON`` of the gap after it, so the renewal reads the new target)."""
    due = SOON * interval if unsettled else interval
    if decide_in is not None and 0 < decide_in * (1 + SOON) < due:
        return decide_in * (1 + SOON)
    return due


def renewal_due(grant: Grant, *, sent_at: float, answered_at: float) -> float:
    """When the worker renews, on its own clock: ``renew_in_s`` after the answer came, and never later than half the
    lease after the call was sent (a late answer must not also delay the renewal that keeps the lease)."""
    return min(answered_at + grant.renew_in_s, sent_at + grant.lease_s / 2)


def add_stats(a: CallStats, b: CallStats) -> CallStats:
    """Two workers' reports as one process's: counts and sums add, minima take the smaller."""
    merged: dict[str, object] = {}
    for f in fields(CallStats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        merged[f.name] = (y if x is None else x if y is None else min(x, y)) if f.name.endswith("_min_s") else x + y
    return CallStats(**merged)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Worker:
    weight: float
    demand: int
    token_demand: int | None  # None: as many tokens as its share of the budget
    deadline: float = -math.inf


class _Pool:
    """One dimension, permits or tokens: its target (None: not enforced), each worker's share and holding, I3."""

    __slots__ = ("expired", "granted", "held", "returned", "shares", "target")

    def __init__(self, target: int | None) -> None:
        self.target = target
        self.held: dict[str, int] = {}
        self.shares: dict[str, int] = {}
        self.granted = self.returned = self.expired = 0

    def outstanding(self) -> int:
        return sum(self.held.values())

    def drop(self, worker: str, *, expired: bool) -> None:
        count = self.held.pop(worker, 0)
        self.shares.pop(worker, None)
        self.expired += count if expired else 0
        self.returned += 0 if expired else count

    def top_up(self, worker: str) -> int | None:
        """Raise the worker towards its share within the headroom (I1); above its share it keeps what it holds and
        is given its share as its limit. None: not enforced."""
        if self.target is None:
            return None
        held = self.held[worker]
        limit = min(self.shares[worker], held + max(0, self.target - self.outstanding()))
        if limit > held:
            self.granted += limit - held
            self.held[worker] = limit
        return limit


class LeaseBook:
    """The leases of one (job, model): shares of the job's target, what each worker holds, and their reports."""

    def __init__(self, job: str, model: str, config: LeaseConfig, *, lease_s: float, target: int | None = None) -> None:
        """``target`` is the job's until the first poll: the floor by default."""
        if not 0 < lease_s < math.inf:
            raise ValueError(f"lease_s must be a finite number of seconds > 0, got {lease_s!r}")
        self.job, self.model, self.config, self.lease_s = job, model, config, float(lease_s)
        self._permits = _Pool(config.floor if target is None else _whole(target, 0, "target"))
        self._tokens = _Pool(None)  # a token budget comes with a poll
        self._workers: dict[str, _Worker] = {}
        self._stats, self._tokens_used = CallStats(), 0
        self._decide_at: float | None = None  # the coordinator's next poll, on the book's clock; None: unknown

    # -- what the coordinator reads ----------------------------------------------------------------------------
    @property
    def target(self) -> int:
        return self._permits.target or 0

    @property
    def token_target(self) -> int | None:
        return self._tokens.target

    def inflight(self) -> int:
        """Permits outstanding: the coordinator's own in-flight count, what its policy and usage meter read."""
        return self._permits.outstanding()

    def shares(self) -> dict[str, int]:
        return dict(sorted(self._permits.shares.items()))

    def held(self) -> dict[str, int]:
        return dict(sorted(self._permits.held.items()))

    def ledger(self, *, tokens: bool = False) -> Ledger:
        pool = self._tokens if tokens else self._permits
        return Ledger(pool.granted, pool.returned, pool.expired, pool.outstanding())

    def drain_stats(self) -> CallStats:
        """The workers' reports since the last drain, summed: what the coordinator's policy reads as its own calls."""
        stats, self._stats = self._stats, CallStats()
        return stats

    def drain_tokens_used(self) -> int:
        used, self._tokens_used = self._tokens_used, 0
        return used

    # -- the protocol ------------------------------------------------------------------------------------------
    def request(
        self,
        worker: str,
        demand: int,
        *,
        now: float,
        weight: float = 1.0,
        tokens: int | None = None,
        inflight: int = 0,
        inflight_tokens: int = 0,
        config: LeaseConfig | None = None,
    ) -> Grant:
        """Join (or rejoin) the job and get a first grant.

        ``inflight`` is the calls the worker already runs (after a lapse it ran on its own): counted as held at
        once, since they exist whatever the book says. A worker id the book already holds is taken to have
        restarted: its old grant died with its process and is written off as expired."""
        if config is not None and config != self.config:
            raise LeaseConfigError(
                f"job {self.job!r}, model {self.model!r}: worker {worker!r} joined with {config}, but the job runs "
                f"{self.config}; every worker of a job must share one configuration"
            )
        state = _Worker(_weight(weight), _whole(demand, 0, "demand"), _maybe(tokens, "tokens"))
        adopted = _whole(inflight, 0, "inflight"), _whole(inflight_tokens, 0, "inflight_tokens")
        if self._workers.pop(worker, None) is not None:
            self._permits.drop(worker, expired=True)
            self._tokens.drop(worker, expired=True)
        self._workers[worker] = state
        for pool, count in zip((self._permits, self._tokens), adopted, strict=True):
            pool.held[worker], pool.granted = count, pool.granted + count
        return self._grant(worker, state, now, joined=True)

    def renew(
        self,
        worker: str,
        demand: int,
        *,
        now: float,
        unused: int = 0,
        unused_tokens: int = 0,
        report: CallStats | None = None,
        tokens_used: int = 0,
        tokens: int | None = None,
        weight: float | None = None,
    ) -> Grant:
        """Hand back what is not in use, report the calls since the last renewal, state the demand, get a grant."""
        state = self._known(worker)
        checked = (
            _whole(demand, 0, "demand"),
            _maybe(tokens, "tokens"),
            state.weight if weight is None else _weight(weight),
            _whole(tokens_used, 0, "tokens_used"),
        )
        held, held_tokens = self._permits.held[worker], self._tokens.held[worker]
        if _whole(unused, 0, "unused") > held or _whole(unused_tokens, 0, "unused_tokens") > held_tokens:
            raise ValueError(
                f"worker {worker!r} hands back {unused} permits and {unused_tokens} tokens but holds {held} and "
                f"{held_tokens}"
            )
        for pool, count in ((self._permits, unused), (self._tokens, unused_tokens)):
            pool.held[worker], pool.returned = pool.held[worker] - count, pool.returned + count
        self._note(report, tokens_used)
        state.demand, state.token_demand, state.weight, _ = checked
        return self._grant(worker, state, now)

    def leave(self, worker: str, *, now: float, report: CallStats | None = None, tokens_used: int = 0) -> int:
        """Hand back everything the worker holds at once (its calls are done); the permits handed back.

        Safe to repeat: a worker the book no longer holds hands back nothing. ``now`` keeps the protocol's call
        shape; a departure needs no time."""
        del now
        self._note(report, tokens_used)
        if self._workers.pop(worker, None) is None:
            return 0
        permits = self._permits.held[worker]
        self._permits.drop(worker, expired=False)
        self._tokens.drop(worker, expired=False)
        self._resplit()
        return permits

    def expire(self, now: float) -> list[str]:
        """Take back the grants of workers past their deadline (killed, or cut off from the coordinator)."""
        lapsed = sorted(name for name, w in self._workers.items() if now > w.deadline)
        for name in lapsed:
            del self._workers[name]
            self._permits.drop(name, expired=True)
            self._tokens.drop(name, expired=True)
        self._resplit()
        return lapsed

    def set_target(
        self, requests: int, tokens: int | None = None, *, now: float, decide_in: float | None = None
    ) -> None:
        """The job's target from the coordinator's runtime, every poll. Nothing is recalled: shares change at once,
        holdings as workers renew (I2). ``decide_in``: seconds to the coordinator's next poll (None: unknown), which
        times the renewals while it polls faster than they come (:func:`renew_in`)."""
        if decide_in is not None and not math.isfinite(decide_in):
            raise ValueError(f"decide_in must be a finite number of seconds, got {decide_in!r}")
        self._decide_at = None if decide_in is None else now + decide_in
        self._permits.target = _whole(requests, 0, "requests")
        self._tokens.target = _maybe(tokens, "tokens")
        self._resplit()

    # -- inside ------------------------------------------------------------------------------------------------
    def _known(self, worker: str) -> _Worker:
        state = self._workers.get(worker)
        if state is None:
            raise UnknownWorker(
                f"job {self.job!r}, model {self.model!r}: worker {worker!r} holds no lease (it expired or never "
                "joined); request again, passing the calls it has in flight"
            )
        return state

    def _note(self, report: CallStats | None, tokens_used: int) -> None:
        self._tokens_used += _whole(tokens_used, 0, "tokens_used")
        if report is not None:
            self._stats = add_stats(self._stats, report)

    def _resplit(self) -> None:
        workers = self._workers
        weights = {name: w.weight for name, w in workers.items()}
        self._permits.shares = split(self.target, {name: w.demand for name, w in workers.items()}, weights)
        budget = self._tokens.target
        # A worker with no call to make needs no tokens; one that names no token demand may use its whole share.
        want = {
            n: 0 if w.demand == 0 else w.token_demand if w.token_demand is not None else budget or 0
            for n, w in workers.items()
        }
        self._tokens.shares = {} if budget is None else split(budget, want, weights)

    def _grant(self, worker: str, state: _Worker, now: float, *, joined: bool = False) -> Grant:
        self._resplit()
        permits, tokens = self._permits.top_up(worker) or 0, self._tokens.top_up(worker)
        state.deadline = now + self.lease_s
        held, share, held_tokens = self._permits.held[worker], self._permits.shares[worker], self._tokens.held[worker]
        unsettled = joined or held != permits or permits < share
        if tokens is not None:
            unsettled = unsettled or held_tokens != tokens or tokens < self._tokens.shares[worker]
        decide_in = None if self._decide_at is None else self._decide_at - now
        due = renew_in(self.lease_s / 2, unsettled=unsettled, decide_in=decide_in)
        job = self.target, self._tokens.target
        return Grant(worker, permits, held, share, tokens, held_tokens, state.deadline, self.lease_s, *job, due)


class Fallback:
    """The worker's side when the coordinator goes quiet: run alone from the last grant, never from the ceiling.

    Timed on the worker's own clock from when it *sent* the request that was answered (the book's clock is another
    process's), so the worker falls back no later than the book expires it. A coordinator that never answered
    lapses like one that stopped: ``lease_s`` after ``started_at``."""

    __slots__ = ("config", "deadline", "last")

    def __init__(self, config: LeaseConfig, *, lease_s: float, started_at: float) -> None:
        self.config, self.deadline = config, started_at + lease_s
        self.last: Grant | None = None

    def granted(self, grant: Grant, *, sent_at: float) -> None:
        self.last, self.deadline = grant, sent_at + grant.lease_s

    def lapsed(self, now: float) -> bool:
        return now > self.deadline

    def start_target(self) -> int:
        """Where the worker's own runtime starts: its last grant within the bounds, else the floor. Not the
        ceiling: all workers lapse together, and each starting high would put many times the target on the engine."""
        return self.config.clamp(self.last.permits if self.last is not None else self.config.floor)

    def start_tokens(self) -> int | None:
        """The token budget to start at: the last grant's (None: none was granted, so none is enforced)."""
        return self.last.tokens if self.last is not None else None
