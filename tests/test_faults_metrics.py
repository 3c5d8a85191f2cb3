"""Every metrics-endpoint fault in ``FAULTS``, end to end: a real hostile server on loopback, a real scrape, the
controller's documented outcome (docs/operations.md): a failed poll, the last good target held for the grace
polls, then the floor; exactly one WARNING per failed poll saying why; no exception to any caller; no caller
left blocked (each call runs on a thread joined with a generous bound, never a timing assertion).

Each fault runs through three paths: a ``ModelRuntime`` on a fake clock (grace 3: ``[40, 40, 40, 4]``), and
the application hooks ``resolve_capacity`` / ``aresolve_capacity`` on the real clock with ``POLL_S=0`` (every
call polls) and ``GRACE_POLLS=1`` (``[40, 4]``). The timeout knob is 0.5 s (deadline 1 s) while a slow fault
(one that fails by the clock) serves, the default 2 s / 4 s scaled down fourfold; every other poll has 5 s, so a
good page or a fault that fails for its own reason (a size cap, a refusal, TLS to a plain server) is never
overtaken by the deadline on a loaded 2-core machine; "one byte a second" is one byte every 0.1 s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from conftest import POLL_WAIT_MAX_S, FakeClock
from fault_servers import (
    FaultHandler,
    FaultServer,
    Fixed,
    Responder,
    bounded,
    captured_log,
    fault_server,
    gzip_bomb,
    held,
    page,
    redirect,
    refused_url,
    silent_listener,
    streamed,
    trickle,
    wait_until,
    zeros,
)
from model_concurrency import aresolve_capacity, get_utilization, register_model, resolve_capacity
from model_concurrency.hooks import controller_for
from model_concurrency.observation import EngineSnapshot
from model_concurrency.runtime import ModelRuntime
from model_concurrency.signals.source import VllmMetricsSource
from model_concurrency.signals.vllm import MetricsError, parse_vllm_metrics
from servers import EngineState, vllm_page

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
OTHER = "BAAI/bge-m3"
FLOOR = 4
GOOD = 40
R = "vllm:num_requests_running"
CAP = 8 * 1024 * 1024


def good_page() -> bytes:
    return vllm_page(
        {
            LLAMA: [EngineState(running=7, waiting_capacity=0, kv=0.4), EngineState(running=3, kv=0.2)],
            OTHER: [EngineState(running=1)],
        }
    )


def line(value: str, model: str = LLAMA, engine: str = "0") -> str:
    return f'{R}{{engine="{engine}",model_name="{model}"}} {value}\n'


@functools.cache
def bomb() -> bytes:
    return gzip_bomb(100 * 1024 * 1024)  # 100 MiB of zeros in ~100 KiB


# A scrape's timeout: generous for every poll, so a good page or a fault that fails for its own reason (a cap, a
# parse error, a refusal) is never overtaken by the deadline on a loaded machine (8 MiB of a 100 MB body can take
# longer than 1 s there); the faults that fail *by* the clock (``slow``) get 0.5 s (deadline 1 s) while they serve.
TIMEOUT_S = "5"
SLOW_TIMEOUT_S = "0.5"


@pytest.fixture(autouse=True)
def fast_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", TIMEOUT_S)


@pytest.fixture(scope="module")
def good() -> Iterator[FaultServer]:
    with fault_server(page(good_page())) as server:
        yield server


# -- the faults ----------------------------------------------------------------------------------------------------
Endpoint = Callable[[], AbstractContextManager[str]]


@contextmanager
def served(responder: Callable[[], Responder], host: str = "127.0.0.1") -> Iterator[str]:
    with fault_server(responder(), host=host) as server:
        yield f"{server.url}/metrics"


@contextmanager
def refused() -> Iterator[str]:
    yield refused_url() + "/metrics"


@contextmanager
def never_answers() -> Iterator[str]:
    with silent_listener() as url:
        yield url + "/metrics"


@contextmanager
def tls_to_plain_server() -> Iterator[str]:
    with fault_server(page(good_page())) as server:
        yield server.url.replace("http://", "https://") + "/metrics"


@contextmanager
def redirect_to_another_host() -> Iterator[str]:
    with (
        fault_server(page(good_page()), host="127.0.0.2") as elsewhere,
        fault_server(redirect(f"{elsewhere.url}/metrics")) as server,
    ):
        yield f"{server.url}/metrics"
        assert elsewhere.requests == []  # never followed


def text_page(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Endpoint:
    return functools.partial(served, lambda: page(body, status=status, headers=headers))


def cut_short(body: bytes) -> Responder:
    """Announces the whole page in Content-Length, sends half of it, and closes."""

    def respond(h: FaultHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])

    return respond


@dataclass(frozen=True)
class Fault:
    name: str
    endpoint: Endpoint
    why: str | tuple[str, ...]  # what the one log line must say (any one of a tuple's)
    slow: bool = False  # fails by the scrape's timeout or deadline: polled with the short one

    @contextmanager
    def serving(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
        """The fault's URL; a slow fault's polls meanwhile use the short timeout (the knob is read at each poll)."""
        with self.endpoint() as url:
            if self.slow:
                monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", SLOW_TIMEOUT_S)
            try:
                yield url
            finally:
                monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", TIMEOUT_S)


def says(text: str, why: str | tuple[str, ...]) -> bool:
    return any(w in text for w in ((why,) if isinstance(why, str) else why))


FAULTS = [
    Fault("connection-refused", refused, "ScrapeError: ConnectError"),
    # The read timeout (0.5 s) fires first on an idle machine; on a loaded one the connect or the loop's start can
    # eat enough of the exchange's 1 s deadline that the deadline fires first. Either names the silent server.
    Fault("accepts-never-answers", never_answers, ("ReadTimeout", "deadline"), slow=True),
    Fault(
        "one-byte-per-tick-body", functools.partial(served, lambda: trickle(good_page(), 0.1)), "deadline", slow=True
    ),
    Fault(
        "100MB-body",
        functools.partial(served, lambda: streamed(zeros(100 * 1024 * 1024), 100 * 1024 * 1024)),
        f"larger than {CAP} bytes",
    ),
    Fault(
        "100MB-body-chunked",
        functools.partial(served, lambda: streamed(zeros(100 * 1024 * 1024), None)),
        f"larger than {CAP} bytes",
    ),
    Fault(
        "gzip-bomb",
        functools.partial(served, lambda: page(bomb(), headers={"Content-Encoding": "gzip"})),
        f"larger than {CAP} bytes",
    ),
    Fault(
        "corrupt-gzip",
        functools.partial(served, lambda: page(b"\x1f\x8bnope", headers={"Content-Encoding": "gzip"})),
        "corrupt compressed metrics body",
    ),
    Fault(
        "unknown-encoding",
        functools.partial(served, lambda: page(good_page(), headers={"Content-Encoding": "br"})),
        "unsupported content-encoding",
    ),
    Fault(
        "truncated-body",
        functools.partial(served, lambda: cut_short(good_page())),
        "RemoteProtocolError: peer closed connection without sending complete message body",
    ),
    Fault(
        "binary-garbage",
        functools.partial(served, lambda: page(bytes((i * 131 + 7) % 256 for i in range(4096)))),
        "MetricsError: unparseable metrics page",
    ),
    Fault(
        "valid-page-without-the-model",
        functools.partial(served, lambda: page(vllm_page({OTHER: [EngineState(running=3)]}))),
        f"no {R} series for model_name={LLAMA!r}",
    ),
    Fault("nan", text_page(line("NaN")), f"implausible value nan for {R}"),
    Fault("plus-inf", text_page(line("+Inf")), f"implausible value inf for {R}"),
    Fault("negative", text_page(line("-3")), f"implausible value -3.0 for {R}"),
    Fault("1e308", text_page(line("1e308")), f"implausible value 1e+308 for {R}"),
    Fault(
        "kv-usage-above-1",
        text_page(line("1") + f'vllm:kv_cache_usage_perc{{model_name="{LLAMA}"}} 1.5\n'),
        "implausible value 1.5 for vllm:kv_cache_usage_perc",
    ),
    Fault("duplicate-series", text_page(line("1") + line("2")), f"duplicate series {R}"),
    Fault(
        "duplicate-series-labels-reordered",
        text_page(line("1") + f'{R}{{model_name="{LLAMA}",engine="0"}} 1\n'),
        f"duplicate series {R}",
    ),
    Fault("http-500", text_page("oops", status=500), "answered HTTP 500"),
    Fault("http-404", text_page("nope", status=404), "answered HTTP 404"),
    Fault("http-401", text_page("who", status=401), "answered HTTP 401"),
    Fault(
        "redirect-without-location",
        functools.partial(served, lambda: page(b"", status=302, headers={})),
        "redirect without a Location",
    ),
    Fault("redirect-to-another-host", redirect_to_another_host, "redirected to another origin; not followed"),
    Fault("tls-handshake-failure", tls_to_plain_server, "SSL"),
]


# -- helpers ---------------------------------------------------------------------------------------------------------
def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "model_concurrency" and r.levelno >= logging.WARNING]


def polls(outcome: str) -> float:
    return REGISTRY.get_sample_value("model_concurrency_polls_total", {"model": "m", "outcome": outcome}) or 0.0


def point(controller: ModelRuntime, url: str) -> None:
    """Aim the controller's real scrape at another URL (so one controller sees a good poll, then the fault)."""
    assert isinstance(controller.source, VllmMetricsSource)
    controller.source.metrics_url = url


def register(good: FaultServer, **kwargs: object) -> None:
    register_model(
        "m",
        base_url=f"{good.url}/v1",
        served_model_name=LLAMA,
        max_parallel_calls=FLOOR,
        policy=Fixed(GOOD),
        **kwargs,  # type: ignore[arg-type]
    )


def check_failed_polls(
    caplog: pytest.LogCaptureFixture, targets: list[int], expected: list[int], why: str | tuple[str, ...]
) -> None:
    assert targets == expected
    lines = warnings_of(caplog)
    # One line where the fallback changes (into the grace, then to the floor), none while it persists (health.py).
    changes = [n for n in range(1, len(expected) + 1) if n == 1 or expected[n - 1] != expected[n - 2]]
    assert len(lines) == len(changes), lines
    for n, text in zip(changes, lines, strict=True):
        assert text.startswith("model m: metrics poll failed (") and says(text, why), text
        assert f"; {n} consecutive, target {expected[n - 1]}" in text, text


# -- the fault matrix --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_through_a_live_controller(
    fault: Fault, good: FaultServer, clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(good)
    controller = controller_for("m")
    assert controller is not None
    controller.clock = clock
    assert bounded(controller.target) == GOOD  # one good poll first, so holding and dropping differ
    ok_before, failed_before = polls("ok"), polls("failed")
    with fault.serving(monkeypatch) as url, caplog.at_level(logging.WARNING, "model_concurrency"):
        point(controller, url)
        targets = []
        for _ in range(4):
            clock.advance(POLL_WAIT_MAX_S)
            targets.append(bounded(controller.target))
    check_failed_polls(caplog, targets, [GOOD, GOOD, GOOD, FLOOR], fault.why)
    snap = get_utilization("m")
    assert snap["metrics_ok"] is False and says(snap["last_error"], fault.why)
    assert snap["consecutive_failures"] == 4 and snap["current_target"] == FLOOR
    assert snap["running"] is None  # no stale engine figures presented as current
    assert (polls("ok"), polls("failed")) == (ok_before, failed_before + 4)
    # The endpoint heals: the next good poll is taken as such and the ramp starts again from the floor.
    point(controller, f"{good.url}/metrics")
    clock.advance(POLL_WAIT_MAX_S)
    assert bounded(controller.target) == GOOD and controller.core.consecutive_failures == 0


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_through_resolve_capacity(
    fault: Fault, good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    monkeypatch.setenv("MODEL_CONCURRENCY_GRACE_POLLS", "1")
    register(good)
    assert bounded(lambda: resolve_capacity("m")) == GOOD
    controller = controller_for("m")
    assert controller is not None
    with fault.serving(monkeypatch) as url, caplog.at_level(logging.WARNING, "model_concurrency"):
        point(controller, url)
        targets = [bounded(lambda: resolve_capacity("m")) for _ in range(2)]
    check_failed_polls(caplog, targets, [GOOD, FLOOR], fault.why)


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_through_aresolve_capacity(
    fault: Fault, good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    monkeypatch.setenv("MODEL_CONCURRENCY_GRACE_POLLS", "1")
    register(good)

    async def calls(url: str) -> list[int]:
        assert await aresolve_capacity("m") == GOOD
        controller = controller_for("m")
        assert controller is not None
        point(controller, url)
        return [await aresolve_capacity("m"), await aresolve_capacity("m")]

    with fault.serving(monkeypatch) as url, caplog.at_level(logging.WARNING, "model_concurrency"):
        targets = bounded(lambda: asyncio.run(calls(url)))
    check_failed_polls(caplog, targets, [GOOD, FLOOR], fault.why)


# -- a response trickled from its status line on ---------------------------------------------------------------------
@contextmanager
def endless_head() -> Iterator[str]:
    """Answers one byte per tick starting with the status line, with a header that never ends."""
    body = b"x" * 100_000  # the "body" is trickled inside an unterminated header line
    with fault_server(trickle(b"X-Pad: " + body, 0.1, from_status_line=True)) as server:
        yield f"{server.url}/metrics"


def test_trickled_status_line_is_bounded_by_the_deadline_async(
    good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", SLOW_TIMEOUT_S)  # deadline 1 s
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    monkeypatch.setenv("MODEL_CONCURRENCY_GRACE_POLLS", "0")
    register(good)
    bounded(lambda: asyncio.run(aresolve_capacity("m")))
    controller = controller_for("m")
    assert controller is not None
    with endless_head() as url, caplog.at_level(logging.WARNING, "model_concurrency"):
        point(controller, url)
        assert bounded(lambda: asyncio.run(aresolve_capacity("m")), limit_s=5) == FLOOR
    check_failed_polls(caplog, [FLOOR], [FLOOR], "deadline")


def test_trickled_status_line_is_bounded_by_the_deadline_sync(
    good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", SLOW_TIMEOUT_S)  # deadline 1 s
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    monkeypatch.setenv("MODEL_CONCURRENCY_GRACE_POLLS", "0")
    register(good)
    bounded(lambda: resolve_capacity("m"))
    controller = controller_for("m")
    assert controller is not None
    with endless_head() as url, caplog.at_level(logging.WARNING, "model_concurrency"):
        point(controller, url)
        # The deadline is 1 s; 3 s is a hang guard (before the fix the call waited out h11's header limit).
        assert bounded(lambda: resolve_capacity("m"), limit_s=3) == FLOOR
    check_failed_polls(caplog, [FLOOR], [FLOOR], "deadline")


# -- other callers never wait for a poll in flight ---------------------------------------------------------------
def test_callers_do_not_wait_for_a_poll_that_is_stuck(
    good: FaultServer, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_TIMEOUT_S", "30")  # so the poll really stays stuck on the server
    release = threading.Event()
    with fault_server(held(release, page(good_page()))) as stuck:
        register(good)
        controller = controller_for("m")
        assert controller is not None
        controller.clock = clock
        assert bounded(controller.target) == GOOD
        point(controller, f"{stuck.url}/metrics")
        clock.advance(POLL_WAIT_MAX_S)
        poller = threading.Thread(target=controller.target, daemon=True)
        poller.start()
        assert wait_until(lambda: len(stuck.requests) == 1)
        # The poll is in flight, blocked on the server: every other caller gets the current target at once.
        assert bounded(controller.target) == GOOD
        assert bounded(lambda: resolve_capacity("m")) == GOOD
        assert bounded(lambda: asyncio.run(aresolve_capacity("m"))) == GOOD
        assert poller.is_alive() and len(stuck.requests) == 1  # still one poll, still stuck
        release.set()
        poller.join(10)
        assert not poller.is_alive()
    assert controller.core.polls == 2 and controller.core.last_ok is True


# -- label values that break string matching are parsed exactly --------------------------------------------------
WEIRD = 'org/we}ird, "quoted" ü-ß-模型 {x}=1'


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# A model whose name, if the page were matched as text, would forge a series for LLAMA.
FORGER = f'{LLAMA}"}} 999\n{R}{{model_name="{LLAMA}'


def tricky_page() -> str:
    return (
        f"# HELP {R} Running\n# TYPE {R} gauge\n"
        f'{R}{{engine="0",model_name="{escape(WEIRD)}"}} 5\n'
        f'{R}{{engine="1",model_name="{escape(WEIRD)}"}} 6\n'
        f'{R}{{engine="0",model_name="{escape(FORGER)}"}} 999\n'
        f'{R}{{engine="0",model_name="{LLAMA}",note="a}},b,\\"c\\""}} 2\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{escape(WEIRD)}"}} 0.5\n'
    )


@pytest.mark.parametrize(("served", "running"), [(WEIRD, 11.0), (LLAMA, 2.0), (FORGER, 999.0)])
def test_label_values_with_braces_commas_quotes_and_utf8(
    served: str, running: float, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    snap = parse_vllm_metrics(tricky_page(), served)
    assert snap.running == running
    with fault_server(page(tricky_page().encode())) as server, caplog.at_level(logging.WARNING, "model_concurrency"):
        spec = register_model(
            "m", base_url=f"{server.url}/v1", served_model_name=served, max_parallel_calls=FLOOR, policy=Fixed(GOOD)
        )
        controller = ModelRuntime(spec, clock=clock)
        assert bounded(controller.target) == GOOD
    assert controller.core.last_ok is True and controller.core.last_observation is not None
    assert controller.core.last_observation.running == running
    assert warnings_of(caplog) == []


# -- hypothesis: page mutations --------------------------------------------------------------------------------------
BASE_LINES = (
    vllm_page(
        {
            LLAMA: [EngineState(running=7, waiting_capacity=2, kv=0.4, preemptions=1), EngineState(running=3, kv=0.2)],
            OTHER: [EngineState(running=1)],
        }
    )
    .decode()
    .splitlines()
)
VALUES = ["NaN", "+Inf", "-Inf", "-1", "1e308", "0", "1e7", "1.0000001e7", "1e-300", "abc", "", "0x10", "1_0", "7"]
NAMES = [LLAMA, OTHER, WEIRD, "", LLAMA.upper(), LLAMA + " "]


@st.composite
def mutated_page(draw: st.DrawFn) -> str:
    lines = list(BASE_LINES)
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "value", "truncate", "insert", "label", "swap"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "value":
            head, _, _ = lines[i].rpartition(" ")
            lines[i] = f"{head} {draw(st.sampled_from(VALUES))}" if head else lines[i]
        elif op == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif op == "insert":
            lines.insert(i, draw(st.text(max_size=40)))
        elif op == "label":
            lines[i] = lines[i].replace(f'model_name="{LLAMA}"', f'model_name="{escape(draw(st.sampled_from(NAMES)))}"')
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n", "\r\n"]))


def parse_or_error(text: str) -> EngineSnapshot | MetricsError:
    try:
        return parse_vllm_metrics(text, LLAMA)
    except MetricsError as exc:
        return exc


@settings(max_examples=150)
@given(text=mutated_page())
def test_parser_on_mutated_pages_gives_a_plausible_snapshot_or_a_metrics_error(text: str) -> None:
    outcome = parse_or_error(text)  # anything but a MetricsError propagates and fails the test
    if isinstance(outcome, MetricsError):
        return
    for name in ("running", "waiting", "waiting_capacity", "preemptions_total", "success_total"):
        value = getattr(outcome, name)
        assert value is None or (math.isfinite(value) and 0 <= value <= 2 * 1e7), (name, value)
    assert outcome.kv_cache_usage is None or 0 <= outcome.kv_cache_usage <= 1


@pytest.fixture(scope="module")
def mutable() -> Iterator[FaultServer]:
    with fault_server() as server:
        yield server


@settings(max_examples=25)
@given(text=mutated_page())
def test_live_poll_of_mutated_pages_matches_the_parser(text: str, mutable: FaultServer) -> None:
    """Through a real scrape the outcome is the parser's: a good poll, or one failed poll logged once."""
    expected = parse_or_error(text)
    mutable.respond(page(text.encode()))
    spec = register_model(
        "m", base_url=f"{mutable.url}/v1", served_model_name=LLAMA, max_parallel_calls=FLOOR, policy=Fixed(GOOD)
    )
    controller = ModelRuntime(spec, clock=FakeClock())
    with captured_log() as log:
        target = bounded(controller.target)
    failures = [m for m in log.messages() if "metrics poll failed" in m]
    if isinstance(expected, MetricsError):
        assert target == FLOOR and controller.core.last_ok is False
        assert len(failures) == 1 and str(expected) in failures[0]
    else:
        assert target == GOOD and controller.core.last_ok is True and failures == []
        assert controller.core.last_observation is not None
        assert controller.core.last_observation.running == expected.running


# -- the table's other rows (docs/operations.md): policy, knobs, config, unknown model -------------------------------
class Boom:
    def next_target(self, target: float, obs: object) -> float:
        raise RuntimeError("plug-in bug")


class NotANumber:
    def next_target(self, target: float, obs: object) -> float:
        return math.nan


@pytest.mark.parametrize("policy", [Boom(), NotANumber()], ids=["raises", "nan"])
def test_a_policy_that_raises_or_answers_nan_holds_the_target(
    policy: object, good: FaultServer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    spec = register_model("m", base_url=f"{good.url}/v1", served_model_name=LLAMA, max_parallel_calls=FLOOR)
    controller = ModelRuntime(spec, clock=clock, policy=Fixed(GOOD))
    assert bounded(controller.target) == GOOD
    controller.core.policy = policy  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, "model_concurrency"):
        for _ in range(5):  # more than the grace: a policy failure is not a failed poll
            clock.advance(POLL_WAIT_MAX_S)
            assert bounded(controller.target) == GOOD
    assert controller.core.last_ok is True and controller.core.consecutive_failures == 0
    errors = [r for r in caplog.records if r.name == "model_concurrency"]
    if isinstance(policy, Boom):
        assert len(errors) == 5 and all(r.levelno == logging.ERROR for r in errors)
        assert errors[0].getMessage() == "policy Boom raised RuntimeError: plug-in bug; holding the target"
    else:
        assert errors == []  # NaN is held silently


def test_unknown_policy_name_falls_back_to_the_default_policy(
    good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLICY", "no-such-policy-anywhere")
    register_model("m", base_url=f"{good.url}/v1", served_model_name=LLAMA, max_parallel_calls=FLOOR)
    with caplog.at_level(logging.WARNING, "model_concurrency"):
        assert bounded(lambda: resolve_capacity("m")) >= FLOOR
    controller = controller_for("m")
    assert controller is not None and type(controller.core.policy).__name__ == "Adaptive"
    lines = warnings_of(caplog)
    assert len(lines) == 1 and lines[0].startswith("model m: unknown policy 'no-such-policy-anywhere'")
    assert "using the built-in default policy 'adaptive'" in lines[0]


def test_a_garbage_knob_warns_once_and_uses_its_default(
    good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MODEL_MAX_CONCURRENCY", "lots-of-them-7")  # unique: the warning is once per process
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    register(good)
    with caplog.at_level(logging.WARNING, "model_concurrency"):
        for _ in range(3):
            assert bounded(lambda: resolve_capacity("m")) == GOOD
    lines = warnings_of(caplog)
    assert lines == ["ignoring MODEL_MAX_CONCURRENCY='lots-of-them-7': not a valid int; using 512"]
    assert get_utilization("m")["ceiling"] == 512


def test_an_unreadable_config_file_logs_once(
    good: FaultServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: object
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", f"{tmp_path}/missing.toml")
    register(good)
    with caplog.at_level(logging.WARNING, "model_concurrency"):
        for _ in range(3):
            assert bounded(lambda: resolve_capacity("m")) == GOOD  # explicit registrations still work
            assert resolve_capacity("from-the-file") == 1  # unknown model: capacity 1, one warning per name
    lines = warnings_of(caplog)
    assert len(lines) == 2 and lines[0].startswith(f"cannot load MODEL_CONCURRENCY_CONFIG={tmp_path}/missing.toml")
    assert lines[1].startswith("model 'from-the-file' is not registered")
