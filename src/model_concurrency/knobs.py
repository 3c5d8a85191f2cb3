"""Every environment knob in one table, and :func:`setting`, the one way any of them is read.

Each knob is declared once here with its name, default and what it does; ``model-concurrency knobs`` prints the
table with the values the environment holds now, and docs/operations.md carries the same table, generated
(:func:`knobs_markdown`; a test checks the doc equals it). A knob's constant is the ``(name, default)`` pair
``setting(*KNOB)`` takes, as before.

Knobs are read on every call, never cached at import, so an operator can flip ``KG_ADAPTIVE_CONCURRENCY`` or
change the ceiling in a long-running worker (through its environment) and the next poll obeys. A knob holding
garbage falls back to its default with one warning, rather than taking a worker down. A harness that needs other
values for a while (the conformance runs) passes them with :func:`overrides` instead of editing ``os.environ``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

__all__ = ["KNOBS", "Knob", "knob_rows", "knobs_markdown", "overrides", "setting"]

log = logging.getLogger("model_concurrency")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Knob:
    """One environment knob: its name, its default (which also says its type) and what it does."""

    name: str
    default: Any
    what: str
    area: str = "runtime"  # "runtime": production; "lab": the simulator, notebooks and benchmarks

    @property
    def pair(self) -> tuple[str, Any]:
        return (self.name, self.default)


KNOBS: list[Knob] = []


def _knob(name: str, default: T, what: str, area: str = "runtime") -> tuple[str, T]:
    KNOBS.append(Knob(name, default, what, area))
    return (name, default)


ADAPTIVE_FLAG = _knob("KG_ADAPTIVE_CONCURRENCY", True, "off: exactly the static capacity, no scrape at all")
MAX_CONCURRENCY = _knob("MODEL_MAX_CONCURRENCY", 512, "ceiling of the adaptive target (the floor wins if higher)")
POLL_S = _knob(
    "MODEL_CONCURRENCY_POLL_S", 12.0, "seconds between two polls of a model, before the jitter (0: at every chance)"
)
POLL_JITTER = _knob(
    "MODEL_CONCURRENCY_POLL_JITTER",
    0.1,
    "each wait is POLL_S × (1 ± up to this), drawn per poll, so processes drift apart; 0: the exact grid; in [0, 1)",
)
RAMP_POLL_DIVISOR = _knob(
    "MODEL_CONCURRENCY_RAMP_POLL_DIVISOR",
    6.0,
    "while the policy's first ramp asks for it, poll every POLL_S / this, plus one poll after; 1: off",
)
TIMEOUT_S = _knob("MODEL_CONCURRENCY_TIMEOUT_S", 2.0, "connect/read timeout of a poll; a whole poll gets twice this")
GRACE_POLLS = _knob(
    "MODEL_CONCURRENCY_GRACE_POLLS", 3, "failed polls that hold the target before the hand-over; 0: at once"
)
OUTAGE_HANDOVER = _knob(
    "MODEL_CONCURRENCY_OUTAGE_HANDOVER",
    True,
    "after the grace: held while our own calls look healthy, else the floor; off: the floor after the grace",
)
GROWTH_GUARD = _knob(
    "MODEL_CONCURRENCY_GROWTH_GUARD",
    True,
    "cap growth that bought no completions past the plateau point (guard.py); off: the policy's answer unchanged",
)
POLICY = _knob(
    "MODEL_CONCURRENCY_POLICY", "adaptive", "default policy: a built-in, a preset, a .toml path or module:Class"
)
POLICY_PATH = _knob("MODEL_CONCURRENCY_POLICY_PATH", "", "extra folders (os.pathsep-separated) of policy presets")
CONFIG_PATH = _knob("MODEL_CONCURRENCY_CONFIG", "", "a TOML file of [models.NAME] tables, loaded into the registry")
PROMETHEUS_URL = _knob(
    "MODEL_CONCURRENCY_PROMETHEUS_URL",
    "",
    "a Prometheus server every model without its own metrics_url/prometheus_url reads (docs/scale-out.md)",
)
THREAD_IDLE_S = _knob(
    "MODEL_CONCURRENCY_THREAD_IDLE_S", 10.0, "idle worker threads of the sync gate exit after this many seconds"
)
MAX_OUTAGE_S = _knob(
    "MODEL_CONCURRENCY_MAX_OUTAGE_S",
    60.0,
    "items wait this long for an unreachable model (the outage hold) before failing with ModelUnreachable; 0: off",
)
EXPORT = _knob(
    "MODEL_CONCURRENCY_EXPORT",
    "",
    # The file's period is export.FILE_EVERY_S (export imports this module, so it is written out here; a test
    # checks the two agree).
    "publish this process's metrics for `watch --job`: HOST:PORT (an HTTP page) or a file path (rewritten every "
    "0.5 s, between polls too)",
)
CACHE = _knob(
    "MODEL_CONCURRENCY_CACHE", "", "the lab's oracle cache folder (default: $XDG_CACHE_HOME/model_concurrency)", "lab"
)
SERIAL = _knob("MODEL_CONCURRENCY_SERIAL", False, "on: the lab runs a long oracle in this process, not a second", "lab")
ORACLE_FULL_SWEEP = _knob(
    "MODEL_CONCURRENCY_ORACLE_FULL_SWEEP", False, "on: the oracle sweeps a whole fleet, not one replica", "lab"
)
FAST = _knob("MODEL_CONCURRENCY_FAST", False, "on: notebooks run their short version (the test suite sets it)", "lab")
FIGURES = _knob("MODEL_CONCURRENCY_FIGURES", "", "where notebooks write their PNGs (default out/notebooks)", "lab")

# Values that parse but make no sense: warned about once and ignored, like non-numeric ones. A poll interval and
# a grace of 0 stay valid (poll at every chance; drop to the floor on the first failure).
VALID: dict[str, tuple[Callable[[Any], bool], str]] = {
    MAX_CONCURRENCY[0]: (lambda v: v > 0, "must be > 0"),
    TIMEOUT_S[0]: (lambda v: v > 0, "must be > 0"),
    POLL_S[0]: (lambda v: v >= 0, "must be >= 0"),
    GRACE_POLLS[0]: (lambda v: v >= 0, "must be >= 0"),
    RAMP_POLL_DIVISOR[0]: (lambda v: v >= 1, "must be >= 1 (1 = no faster polls)"),
    POLL_JITTER[0]: (lambda v: 0 <= v < 1, "must be >= 0 and < 1 (a share of the poll interval)"),
    THREAD_IDLE_S[0]: (lambda v: v >= 0, "must be >= 0"),
}

_FALSE = {"0", "false", "no", "off", ""}
_TRUE = {"1", "true", "yes", "on"}
_warned: set[tuple[str, str]] = set()
# Values a harness passes for a while (overrides()): they win over the environment, for every thread.
_overrides: dict[str, str] = {}
_overrides_lock = threading.Lock()


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def raw_value(name: str) -> str | None:
    """What ``name`` holds now: an override in force, else the environment's value (None: unset)."""
    value = _overrides.get(name)
    return value if value is not None else os.environ.get(name)


@overload
def setting(name: str, default: T, cast: None = None) -> T: ...
@overload
def setting(name: str, default: T, cast: Callable[[str], T]) -> T: ...
def setting(name: str, default: Any, cast: Callable[[str], Any] | None = None) -> Any:
    """Read ``name`` now (an override, else the environment); cast it like ``default`` (or with ``cast``); fall
    back to ``default`` on error."""
    raw = raw_value(name)
    if raw is None:
        return default
    if cast is None:
        if isinstance(default, bool):
            cast = _parse_bool
        elif isinstance(default, (int, float)):
            cast = type(default)
        else:
            return raw
    try:
        value = cast(raw.strip())
    except (ValueError, TypeError):
        if (name, raw) not in _warned:
            _warned.add((name, raw))
            log.warning("ignoring %s=%r: not a valid %s; using %r", name, raw, type(default).__name__, default)
        return default
    if isinstance(value, float) and value != value:  # NaN
        return default
    rule = VALID.get(name)
    if rule is not None and not rule[0](value):
        if (name, raw) not in _warned:
            _warned.add((name, raw))
            log.warning("ignoring %s=%r: %s; using %r", name, raw, rule[1], default)
        return default
    return value


@contextlib.contextmanager
def overrides(values: Mapping[str, str]) -> Iterator[None]:
    """Knob values that win over the environment inside the block, for every thread (background pollers too);
    the previous ones come back after it. The process's ``os.environ`` is never touched."""
    with _overrides_lock:
        saved = {name: _overrides.get(name) for name in values}
        _overrides.update(values)
    try:
        yield
    finally:
        with _overrides_lock:
            for name, value in saved.items():
                if value is None:
                    _overrides.pop(name, None)
                else:
                    _overrides[name] = value


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "—"
    return f"{value:g}" if isinstance(value, float) else str(value)


def knob_rows() -> list[tuple[str, str, str, str]]:
    """(name, default, current value, what it does) for every knob; current is "—" when unset."""
    return [(k.name, _shown(k.default), raw_value(k.name) or "—", k.what) for k in KNOBS]


def knobs_markdown() -> str:
    """The knob table as docs/operations.md carries it (between its ``knobs`` markers)."""
    lines = []
    for area, title in (("runtime", "Production"), ("lab", "The lab (simulator, notebooks, benchmarks)")):
        lines += [f"**{title}**", "", "| Knob | Default | What it does |", "|---|---|---|"]
        lines += [f"| `{k.name}` | {_shown(k.default)} | {k.what} |" for k in KNOBS if k.area == area]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
