"""Failures that show: the states a gate must never be in silently, judged after every poll of a runtime.

A fallback that looks like a reading, a page that stopped moving, a limit nothing ever reaches (the gate is open
in effect) and an engine restart all leave the target looking plausible. Each is therefore a field of the
published :class:`~model_concurrency.state.RuntimeState` (so of ``get_utilization``), an exported metric
(:mod:`model_concurrency.telemetry`), and one log line when it starts or ends, never one per poll while it lasts:

* ``fallback``: the target is not the policy's reading of fresh signals. ``"grace"`` (a failed poll: the last
  good target held for ``grace_polls``), ``"handover"`` (after the grace, held while this process's own calls look
  healthy, guard.py) or ``"floor"`` (the fail-safe: metrics down and the calls in trouble). None when the last poll
  was good.
* ``signal_stale``: for :data:`STALE_POLLS` good polls in a row the page did not move although this process
  completed calls meanwhile: its completion counter stood still (or, without one, the whole page was identical).
  A cached exporter, a Prometheus series that stopped updating, or a metrics URL of another engine than the one
  serving the calls.
* ``limit_unreached``: for :data:`UNREACHED_POLLS` polls in a row something ran but the interval's peak in flight
  stayed below the limit in force: the closing point is never reached, so the gate limits nothing and the
  application sets the concurrency (the adaptive part is inert; ``limited_by`` says ``app-limited``).
* ``counter_resets``: how many times a counter of the page went backwards (an engine restart). The observation
  already counts from zero after one (observation.py); this makes it visible. Each reset is one line.
* ``metrics_never_read``: a fallback is in use and the page has never answered since the runtime started. "Holding
  the last good target" would then be false (there is none: the target is the floor it started at), and the
  usual cause is a wrong metrics URL, not an outage; the warning says so and names the URL when it is known.

The judge is pure (no I/O, no clock): the runtime hands it each poll's figures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields

from model_concurrency.observation import EngineSnapshot, Observation

__all__ = ["COUNTERS", "FALLBACKS", "STALE_POLLS", "UNREACHED_POLLS", "Health", "HealthWatch", "counters_went_back"]

log = logging.getLogger("model_concurrency")

STALE_POLLS = 3
FALLBACKS = ("grace", "handover", "floor")
UNREACHED_POLLS = 10
# The page's monotonic counters: any of them lower than at the previous poll means the engine restarted.
COUNTERS = (
    "preemptions_total",
    "success_total",
    "generation_tokens_total",
    "queue_time_sum_total",
    "queue_time_count_total",
)


@dataclass(frozen=True, slots=True)
class Health:
    """The failure states of one model now (see the module docstring)."""

    fallback: str | None = None
    signal_stale: bool = False
    limit_unreached: bool = False
    counter_resets: int = 0
    metrics_never_read: bool = False


def counters_went_back(snapshot: EngineSnapshot, previous: EngineSnapshot | None) -> list[str]:
    """The counters of ``snapshot`` lower than in ``previous`` (an engine restart), by name."""
    if previous is None:
        return []
    back = []
    for name in COUNTERS:
        now, before = getattr(snapshot, name), getattr(previous, name)
        if now is not None and before is not None and now < before:
            back.append(name)
    return back


def fallback_kind(ok: bool | None, failures: int, grace: int, floored: bool) -> str | None:
    """Which fallback a controller core is in after a poll (None: the last poll was good, or none yet)."""
    if ok is not False:
        return None
    if floored:
        return "floor"
    return "grace" if failures <= grace else "handover"


@dataclass(slots=True)
class HealthWatch:
    """Judges one model's polls and logs each state's start and end once."""

    name: str
    health: Health = field(default_factory=Health)
    frozen_polls: int = 0
    unreached_polls: int = 0
    # Judge without a line (a runtime that publishes nothing: the lab's thousands of simulated clients).
    quiet: bool = False
    # The page polled (the source's description), named in the warnings: a URL that never answered is most often
    # a wrong one, and the user has to see which. None: the lines name no URL.
    url: str | None = None
    # Whether any poll has read the page since this watch started.
    read_once: bool = False

    def judge(
        self,
        *,
        fallback: str | None,
        obs: Observation | None,
        limit: int,
        target: int,
        snapshot: EngineSnapshot | None,
        previous: EngineSnapshot | None,
        failures: int = 0,
        reason: str | None = None,
    ) -> Health:
        """One poll: ``fallback`` (fallback_kind), its observation, the ``limit`` in force over the interval, the
        new ``target``, the page read (None: failed), the one before it, and the consecutive failed polls with the
        last one's ``reason``. Returns the new state, logging what changed."""
        resets = self.health.counter_resets
        if snapshot is not None:
            self.read_once = True
            back = counters_went_back(snapshot, previous)
            if back:
                resets += 1
            if back and not self.quiet:
                log.warning(
                    "model %s: the engine's counters went backwards (%s): an engine restart; counting from zero",
                    self.name,
                    ", ".join(back),
                )
            self.frozen_polls = self.frozen_polls + 1 if _frozen(snapshot, previous, obs) else 0
        used = obs is not None and 0 < obs.inflight_peak < limit
        self.unreached_polls = self.unreached_polls + 1 if used else 0
        new = Health(
            fallback=fallback,
            signal_stale=self.frozen_polls >= STALE_POLLS if snapshot is not None else self.health.signal_stale,
            limit_unreached=self.unreached_polls >= UNREACHED_POLLS,
            counter_resets=resets,
            metrics_never_read=fallback is not None and not self.read_once,
        )
        self._say(new, limit, target, failures, reason)
        self.health = new
        return new

    def _say(self, new: Health, limit: int, target: int, failures: int, reason: str | None) -> None:
        if self.quiet:
            return
        old, name = self.health, self.name
        if new.fallback != old.fallback:
            if new.fallback is None:
                log.info("model %s: metrics back; the policy decides again (target %d)", name, target)
            else:
                what = self._fallback_words(new.fallback, new.metrics_never_read)
                log.warning(
                    "model %s: metrics poll failed (%s); %d consecutive, target %d: %s",
                    name,
                    reason or "no snapshot",
                    failures,
                    target,
                    what,
                )
        _edge(
            name,
            (new.signal_stale, old.signal_stale),
            "the metrics page has not moved for %d polls while our calls completed: a stale signal (a cached "
            "exporter, a stopped series, or another engine's page?)",
            (self.frozen_polls,),
            "the metrics page moves again",
        )
        _edge(
            name,
            (new.limit_unreached, old.limit_unreached),
            "in flight stayed below the limit %d for %d polls: the gate limits nothing; the application sets the "
            "concurrency",
            (limit, self.unreached_polls),
            "in flight reaches the limit again",
        )

    def _fallback_words(self, fallback: str, never_read: bool) -> str:
        """What the target does in ``fallback``, true to whether there is a last good target to hold."""
        page = f"the metrics page {self.url}" if self.url else "the metrics page"
        if never_read:
            # After the grace a page never read always meets "no latency baseline" (guard.py): the floor, which
            # is where the target has been from the start.
            first = "has never answered, so" if fallback == "grace" else "has still never answered:"
            return f"{page} {first} the target stays at the floor until it does"
        where = f" ({self.url})" if self.url else ""
        return {
            "grace": "holding the last good target through the grace polls",
            "handover": "after the grace: held while this process's calls look healthy (the hand-over)",
            "floor": "the fail-safe floor until the signals return",
        }[fallback] + where


def _edge(name: str, flag: tuple[bool, bool], raised: str, args: tuple[object, ...], cleared: str) -> None:
    """A warning flag's edges in the log, ``flag`` being (now, before): a warning when it rises, info when it clears."""
    now, before = flag
    if now and not before:
        log.warning("model %s: " + raised, name, *args)
    elif before and not now:
        log.info("model %s: " + cleared, name)


_NO_PAGE = EngineSnapshot()


def _frozen(snapshot: EngineSnapshot, previous: EngineSnapshot | None, obs: Observation | None) -> bool:
    """The page did not count calls we saw complete since the previous poll."""
    if previous is None or obs is None or obs.client_calls == 0 or snapshot == _NO_PAGE:
        return False  # an empty snapshot is a client-side source's (no page at all), not a page that froze
    if snapshot.success_total is not None and previous.success_total is not None:
        return snapshot.success_total == previous.success_total
    return all(getattr(snapshot, f.name) == getattr(previous, f.name) for f in fields(snapshot))
