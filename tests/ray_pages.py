"""A Ray metrics agent's page for vLLM engines running inside Ray, rendered by prometheus_client.

Ray Serve LLM records vLLM's metrics through ``ray.util.metrics`` (vLLM's ``RayPrometheusStatLogger``): each
name is sanitised to ``[a-zA-Z0-9_]`` and tagged with ``ReplicaId`` on top of vLLM's own labels. The node's
metrics agent exports them under the ``ray`` namespace, with Ray's own tags added (``WorkerId``, ``NodeAddress``,
``SessionName``, ``Component``, ``Version``, ``JobId``); counters get ``_total``. One page is one node: every
replica on it, each with one or more engines.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from servers import QUEUE_BUCKETS, EngineState

RAY_TAGS = ["WorkerId", "NodeAddress", "SessionName", "Component", "Version", "JobId"]


def ray_vllm_page(model: str, replicas: dict[str, list[EngineState]], node: str = "10.0.0.7") -> bytes:
    """The Ray-form page of one node holding ``replicas`` (replica id -> its engines) serving ``model``."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine", "ReplicaId", *RAY_TAGS]
    running = Gauge("ray_vllm_num_requests_running", "Running", labels, registry=reg)
    waiting = Gauge("ray_vllm_num_requests_waiting", "Waiting", labels, registry=reg)
    by = Gauge("ray_vllm_num_requests_waiting_by_reason", "Waiting by reason", [*labels, "reason"], registry=reg)
    kv = Gauge("ray_vllm_kv_cache_usage_perc", "KV usage", labels, registry=reg)
    # vLLM's cache config labels include block_size, in the Ray form as natively (the KV pool in tokens needs it).
    info = Gauge("ray_vllm_cache_config_info", "Cache config", [*labels, "block_size", "num_gpu_blocks"], registry=reg)
    pre = Counter("ray_vllm_num_preemptions", "Preemptions", labels, registry=reg)
    ok = Counter("ray_vllm_request_success", "Finished", [*labels, "finished_reason"], registry=reg)
    queue = Histogram("ray_vllm_request_queue_time_seconds", "Queue", labels, buckets=QUEUE_BUCKETS, registry=reg)
    e2e = Histogram("ray_vllm_e2e_request_latency_seconds", "E2E", labels, buckets=QUEUE_BUCKETS, registry=reg)
    # Ray's own series share the page: they must be ignored.
    tasks = Gauge("ray_tasks", "Tasks", ["Name", "State", "SessionName"], registry=reg)
    tasks.labels("LLMServer.__call__", "RUNNING", "session_1").set(7)
    for r, (replica_id, engines) in enumerate(replicas.items()):
        ray_tags = (f"{r:02x}" * 14, node, "session_2026-11-30_19-00-00_000000_1", "core_worker", "2.60.0", "01000000")
        for e, state in enumerate(engines):
            lv = (model, str(e), replica_id, *ray_tags)
            running.labels(*lv).set(state.running)
            waiting.labels(*lv).set(state.waiting_capacity + state.waiting_deferred)
            by.labels(*lv, "capacity").set(state.waiting_capacity)
            by.labels(*lv, "deferred").set(state.waiting_deferred)
            kv.labels(*lv).set(state.kv)
            info.labels(*lv, "16", "4096").set(1)
            pre.labels(*lv).inc(state.preemptions)
            ok.labels(*lv, "stop").inc(3)
            for wait in state.queue_waits:
                queue.labels(*lv).observe(wait)
            e2e.labels(*lv).observe(1.2)
    return generate_latest(reg)
