"""What one ``/metrics`` scrape costs the engine's API server, and what N polling workers add up to.

Three figures, measured in one run:

* **served scrape**: an emulator (``model-concurrency emulate``, uvicorn + Starlette, the engine model's page) runs
  as a child process; K scrapes of ``/metrics`` and K requests to ``/v1/models`` (the cheapest route: the HTTP
  stack alone) are timed by the child's own CPU clock (``/proc/<pid>/stat``), minus its idle CPU over the same
  wall time. The ratio says how much of a scrape is the page rather than HTTP.
* **vLLM-sized render**: ``prometheus_client.generate_latest`` of a registry shaped like vLLM V1's
  ``PrometheusStatLogger`` (its gauges, counters and histograms with their buckets, per engine, plus the process
  and GC collectors), which is how a real vLLM API server renders its page; CPU ms and bytes.
* **client parse**: ``parse_vllm_metrics`` of each page, the client's side of one poll.

Then the load of N workers, each polling every ``--poll-s`` seconds: N / poll_s scrapes a second, times the CPU
per scrape, as a fraction of one API-server core.

    .venv/bin/python benchmarks/metrics_cost.py [--scrapes 400] [--engines 1] [--poll-s 12]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

from model_concurrency.signals.vllm import parse_vllm_metrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TICKS = os.sysconf("SC_CLK_TCK")

# vLLM V1's histogram buckets (vllm/v1/metrics/loggers.py), max_model_len 8192 for the 1-2-5 token buckets.
TOKENS_125 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
PHASE = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]
HISTOGRAMS = {
    "vllm:iteration_tokens_total": ITERATION,
    "vllm:request_prompt_tokens": TOKENS_125,
    "vllm:request_generation_tokens": TOKENS_125,
    "vllm:request_max_num_generation_tokens": TOKENS_125,
    "vllm:request_params_max_tokens": TOKENS_125,
    "vllm:request_params_n": [1, 2, 5, 10, 20],
    "vllm:time_to_first_token_seconds": TTFT,
    "vllm:inter_token_latency_seconds": ITL,
    "vllm:request_time_per_output_token_seconds": ITL,
    "vllm:e2e_request_latency_seconds": PHASE,
    "vllm:request_queue_time_seconds": PHASE,
    "vllm:request_inference_time_seconds": PHASE,
    "vllm:request_prefill_time_seconds": PHASE,
    "vllm:request_decode_time_seconds": PHASE,
}


def vllm_sized_registry(engines: int) -> CollectorRegistry:
    """A registry with vLLM V1's series for ``engines`` engines of one model, every series observed once."""
    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        gauge = Gauge(name, name, labels, registry=reg)
        for e in range(engines):
            gauge.labels(str(e), MODEL).set(0.3 if "usage" in name else 3)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "by reason", [*labels, "reason"], registry=reg)
    info = Gauge("vllm:cache_config_info", "cache config", ["block_size", "num_gpu_blocks", "engine"], registry=reg)
    counters = {
        name: Counter(name, name, labels, registry=reg)
        for name in (
            "vllm:num_preemptions",
            "vllm:prompt_tokens",
            "vllm:generation_tokens",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
        )
    }
    success = Counter("vllm:request_success", "finished", [*labels, "finished_reason"], registry=reg)
    histograms = {
        name: Histogram(name, name, labels, buckets=buckets, registry=reg) for name, buckets in HISTOGRAMS.items()
    }
    for e in range(engines):
        lv = (str(e), MODEL)
        for reason in ("capacity", "deferred"):
            by_reason.labels(*lv, reason).set(1)
        info.labels("16", "40960", str(e)).set(1)
        for counter in counters.values():
            counter.labels(*lv).inc(7)
        for reason in ("stop", "length", "abort", "error"):
            success.labels(*lv, reason).inc(3)
        for hist in histograms.values():
            hist.labels(*lv).observe(0.3)
    for collector in (process_collector.ProcessCollector, platform_collector.PlatformCollector):
        collector(registry=reg)
    gc_collector.GCCollector(registry=reg)
    return reg


def cpu_ms(fn: Callable[[], object], repeat: int) -> float:
    """Mean process CPU per call, in ms (best of three rounds)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.process_time() - start) / repeat * 1000)
    return best


def child_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def served_scrape(scrapes: int, engines: int) -> tuple[float, float, float, int, str]:
    """(ms CPU per /metrics, ms CPU per /v1/models, idle ms CPU per second, page bytes, page) on a child server."""
    port = free_port()
    cli = os.path.join(os.path.dirname(sys.executable), "model-concurrency")
    cmd = [cli, "emulate", "--preset", "bge-m3", "--port", str(port)]
    cmd += ["--engines", str(engines), "--served-model-name", MODEL, "--log-level", "warning"]
    child = subprocess.Popen(cmd)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=10) as client:
            for _ in range(200):
                try:
                    client.get(f"{base}/health").raise_for_status()
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            page = client.get(f"{base}/metrics").text

            def per_request(path: str) -> tuple[float, float]:
                cpu0, wall0 = child_cpu_s(child.pid), time.perf_counter()
                for _ in range(scrapes):
                    client.get(f"{base}{path}").raise_for_status()
                return child_cpu_s(child.pid) - cpu0, time.perf_counter() - wall0

            time.sleep(0.5)
            cpu0 = child_cpu_s(child.pid)
            time.sleep(3.0)
            idle_per_s = (child_cpu_s(child.pid) - cpu0) / 3.0
            metrics_cpu, metrics_wall = per_request("/metrics")
            models_cpu, models_wall = per_request("/v1/models")
        metrics_ms = max(0.0, metrics_cpu - idle_per_s * metrics_wall) / scrapes * 1000
        models_ms = max(0.0, models_cpu - idle_per_s * models_wall) / scrapes * 1000
        return metrics_ms, models_ms, idle_per_s * 1000, len(page.encode()), page
    finally:
        child.terminate()
        child.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=400)
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--poll-s", type=float, default=12.0)
    args = parser.parse_args()

    metrics_ms, models_ms, idle_ms, emu_bytes, emu_page = served_scrape(args.scrapes, args.engines)
    reg = vllm_sized_registry(args.engines)
    vllm_page = generate_latest(reg).decode()
    render_ms = cpu_ms(lambda: generate_latest(reg), args.scrapes)
    parse_emu_ms = cpu_ms(lambda: parse_vllm_metrics(emu_page, MODEL), args.scrapes)
    parse_vllm_ms = cpu_ms(lambda: parse_vllm_metrics(vllm_page, MODEL), args.scrapes)

    print(f"emulator /metrics served (HTTP + page): {metrics_ms:.2f} ms CPU, {emu_bytes} bytes")
    ratio = metrics_ms / models_ms
    print(f"emulator /v1/models served (HTTP only): {models_ms:.2f} ms CPU; /metrics vs /v1/models {ratio:.2f}x")
    print(f"emulator idle: {idle_ms:.1f} ms CPU per second (subtracted)")
    lines = vllm_page.count("\n")
    print(f"vLLM-sized render (generate_latest): {render_ms:.2f} ms CPU, {len(vllm_page)} bytes, {lines} lines")
    print(f"client parse: emulator page {parse_emu_ms:.2f} ms, vLLM-sized page {parse_vllm_ms:.2f} ms CPU")
    per_scrape = models_ms + render_ms
    print(f"vLLM-sized scrape estimate (HTTP + render): {per_scrape:.2f} ms CPU")
    for n in (1, 10, 100, 1000, 10000):
        rate = n / args.poll_s
        load = rate * per_scrape / 1000
        kib = rate * len(vllm_page) / 1024
        print(f"  N={n:>5}: {rate:8.2f} scrapes/s, {load * 100:6.2f} % of one API-server core, {kib:8.1f} KiB/s")


if __name__ == "__main__":
    main()
