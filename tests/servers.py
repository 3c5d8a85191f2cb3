"""Real HTTP servers on 127.0.0.1 for tests that cross a socket: configurable, hostile when asked.

``MetricsServer`` serves whatever :class:`Behaviour` says: a body, a status, headers, a delay before answering,
or a body trickled a few bytes at a time. The behaviour can be changed while the server runs, so one server
can drive a controller through a ramp, a saturation and an outage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


@dataclass
class Behaviour:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/plain; version=0.0.4"})
    delay_s: float = 0.0
    trickle_bytes_per_s: float | None = None
    hang: bool = False
    render: Callable[[], bytes] | None = None  # a body made at each request (e.g. gauges that follow the client)
    # SGLang's GET /v1/loads (JSON): None answers 404 there, as a server without the endpoint does, so a page
    # rendered with side effects is rendered once per poll.
    loads: Callable[[], bytes] | None = None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.requests.append((self.path, dict(self.headers.items())))
        b = srv.behaviour
        if b.hang:
            srv.stop_event.wait(30)
            return
        if b.delay_s:
            srv.stop_event.wait(b.delay_s)
        status, headers = b.status, b.headers
        if self.path.split("?")[0] == "/v1/loads":
            body = b.loads() if b.loads is not None else b'{"detail":"Not Found"}'
            status, headers = (200 if b.loads is not None else 404), {"Content-Type": "application/json"}
        else:
            body = b.render() if b.render is not None else b.body
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if b.trickle_bytes_per_s:
                for i in range(len(body)):
                    if srv.stop_event.is_set():
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(1 / b.trickle_bytes_per_s)
            else:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    behaviour: Behaviour
    requests: list[tuple[str, dict[str, str]]]
    stop_event: threading.Event


@dataclass
class MetricsServer:
    server: _Server

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def behaviour(self) -> Behaviour:
        return self.server.behaviour

    @behaviour.setter
    def behaviour(self, value: Behaviour) -> None:
        self.server.behaviour = value

    def serve(self, body: bytes | str, **kwargs: object) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.server.behaviour = Behaviour(body=data, **kwargs)  # type: ignore[arg-type]

    @property
    def requests(self) -> list[tuple[str, dict[str, str]]]:
        return self.server.requests


@contextmanager
def metrics_server(behaviour: Behaviour | None = None) -> Iterator[MetricsServer]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.behaviour = behaviour or Behaviour()
    srv.requests = []
    srv.stop_event = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield MetricsServer(srv)
    finally:
        srv.stop_event.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)


QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)


@dataclass
class EngineState:
    running: float = 0
    waiting_capacity: float = 0
    waiting_deferred: float = 0
    kv: float = 0.1
    preemptions: float = 0
    # Each request's queue time, observed into vllm:request_queue_time_seconds.
    queue_waits: tuple[float, ...] = (0.2,)
    success: float = 3  # requests finished (vllm:request_success_total{finished_reason="stop"})
    # The queue-time histogram's count and sum when given (else one request that waited 0.2 s).
    queue_count: float | None = None
    queue_sum: float = 0.0


def set_histogram(child: Histogram, count: float, total: float) -> None:
    """Give a histogram child a count and a sum without observing each value (all in the +Inf bucket)."""
    child._sum.set(total)  # type: ignore[attr-defined]
    child._buckets[-1].set(count)  # type: ignore[attr-defined]


def vllm_page(models: dict[str, list[EngineState]], *, old_kv_name: bool = False, by_reason: bool = True) -> bytes:
    """A vLLM-shaped /metrics page rendered by prometheus_client: per model, one EngineState per engine label."""
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    running = Gauge("vllm:num_requests_running", "Running", labels, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Waiting", labels, registry=reg)
    by = Gauge("vllm:num_requests_waiting_by_reason", "Waiting by reason", [*labels, "reason"], registry=reg)
    kv_name = "vllm:gpu_cache_usage_perc" if old_kv_name else "vllm:kv_cache_usage_perc"
    kv = Gauge(kv_name, "KV usage", labels, registry=reg)
    info = Gauge("vllm:cache_config_info", "Cache config", [*labels, "block_size", "num_gpu_blocks"], registry=reg)
    pre = Counter("vllm:num_preemptions", "Preemptions", labels, registry=reg)
    ok = Counter("vllm:request_success", "Finished", [*labels, "finished_reason"], registry=reg)
    queue = Histogram("vllm:request_queue_time_seconds", "Queue", labels, buckets=QUEUE_BUCKETS, registry=reg)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E", labels, buckets=QUEUE_BUCKETS, registry=reg)
    for model, engines in models.items():
        for i, e in enumerate(engines):
            lv = (str(i), model)
            running.labels(*lv).set(e.running)
            waiting.labels(*lv).set(e.waiting_capacity + e.waiting_deferred)
            if by_reason:
                by.labels(*lv, "capacity").set(e.waiting_capacity)
                by.labels(*lv, "deferred").set(e.waiting_deferred)
            kv.labels(*lv).set(e.kv)
            info.labels(*lv, "16", "4096").set(1)
            pre.labels(*lv).inc(e.preemptions)
            ok.labels(*lv, "stop").inc(e.success)
            if e.queue_count is None:
                for wait in e.queue_waits:
                    queue.labels(*lv).observe(wait)
            else:
                set_histogram(queue.labels(*lv), e.queue_count, e.queue_sum)
            e2e.labels(*lv).observe(1.2)
    from prometheus_client import PROCESS_COLLECTOR

    reg.register(PROCESS_COLLECTOR)
    return generate_latest(reg)


# SGLang's queue-time buckets (python/sglang/srt/metrics/collector.py), shortened to the first dozen.
SGLANG_QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20)


@dataclass
class SglangScheduler:
    """One SGLang scheduler (a data-parallel rank): what its gauges and counters read."""

    running: float = 0
    queue: float = 0
    token_usage: float = 0.1
    max_tokens: int = 100_000
    retracted: float = 0
    grammar_queue: float = 0


def sglang_page(models: dict[str, list[SglangScheduler]], *, tp: int = 1, finished: float = 3) -> bytes:
    """An SGLang ``--enable-metrics`` page rendered by prometheus_client, from SGLang's published metric list.

    Scheduler series carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` (and ``dp_rank`` when a
    model has several schedulers); with ``tp`` > 1 every TP rank repeats its scheduler's numbers, as with
    ``--enable-metrics-for-all-schedulers``. Tokenizer counters carry ``model_name`` only."""
    reg = CollectorRegistry()
    dp = any(len(schedulers) > 1 for schedulers in models.values())
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", *(["dp_rank"] if dp else [])]

    def gauge(name: str, doc: str) -> Gauge:
        return Gauge(f"sglang:{name}", doc, labels, registry=reg, multiprocess_mode="mostrecent")

    running = gauge("num_running_reqs", "The number of running requests.")
    used = gauge("num_used_tokens", "The number of used tokens.")
    usage = gauge("token_usage", "The token usage.")
    throughput = gauge("gen_throughput", "The generation throughput (token/s).")
    queue = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
    grammar = gauge("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.")
    hit = gauge("cache_hit_rate", "The prefix cache hit rate.")
    pool = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.")
    retracted_now = Gauge("sglang:num_retracted_reqs", "The number of retracted requests.", labels, registry=reg)
    retracted = Counter("sglang:num_retracted_requests", "Total number of retracted requests.", labels, registry=reg)
    queue_time = Histogram(
        "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", labels,
        buckets=SGLANG_QUEUE_BUCKETS, registry=reg,
    )  # fmt: skip
    tok = ["model_name"]
    prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", tok, registry=reg)
    generation = Counter("sglang:generation_tokens", "Number of generation tokens processed.", tok, registry=reg)
    requests = Counter("sglang:num_requests", "Number of requests processed.", tok, registry=reg)
    aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", tok, registry=reg)
    e2e = Histogram("sglang:e2e_request_latency_seconds", "E2E", tok, buckets=QUEUE_BUCKETS, registry=reg)
    for model, schedulers in models.items():
        for i, s in enumerate(schedulers):
            for rank in range(tp):
                lv = [model, "unified", str(rank), "0", "0", *([str(i)] if dp else [])]
                running.labels(*lv).set(s.running)
                used.labels(*lv).set(round(s.token_usage * s.max_tokens))
                usage.labels(*lv).set(s.token_usage)
                throughput.labels(*lv).set(1234.5)
                queue.labels(*lv).set(s.queue)
                grammar.labels(*lv).set(s.grammar_queue)
                hit.labels(*lv).set(0.25)
                pool.labels(*lv).set(s.max_tokens)
                retracted_now.labels(*lv).set(0)
                retracted.labels(*lv).inc(s.retracted)
                queue_time.labels(*lv).observe(0.2)
        prompt.labels(model).inc(300 * finished)
        generation.labels(model).inc(50 * finished)
        requests.labels(model).inc(finished)
        aborted.labels(model).inc(0)
        e2e.labels(model).observe(1.2)
    from prometheus_client import PROCESS_COLLECTOR

    reg.register(PROCESS_COLLECTOR)
    return generate_latest(reg)
