"""The outage rule: when calls cannot reach the model, hold new starts and probe, instead of failing every item.

Measured without this rule (``MODEL_CONCURRENCY_MAX_OUTAGE_S=0``): ``map_concurrent`` over 6,000 embeddings while
the engine is SIGKILLed and restarted four times (2 s down each) fails 5,067 items. With the engine down each call
fails at once, so the fan-out works through the rest of its list in seconds. A restart should not fail most of an
ingestion job.

The rule (pure state in :class:`~.hold.Outage`, beside the Retry-After hold whose waits it shares, in gate/hold.py;
:mod:`.rejections` applies it to a model's runtime; this module names it):

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

from model_concurrency.gate.hold import FIRST_PROBE_S, MAX_OUTAGE_S, MAX_PROBE_S, ModelUnreachable, Outage

__all__ = ["FIRST_PROBE_S", "MAX_OUTAGE_S", "MAX_PROBE_S", "ModelUnreachable", "Outage"]
