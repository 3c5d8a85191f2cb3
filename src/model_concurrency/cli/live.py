"""Live subcommands: ``emulate`` (a vLLM emulator), ``run`` (an adaptive fan-out), ``watch`` (a table).

(Over 400 lines: three subcommands and their argument parsers, plus ``run``'s registration rule and request
shapes; each is short, and they share the HTTP, output and config-file helpers.)

They exist so every live path can be exercised without a GPU: ``emulate`` serves vLLM's API and ``/metrics`` from
the engine model, ``run`` drives real HTTP (embeddings, completions or chat) through ``map_concurrent`` and the
adaptive controller and shows how the target moved, and ``watch`` shows what each registered model's controller
sees, refreshed every poll. starlette, uvicorn, rich and tqdm are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from model_concurrency.config import ModelSpec

__all__ = ["register"]


def register(subparsers: Any) -> None:
    e = _subcommand(
        subparsers,
        emulate,
        help="serve an emulated vLLM (OpenAI API + /metrics) from the engine model",
        description="Serve vLLM's OpenAI-compatible API (/v1/models, /v1/embeddings, /v1/completions, "
        "/v1/chat/completions) and its /metrics page from the SimPy engine model, so the live paths (run, watch, "
        "your own client) can be tried without a GPU. Ctrl-C stops it.",
    )
    e.add_argument(
        "--preset",
        default="bge-m3",
        help="engine preset: bge-m3, llama-8b-h100-80gb, llama-8b-a100-80gb, llama-8b-a100-40gb (llama-8b-h100 and "
        "llama-8b-a100 name the 80 GB ones)",
    )
    e.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    e.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000, as vllm serve)")
    e.add_argument("--max-num-seqs", type=int, help="override the preset's max_num_seqs")
    e.add_argument("--engines", type=int, default=1, help="engine cores behind this server (data parallel)")
    e.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per wall second")
    e.add_argument("--served-model-name", help="model name clients send and /metrics labels carry")
    e.add_argument(
        "--no-frontend-cost",
        action="store_true",
        help="do not simulate API-server CPU per request (the emulator's own HTTP stack is a real one)",
    )
    e.add_argument("--frontends", type=int, default=1, help="HTTP front-end processes feeding the one engine process")
    e.add_argument("--rpm", type=float, help="requests per (simulated) minute; beyond it: 429 with Retry-After")
    e.add_argument("--tpm", type=float, help="tokens (prompt + max output) per (simulated) minute; beyond it: 429")
    e.add_argument(
        "--tokenizer",
        default="chars4",
        help="prompt token counting: chars4 (4 chars/token), words (the Whitespace pre-tokenizer split), "
        "or a tokenizer.json path (needs the tokenizers package)",
    )
    e.add_argument("--max-model-len", type=int, default=8192, help="context length: prompt + output tokens")
    e.add_argument(
        "--max-num-queued-reqs",
        type=int,
        help="refuse a call past this many queued requests (accepted, not running), as vLLM's admission control",
    )
    e.add_argument(
        "--reject-style",
        default="vllm",
        help="how a refusal looks: vllm, sglang (503), llm-d (429 rejected-saturated), llm-d-ttl, llm-d-evicted, "
        "dynamo (529), openai, anthropic (429 with their rate-limit headers)",
    )
    e.add_argument(
        "--metrics-flavor",
        default="vllm-new",
        choices=("vllm-new", "vllm", "sglang"),
        help="the /metrics page served: vllm-new (vLLM's latest design, default), vllm (a release without "
        "num_requests_waiting_by_reason) or sglang (SGLang's sglang:* page)",
    )
    e.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="as vllm serve: priority serves requests by their 'priority' field (lower first), then arrival",
    )
    e.add_argument(
        "--log-level",
        default="info",
        help="uvicorn's log level: critical, error, warning, info (default: one line per request) or debug",
    )

    r = _subcommand(
        subparsers,
        run,
        help="send N synthetic requests (embeddings, completions or chat) through map_concurrent",
        description="Send --items synthetic requests to a live OpenAI-compatible server (a vLLM, or "
        "`model-concurrency emulate`) through map_concurrent, with the controller sizing the fan-out from the "
        "server's /metrics; then print the throughput and the path the target took. The model's registration "
        "comes from MODEL_CONCURRENCY_CONFIG when that file has a [models.MODEL] table; --base-url, "
        "--metrics-url, --served-model-name and --floor, when given, override its fields. Without such a table "
        "the registration is the flags' own (then --base-url is required).",
    )
    r.add_argument("--model", required=True, help="registry name for the model (e.g. bge-m3)")
    r.add_argument(
        "--base-url",
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (required unless MODEL_CONCURRENCY_CONFIG "
        "registers --model with a base_url; overrides it when given)",
    )
    r.add_argument(
        "--endpoint",
        choices=tuple(ENDPOINTS),
        default="embeddings",
        help="the API each item calls: embeddings (POST {base-url}/embeddings with input), completions (POST "
        "{base-url}/completions with prompt and max_tokens) or chat (POST {base-url}/chat/completions with one "
        "user message and max_tokens); an embedding model serves only the first, a chat model the other two "
        "(default: embeddings)",
    )
    r.add_argument("--items", type=int, default=5000, help="number of synthetic requests to send (default 5000)")
    r.add_argument(
        "--served-model-name",
        help="the model name sent in each request (default: the config file's served_model_name, else the first "
        "id GET {base-url}/models lists)",
    )
    r.add_argument(
        "--metrics-url",
        help="the engine's Prometheus page (default: the config file's metrics_url, else {base-url} with /v1 "
        "replaced by /metrics, as vLLM serves it)",
    )
    r.add_argument(
        "--floor",
        type=int,
        help="static capacity: the target never goes below it (default: the config file's parallel_instances x "
        "max_parallel_calls, else 4)",
    )
    r.add_argument(
        "--max-tokens", type=int, default=16, help="max_tokens of each completions or chat request (default 16)"
    )
    r.add_argument("--input-chars", type=int, default=32, help="characters per synthetic input")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--export",
        metavar="HOST:PORT|PATH",
        help="publish the job's metrics there for `watch --job` (as MODEL_CONCURRENCY_EXPORT does)",
    )

    w = _subcommand(
        subparsers,
        watch,
        help="live table of every registered model's target and engine signals",
        description="With --job: show a running job's own target, in-flight calls, saturation and what limited "
        "its last decision, read from the page it publishes (MODEL_CONCURRENCY_EXPORT or run --export). Without: "
        "poll every model in a models TOML file ([models.NAME] tables, as MODEL_CONCURRENCY_CONFIG reads them) "
        "with controllers of this process and show each one's target, bounds and the engine signals they see "
        "(not any job's own target). Ctrl-C stops it.",
    )
    w.add_argument(
        "--job",
        metavar="URL|HOST:PORT|PATH",
        help="a running job's exported metrics (MODEL_CONCURRENCY_EXPORT / run --export): show its own state",
    )
    w.add_argument("--config", help="models TOML to load (else MODEL_CONCURRENCY_CONFIG)")
    w.add_argument("--interval", type=float, help="refresh seconds (default: MODEL_CONCURRENCY_POLL_S)")
    w.add_argument("--once", action="store_true", help="print one table and exit")


def _subcommand(
    subparsers: Any, handler: Callable[[argparse.Namespace], int], *, help: str, description: str
) -> argparse.ArgumentParser:
    """The subcommand named after its handler (``emulate``, ``run``, ``watch``), which it calls with the parsed
    arguments."""
    parser: argparse.ArgumentParser = subparsers.add_parser(handler.__name__, help=help, description=description)
    parser.set_defaults(func=handler)
    return parser


# ---------------------------------------------------------------------------------------------------- emulate
def emulate(args: argparse.Namespace) -> int:
    # The HTTP processes import uvicorn only after they are spawned; import it here so a missing extra is one
    # error line in this process instead of children that die while the parent waits for them.
    import uvicorn  # noqa: F401

    from model_concurrency.emulator import EmulatorConfig, serve

    # The flags named as the config's fields:
    same: tuple[str, ...] = ("preset", "max_num_seqs", "engines", "time_scale", "served_model_name", "frontends")
    same += ("tokenizer", "max_model_len", "max_num_queued_reqs", "reject_style", "metrics_flavor", "scheduling_policy")
    config = EmulatorConfig(
        **{name: getattr(args, name) for name in same},
        simulate_frontend=not args.no_frontend_cost,
        requests_per_minute=args.rpm,
        tokens_per_minute=args.tpm,
    )
    config.validate()  # unknown preset, bad counts, limits or tokenizer: fail before binding anything
    return serve(config, host=args.host, port=args.port, log_level=args.log_level)


# ---------------------------------------------------------------------------------------------------- run
def check_base_url(base_url: str) -> str:
    """``base_url`` without its trailing slash, or a ValueError saying what an OpenAI base URL looks like."""
    import httpx

    try:
        url = httpx.URL(base_url.strip())
    except httpx.InvalidURL as exc:
        raise ValueError(f"--base-url {base_url!r} is not a URL ({exc}); e.g. http://127.0.0.1:8000/v1") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"--base-url {base_url!r} is not an http(s) URL; e.g. http://127.0.0.1:8000/v1")
    return str(url).rstrip("/")


def served_name_from(base_url: str, headers: dict[str, str] | None = None) -> str:
    """The first model id the server lists (vLLM serves one), so ``--served-model-name`` is rarely needed."""
    import httpx

    url = f"{base_url.rstrip('/')}/models"
    response = httpx.get(url, timeout=10, headers=headers)
    response.raise_for_status()
    try:
        data = response.json().get("data") or []
        return str(data[0]["id"])
    except IndexError:
        raise ValueError(f"GET {url} lists no model; pass --served-model-name") from None
    except (ValueError, AttributeError, KeyError, TypeError):
        raise ValueError(
            f"GET {url} did not answer an OpenAI model list: is --base-url the OpenAI-compatible one (…/v1)?"
        ) from None


def synthetic_inputs(n: int, chars: int) -> list[str]:
    filler = " lorem ipsum dolor sit amet" * (chars // 20 + 1)
    return [(f"item {i}" + filler)[: max(chars, len(f"item {i}"))] for i in range(n)]


def compress_path(samples: list[tuple[float, int]], limit: int = 24) -> list[tuple[float, int]]:
    """Keep the points where the target changed (first and last always), thinned to ``limit`` points."""
    changes = [s for i, s in enumerate(samples) if i == 0 or s[1] != samples[i - 1][1]]
    if samples and changes[-1] != samples[-1]:
        changes.append(samples[-1])
    if len(changes) <= limit:
        return changes
    step = (len(changes) - 1) / (limit - 1)
    return [changes[round(i * step)] for i in range(limit)]


# What each --endpoint sends: the path under the base URL, and the shape its answer must have.
ENDPOINTS = {"embeddings": "/embeddings", "completions": "/completions", "chat": "/chat/completions"}
DEFAULT_FLOOR = 4


def request_body(endpoint: str, served: str, text: str, max_tokens: int, priority: int | None) -> dict[str, Any]:
    """The smallest valid OpenAI request of ``endpoint`` for one synthetic input.

    ``priority`` (the registration's, vLLM's per-request field) rides only on generation: the engine schedules
    those by it, and an engine without the priority policy rejects a non-zero one, so it is sent only when the
    registration asks."""
    if endpoint == "embeddings":
        return {"model": served, "input": text}
    body: dict[str, Any] = {"model": served, "max_tokens": max_tokens}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if priority is not None:
        body["priority"] = priority
    return body


def answer_tokens(endpoint: str, payload: Any) -> int:
    """The tokens an answer of ``endpoint`` reports, or a ValueError when it is not that endpoint's shape (a
    wrong --endpoint for the model, or a base URL that is not an OpenAI API)."""
    try:
        if endpoint == "embeddings":
            _ = payload["data"][0]["embedding"]
            return int(payload["usage"]["prompt_tokens"])
        choice = payload["choices"][0]
        _ = choice["message"]["content"] if endpoint == "chat" else choice["text"]
        return int(payload["usage"]["total_tokens"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError(f"the server did not answer an OpenAI {endpoint} response") from None


def load_models_file(path: str, label: str) -> list[ModelSpec]:
    """``config.load_config``, with any error naming the file (as ``label`` says it: ``--config PATH`` or
    ``MODEL_CONCURRENCY_CONFIG=PATH``) and, when one entry is at fault, the model."""
    import tomllib

    from model_concurrency import config

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ValueError(f"{label}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{label}: not valid TOML: {exc}") from None
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError(f"{label}: no models; expected [models.NAME] tables with base_url = ...")
    for name, table in models.items():
        if not isinstance(table, dict):
            raise ValueError(f"{label}: models.{name} must be a table ([models.{name}])")
        for key in ("base_url", "metrics_url", "prometheus_url", "served_model_name", "api_key_env", "policy"):
            if key in table and not isinstance(table[key], str):
                raise ValueError(f"{label}: model {name!r}: {key} = {table[key]!r}: expected a string")
        try:
            config.spec_from_table(name, table)
        except (ValueError, TypeError, AttributeError) as exc:
            reason = str(exc).removeprefix(f"model {name!r}: ")
            raise ValueError(f"{label}: model {name!r}: {reason}") from None
    try:
        return config.load_config(path)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{label}: {exc}") from None


def run_registration(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The model's registration for ``run`` (register_model's keywords) and one line saying where it came from.

    A job configured by MODEL_CONCURRENCY_CONFIG must be tried with that configuration (its metrics URL, its
    floor, its key, its policy): a registration rebuilt from the flags alone would replace it without a word.
    So the file's table is the base, and only the flags given explicitly override its fields."""
    from model_concurrency import config

    path = config.setting(*config.CONFIG_PATH).strip()
    from_file: ModelSpec | None = None
    if path:
        label = f"{config.CONFIG_PATH[0]}={path}"
        from_file = next((s for s in load_models_file(path, label) if s.name == args.model), None)
    fields: dict[str, Any] = {}
    if from_file is not None:
        fields = {f.name: getattr(from_file, f.name) for f in dataclasses.fields(from_file) if f.name != "name"}
    given = []
    for flag, key in (("--base-url", "base_url"), ("--metrics-url", "metrics_url")):
        value = getattr(args, key)
        if value is not None:
            fields[key] = check_base_url(value) if key == "base_url" else value
            given.append(flag)
    if args.served_model_name is not None:
        fields["served_model_name"] = args.served_model_name
        given.append("--served-model-name")
    if args.floor is not None:
        fields["parallel_instances"], fields["max_parallel_calls"] = 1, args.floor
        given.append("--floor")
    elif from_file is None:
        fields["max_parallel_calls"] = DEFAULT_FLOOR
    if not fields.get("base_url"):
        where = f"{config.CONFIG_PATH[0]}={path} has no base_url for it" if from_file is not None else "none given"
        raise ValueError(f"--base-url is required for model {args.model!r} ({where})")
    fields["base_url"] = check_base_url(fields["base_url"])
    if from_file is not None:
        override = f"; overridden on the command line: {', '.join(given)}" if given else ""
        source = f"registration of {args.model}: {config.CONFIG_PATH[0]}={path}{override}"
    elif path:
        source = (
            f"registration of {args.model}: the command line ({config.CONFIG_PATH[0]}={path} does not register "
            f"{args.model})"
        )
    else:
        source = f"registration of {args.model}: the command line"
    return fields, source


def run(args: argparse.Namespace) -> int:
    from model_concurrency import hooks, knobs
    from model_concurrency.config import register_model
    from model_concurrency.decision import NEVER_READ, explain_limit, static_limit
    from model_concurrency.runtime import registered_runtimes

    for flag, value in (("--items", args.items), ("--floor", args.floor), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    fields, source = run_registration(args)
    base_url = fields["base_url"]
    headers = {"Authorization": f"Bearer {fields['api_key']}"} if fields.get("api_key") else {}
    served = fields.get("served_model_name") or served_name_from(base_url, headers)
    fields["served_model_name"] = served
    spec = register_model(args.model, **fields)
    print(source)
    if args.export:
        from model_concurrency import export

        print(f"publishing the job's metrics at {export.start(args.export)} (watch --job {args.export})")
    inputs = synthetic_inputs(args.items, args.input_chars)
    samples: list[tuple[float, int]] = []
    outcome = asyncio.run(_fan_out(args, base_url, served, headers, spec.priority, inputs, samples))
    elapsed, results = outcome
    util = hooks.get_utilization(args.model)
    path = compress_path(samples)
    print(
        f"model {args.model} (served as {served}) at {base_url}: {args.endpoint}, policy {util['policy']}, "
        f"metrics {util['metrics_url'] or 'none'}"
    )
    print(f"{len(results)} items in {elapsed:.2f} s: {len(results) / elapsed:.1f} items/s")
    print(f"target: floor {util['floor']}, ceiling {util['ceiling']}, max {max(t for _, t in samples)}, "
          f"final {util['current_target']}")  # fmt: skip
    print("target path (s: target): " + ", ".join(f"{t:.1f}: {v}" for t, v in path))
    limit = util["limited_by"]
    if not util["adaptive"]:
        limit = limit or static_limit(bool(knobs.setting(*knobs.ADAPTIVE_FLAG)))
    runtime = registered_runtimes().get(args.model)
    never_read = runtime is not None and runtime.health.metrics_never_read
    if never_read and limit in (None, "guard", "floor"):
        limit = NEVER_READ  # the runtime's own reason once its core tells a never-read page from an outage
    if never_read:
        print(f"metrics: {util['metrics_url']} never answered ({util['last_error']}); the target stayed at the floor")
    print(f"limited by: {explain_limit(limit)}; last decision: {util['last_decision'] or 'none'}")
    return 0


async def _fan_out(
    args: argparse.Namespace,
    base_url: str,
    served: str,
    headers: dict[str, str],
    priority: int | None,
    inputs: list[str],
    samples: list[tuple[float, int]],
) -> tuple[float, list[int]]:
    from model_concurrency import hooks, map_concurrent
    from model_concurrency.cli._output import progress_bar
    from model_concurrency.integrations.httpx import ShardedAsyncClient

    start = 0.0
    done = 0
    url = f"{base_url}{ENDPOINTS[args.endpoint]}"

    async def sample() -> None:
        while True:
            samples.append((time.monotonic() - start, int(hooks.get_utilization(args.model)["current_target"])))
            await asyncio.sleep(0.1)

    desc = f"{args.endpoint} / {args.model}"
    async with ShardedAsyncClient(connections=512, timeout=120, headers=headers) as client:
        with progress_bar(len(inputs), desc, enabled=not args.quiet, unit="items") as update:
            start = time.monotonic()

            async def call(text: str) -> int:
                nonlocal done
                body = request_body(args.endpoint, served, text, args.max_tokens, priority)
                response = await client.post(url, json=body)
                response.raise_for_status()
                done += 1
                update(done)
                try:
                    return answer_tokens(args.endpoint, response.json())
                except ValueError as exc:
                    raise ValueError(f"POST {url}: {exc}") from None

            sampler = asyncio.ensure_future(sample())
            try:
                results = await map_concurrent(inputs, call, model=args.model)
            finally:
                sampler.cancel()
    elapsed = time.monotonic() - start
    samples.append((elapsed, int(hooks.get_utilization(args.model)["current_target"])))
    return elapsed, results


# ---------------------------------------------------------------------------------------------------- watch
_COLUMNS = (
    ("model", "model"),
    ("target", "current_target"),
    ("floor", "floor"),
    ("ceiling", "ceiling"),
    ("in-flight", "inflight"),
    ("running", "running"),
    ("cap-waiting", "waiting_capacity"),
    ("KV usage", "kv_cache_usage"),
    ("saturated", "saturated"),
    ("gateway", "gateway_saturation"),
    ("metrics", "metrics_ok"),
    ("policy", "policy"),
)


def utilization_rows() -> list[dict[str, Any]]:
    """Poll every registered model when due, then one snapshot of all of them."""
    from model_concurrency import hooks
    from model_concurrency.config import registered_models

    for name in registered_models():
        hooks.resolve_capacity(name)  # polls when due; never raises
    rows = []
    for name, util in hooks.get_all_utilization().items():
        row = dict(util)
        row["model"] = name
        kv = row.get("kv_cache_usage")
        row["kv_cache_usage"] = None if kv is None else f"{100 * kv:.1f}%"
        ok = row.get("metrics_ok")
        row["gateway_saturation"] = gateway_cell(row.get("gateway_saturation"), row.get("gateway_saturated"))
        row["metrics_ok"] = "static" if ok is None else ("ok" if ok else short_failure(row.get("last_error")))
        rows.append(row)
    return rows


def gateway_cell(score: Any, saturated: Any) -> str | None:
    """The gateway's pool score, ``sat`` when it counts the pool saturated (≥ 1.0, or stale metrics)."""
    if saturated is None:
        return None  # static: nothing measured
    text = "stale" if score is None else f"{score:.2f}"
    return f"{text} sat" if saturated else text


def short_failure(error: Any) -> str:
    """``failed (ConnectError)`` from ``ScrapeError: ConnectError: All connection attempts failed``.

    The innermost exception name says what went wrong in a cell that fits a table; the whole message is in the
    controller's warning log line.
    """
    if not error:
        return "failed"
    names = [part for part in str(error).split(": ") if part.isidentifier()]
    return f"failed ({names[-1]})" if names else f"failed ({str(error)[:24]})"


def render_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    from model_concurrency.cli._output import fmt

    title = "model-concurrency watch — this process's own controllers, not a running job's (see --job)"
    table = Table(title=f"{title} — {time.strftime('%H:%M:%S')}")
    for title, _ in _COLUMNS:
        justify: Literal["left", "right"] = "left" if title in ("model", "metrics", "policy") else "right"
        # Headers whole; the metrics cell on one line (a failure is a short label, see short_failure).
        table.add_column(title, justify=justify, min_width=len(title), no_wrap=title == "metrics")
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for _, key in _COLUMNS))
    return table


def load_watch_config(path: str) -> None:
    """``config.load_config`` for ``watch --config``, with any error naming the file and the model at fault."""
    load_models_file(path, f"--config {path}")


def watch(args: argparse.Namespace) -> int:
    from rich.live import Live

    from model_concurrency import config

    if args.job:
        return watch_job(args)
    if args.config:
        load_watch_config(args.config)
    if not config.registered_models():
        raise ValueError("no registered models: pass --config models.toml or set MODEL_CONCURRENCY_CONFIG")
    table = render_table(utilization_rows())
    console = wide_console(table)
    if args.once:
        console.print(table)
        return 0
    interval = args.interval if args.interval is not None else config.setting(*config.POLL_S)
    interval = max(0.2, float(interval))
    with Live(table, console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(render_table(utilization_rows()))


def wide_console(table: Any) -> Any:
    """A console as wide as ``table`` wants, so no column is cut to fit a narrow (or absent) terminal."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console()
    console.width = max(console.width, Measurement.get(console, console.options.update_width(1000), table).maximum)
    return console


def watch_job(args: argparse.Namespace) -> int:
    """``watch --job``: the job's page, read every interval (cli/job.py renders it)."""
    from rich.live import Live

    from model_concurrency.cli.job import job_age_s, job_page, job_rows, render_job_table

    def table() -> Any:
        return render_job_table(job_rows(job_page(args.job)), args.job, job_age_s(args.job))

    first = table()
    console = wide_console(first)
    if args.once:
        console.print(first)
        return 0
    interval = max(0.2, float(args.interval if args.interval is not None else 1.0))
    with Live(first, console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(table())
