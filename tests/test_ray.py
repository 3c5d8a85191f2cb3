"""The fan-out inside a real local Ray: a Ray Data pipeline through ``map_batches``, actors, and tasks.

One Ray instance for the module (``num_cpus=2``, no dashboard, fractional-CPU actors), shut down at the end. The
workers embed through a real emulator on 127.0.0.1 and read their engine signals from real loopback pages (the
emulator's own ``/metrics``, or a Ray metrics agent's page in the ``ray_vllm_*`` form). Every worker registers
the model from the same configuration; each test checks that from inside the workers.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import ray.data
from ray import cloudpickle

from model_concurrency import get_utilization
from model_concurrency.emulator import EmulatorConfig, RunningEmulator, serve_in_thread
from model_concurrency.emulator.openai_shapes import embedding_vector
from model_concurrency.ray import FanOut, MapBatches, fan_out_actor, fan_out_task
from ray_pages import ray_vllm_page
from servers import Behaviour, EngineState, metrics_server

DIM = 8
FLOOR = 3  # max_parallel_calls in the configuration: what a worker that registered it reports as its floor

# Workers unpickle the per-item callable; they cannot import this test module, so it travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@contextmanager
def local_ray(poll_s: float) -> Iterator[None]:
    """A local Ray of two CPUs whose workers poll every ``poll_s`` and read no fleet-wide Prometheus."""
    temp_dir = tempfile.mkdtemp(prefix="mc-ray-")  # short: Ray's socket paths must fit in 107 bytes
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=128 * 1024 * 1024,  # small and fixed: CI containers often have a small /dev/shm
        _temp_dir=temp_dir,
        runtime_env={"env_vars": {"MODEL_CONCURRENCY_POLL_S": str(poll_s), "MODEL_CONCURRENCY_PROMETHEUS_URL": ""}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
        # Removed at exit, not now: Ray Data's log handler in this process keeps the first session's log file, so a
        # later module's session would write into a removed directory.
        atexit.register(shutil.rmtree, temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray(0.2):
        yield


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with serve_in_thread(EmulatorConfig(preset="bge-m3", max_num_seqs=16, simulate_frontend=False)) as emu:
        yield emu


@dataclass(frozen=True)
class Embed:
    """One item: a real embeddings call, tagged with the worker that made it and that worker's view of the model."""

    base_url: str

    def __call__(self, text: str) -> dict[str, Any]:
        body = {"model": "BAAI/bge-m3", "input": text, "dimensions": DIM}
        response = httpx.post(f"{self.base_url}/embeddings", json=body, timeout=30)
        if response.is_error:  # httpx's HTTPStatusError does not survive pickling into a Ray Data column
            raise RuntimeError(f"HTTP {response.status_code}")
        view = get_utilization("bge")
        return {"embedding": response.json()["data"][0]["embedding"], "pid": os.getpid(), "floor": view["floor"]}


def items(n: int) -> list[str]:
    return [f"item {i} lorem ipsum" for i in range(n)]


def check_results(texts: list[str], results: list[dict[str, Any]]) -> set[int]:
    """Every item has its own embedding, from a worker that registered the model; returns the workers' pids."""
    assert len(results) == len(texts)
    for text, result in zip(texts, results, strict=True):
        assert result["embedding"] == pytest.approx(embedding_vector(text.encode(), DIM))
        assert result["floor"] == FLOOR
    return {int(result["pid"]) for result in results}


def write_config(emu: RunningEmulator, path: Path) -> Path:
    path.write_text(
        f"""
[models.bge]
base_url = "{emu.base_url}"
served_model_name = "{emu.model}"
max_parallel_calls = {FLOOR}
roles = ["embedding"]
"""
    )
    return path


def test_ray_data_pipeline_through_map_batches(ray_cluster: None, emulator: RunningEmulator, tmp_path: Path) -> None:
    config = str(write_config(emulator, tmp_path / "models.toml"))  # a path every worker can read
    fan_out = FanOut(Embed(emulator.base_url), model="bge", config=config, return_exceptions=True)
    texts = items(120)
    texts[57] = ""  # the emulator refuses an empty input: that item's exception takes its place
    ds = ray.data.from_items([{"item": t} for t in texts]).map_batches(
        MapBatches,
        fn_constructor_args=(fan_out,),
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=0.25,
        batch_size=10,
    )
    rows = sorted(ds.take_all(), key=lambda row: texts.index(row["item"]))
    assert [row["item"] for row in rows] == texts
    failed = rows.pop(57)["result"]
    assert isinstance(failed, RuntimeError) and str(failed) == "HTTP 400"
    pids = check_results(texts[:57] + texts[58:], [row["result"] for row in rows])
    assert len(pids) == 2 and os.getpid() not in pids  # two actors, each one client


def test_actors_fan_out_and_read_a_ray_form_page(ray_cluster: None, emulator: RunningEmulator) -> None:
    page = ray_vllm_page(emulator.model, {"r1": [EngineState(running=5)], "r2": [EngineState(running=7, kv=0.6)]})
    with metrics_server(Behaviour(body=page)) as agent:
        config = {
            "models": {
                "bge": {
                    "base_url": emulator.base_url,
                    "served_model_name": emulator.model,
                    "metrics_url": f"{agent.url}/metrics",  # a Ray metrics agent's page, not the engine's
                    "max_parallel_calls": FLOOR,
                }
            }
        }
        fan_out = FanOut(Embed(emulator.base_url), model="bge", config=config)
        actor_class = fan_out_actor(num_cpus=0.25)
        actors = [actor_class.remote(fan_out) for _ in range(2)]
        texts = items(80)
        chunks = [texts[:40], texts[40:]]
        results = ray.get([actor.map.remote(chunk) for actor, chunk in zip(actors, chunks, strict=True)], timeout=120)
        views = ray.get([actor.utilization.remote() for actor in actors], timeout=60)
        for actor in actors:
            ray.kill(actor)
    pids = check_results(texts, results[0] + results[1])
    assert pids == {view["pid"] for view in views} and len(pids) == 2
    for view in views:
        assert view["models"] == ["bge"]
        assert view["floor"] == FLOOR
        assert view["metrics_ok"] is True
        assert view["running"] == 12  # summed over the page's two replicas


def test_tasks_fan_out(ray_cluster: None, emulator: RunningEmulator, tmp_path: Path) -> None:
    fan_out = FanOut(
        Embed(emulator.base_url), model="embedding", config=str(write_config(emulator, tmp_path / "models.toml"))
    )
    task = fan_out_task(num_cpus=0.25)
    texts = items(60)
    chunks = [texts[i : i + 15] for i in range(0, len(texts), 15)]
    results = ray.get([task.remote(fan_out, chunk) for chunk in chunks], timeout=120)
    check_results(texts, [result for chunk in results for result in chunk])


def test_imports_without_ray() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"  # any `import ray` now raises ImportError
        "import model_concurrency.ray as m\n"
        "assert m.FanOut and m.MapBatches\n"
        "try:\n    m.fan_out_actor()\nexcept ImportError:\n    print('needs ray')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "needs ray"
    lazy = "import sys, model_concurrency.ray\nprint(sorted({'ray', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", lazy], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # with Ray installed, importing the module still loads neither
