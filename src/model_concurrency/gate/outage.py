"""The outage rule: when calls cannot reach the model, hold new starts and probe, instead of failing every item.

Measured before this rule: ``map_concurrent`` over 6,000 embeddings while the engine was SIGKILLed and restarted
four times (2 s down each) failed 5,067 items. With the engine down each call fails at once, so the fan-out
worked through the rest of its list in seconds. A restart should not fail most of an ingestion job.

The rule (pure state here; :mod:`.rejections` applies it to a model's runtime):

* a call classified *outage* (connection refused or reset, a proxy's 502/504: gate/outcome.py) opens an outage:
  no new call to the model starts before the next probe (the :class:`~.hold.AdmissionHold` waits for
  :attr:`Outage.until`), and the model's limiter admits one call at a time (the probe);
* failures of calls sent before the outage opened (or before the last probe was scheduled) are the same outage
  seen late and change nothing; a failed probe doubles the wait, from :data:`FIRST_PROBE_S` up to
  :data:`MAX_PROBE_S`;
* a call sent since it opened that succeeds (or gets any HTTP answer but a 502/504) ends it: the limiter goes
  back to the target at once;
* an item that waits for a model unreachable for longer than ``MODEL_CONCURRENCY_MAX_OUTAGE_S`` (default 60 s)
  fails with :class:`ModelUnreachable`; probes go on, so the model is picked up again when it returns.
  ``MODEL_CONCURRENCY_MAX_OUTAGE_S=0`` turns the rule off (each call fails at once, as before).
"""

from __future__ import annotations

import math
import threading

from model_concurrency.knobs import MAX_OUTAGE_S

__all__ = ["FIRST_PROBE_S", "MAX_OUTAGE_S", "MAX_PROBE_S", "ModelUnreachable", "Outage"]

FIRST_PROBE_S = 0.25
MAX_PROBE_S = 2.0


class ModelUnreachable(RuntimeError):
    """An item waited for a model that has been unreachable for longer than ``max_outage_s``."""


class Outage:
    """One model's outage state: since when, the next probe, the backoff. Thread-safe; no clock of its own."""

    __slots__ = ("_lock", "backoff_s", "max_s", "noted_at", "opened", "probes_failed", "reason", "since", "until")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.until = -math.inf
        self.noted_at = -math.inf
        self.backoff_s = FIRST_PROBE_S
        self.max_s = MAX_OUTAGE_S[1]
        self.reason = ""
        self.opened = 0  # outages so far (tests, stats)
        self.probes_failed = 0

    @property
    def active(self) -> bool:
        return self.since is not None

    def fail(self, sent_at: float, now: float, reason: str, max_s: float) -> bool:
        """A call failed as an outage. True when this opened the outage (the caller pins its limiter to 1).

        ``max_s`` <= 0: the rule is off and nothing happens."""
        if not max_s > 0:
            return False
        with self._lock:
            if self.since is None:
                self.since, self.reason, self.max_s = now, reason, max_s
                self.backoff_s = FIRST_PROBE_S
                self.noted_at = now
                self.until = now + self.backoff_s
                self.opened += 1
                return True
            if sent_at >= self.noted_at:  # a probe, sent after the last deadline was set, failed: back off
                self.backoff_s = min(2 * self.backoff_s, MAX_PROBE_S)
                self.until = now + self.backoff_s
                self.noted_at = now
                self.reason = reason
                self.probes_failed += 1
            return False

    def succeed(self, sent_at: float) -> bool:
        """A call sent at ``sent_at`` succeeded. True when this ended an outage (the caller restores its limiter).

        A call sent before the outage opened says the model *was* reachable then, not that it is now: no change."""
        if self.since is None:
            return False
        with self._lock:
            if self.since is None or sent_at < self.since:
                return False
            self.since = None
            self.until = -math.inf
            self.noted_at = -math.inf
            return True

    def check(self, now: float) -> None:
        """Raise :class:`ModelUnreachable` when the outage has lasted longer than its ``max_outage_s``."""
        since = self.since
        if since is not None and now - since > self.max_s:
            raise ModelUnreachable(
                f"the model has been unreachable for {now - since:.1f} s (more than max_outage_s = {self.max_s:g} s,"
                f" MODEL_CONCURRENCY_MAX_OUTAGE_S): {self.reason}"
            )
