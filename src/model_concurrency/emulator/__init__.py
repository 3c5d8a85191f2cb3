"""A vLLM emulator: OpenAI-compatible HTTP endpoints and vLLM's ``/metrics`` over the SimPy engine model.

Why: the controller's real job is against live HTTP endpoints, and without a GPU every live path (HTTP clients,
the official ``openai`` client, benchmark clients such as guidellm, the scrape, a Prometheus server, peer
libraries) must still run for real. The emulator is a standard ASGI app (starlette, served by uvicorn) whose
requests are served by the *same* :class:`~model_concurrency.engine.Server` the simulator uses, advanced on the
wall clock times ``time_scale``.

Two forms, one app: served (``model-concurrency emulate``, :func:`serve_in_processes`), the engine core runs in
its own process fed by ``frontends`` uvicorn processes, as vLLM V1 runs its EngineCore apart from its API
servers, so HTTP load never stalls simulated time; in-process (:func:`create_app`, :func:`serve_in_thread`), the
core runs in the app's own event loop (tests, httpx's ASGI transport).

Endpoints: ``POST /v1/embeddings``, ``/v1/completions``, ``/v1/chat/completions`` (``stream`` as SSE on the
engine's step clock; ``max_tokens``, ``min_tokens``, ``ignore_eos`` as vLLM); ``GET /v1/models``, ``/health``,
``/metrics`` (vLLM's names and labels); ``GET|POST /admin/capacity`` to read or change ``max_num_seqs``,
``max_num_batched_tokens``, ``num_gpu_blocks``, ``speed``, ``engines`` (grow only) and ``up`` at run time.
``GET /v1/loads`` (SGLang's load report, in the ``sglang`` metrics flavour; 404 otherwise). Errors are
OpenAI-style JSON: 400 for bad input or an API the model does not serve (an embedding preset's chat and
completions, a generative preset's embeddings, as vLLM refuses them), 404 for an unknown model, 429 with
``Retry-After`` past a requests- or tokens-per-minute limit, 503 while the engine is down. A client disconnect
aborts its simulated requests.

Use::

    with serve_in_processes(EmulatorConfig(preset="bge-m3", max_num_seqs=64, time_scale=0.5)) as emu:
        httpx.post(f"{emu.base_url}/embeddings", json={"model": emu.model, "input": "hello"})
        emu.set_capacity(max_num_seqs=256)

or from the shell ``model-concurrency emulate --preset bge-m3 --port 8000``; several instances on several ports
form a fleet. Importing this package needs starlette and simpy (the ``emulator`` and ``sim`` extras); importing
``model_concurrency`` never imports it.
"""

from __future__ import annotations

from model_concurrency.emulator.app import METRICS_CONTENT_TYPE, Emulator, create_app
from model_concurrency.emulator.clock import SimDriver
from model_concurrency.emulator.core import EmulatorConfig, EngineCore
from model_concurrency.emulator.serve import RunningEmulator, serve, serve_in_processes, serve_in_thread

__all__ = [
    "METRICS_CONTENT_TYPE",
    "Emulator",
    "EmulatorConfig",
    "EngineCore",
    "RunningEmulator",
    "SimDriver",
    "create_app",
    "serve",
    "serve_in_processes",
    "serve_in_thread",
]
