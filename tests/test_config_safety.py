"""Configuration safety: where a poll may go, and that a credential never comes back out.

* Metrics URLs are http(s), carry no userinfo, query or fragment, and sit on ``base_url``'s origin unless a
  ``metrics_url`` is given explicitly; the rejection itself does not echo the secret it refused.
* A planted token (``api_key``) is sent only to the model's own origin, never across a redirect to another host,
  never to a Prometheus server; and it never appears in log records (every logger, DEBUG), utilization
  snapshots, reprs, exception messages or tracebacks, captured while servers answer 200, 401, 500 and redirects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FakeClock
from fault_servers import FaultServer, bounded, fault_server, page, redirect
from model_concurrency import get_all_utilization, get_utilization, register_model, resolve_capacity
from model_concurrency.config import get_model, load_config
from model_concurrency.hooks import aresolve_capacity, controller_for
from model_concurrency.runtime import ModelRuntime
from model_concurrency.signals.scrape import ScrapeError, ScrapeLimits, fetch_text, metrics_url_from_base
from servers import EngineState, vllm_page

TOKEN = "sk-PLANTED-7f3a9c1e5b"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def good_page() -> bytes:
    return vllm_page({LLAMA: [EngineState(running=5)]})


# -- URLs -------------------------------------------------------------------------------------------------------------
BAD_URLS = [
    "ftp://127.0.0.1/v1",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "127.0.0.1:8000/v1",
    "//127.0.0.1:8000/v1",
    "http:///v1",
    f"http://user:{TOKEN}@127.0.0.1:8000/v1",
    f"http://{TOKEN}@127.0.0.1:8000/v1",
    f"http://:{TOKEN}@127.0.0.1:8000/v1",
    f"http://127.0.0.1:8000/v1?api_key={TOKEN}",
    f"http://127.0.0.1:8000/v1#{TOKEN}",
    "http://127.0.0.1:99999/v1",
    "http://127.0.0.1:port/v1",
]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("field", ["base_url", "metrics_url", "prometheus_url"])
def test_bad_urls_are_refused_at_registration_without_echoing_secrets(field: str, url: str) -> None:
    kwargs: dict[str, str | None] = {"base_url": "http://127.0.0.1:8000/v1", field: url}
    with pytest.raises(ValueError) as info:
        register_model("m", **kwargs)  # type: ignore[arg-type]
    assert TOKEN not in str(info.value) and TOKEN not in "".join(traceback.format_exception(info.value))
    assert get_model("m") is None


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_urls_are_refused_from_a_config_file(url: str, tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "models.toml"
    path.write_text(f'[models.m]\nbase_url = "{url}"\n')
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert TOKEN not in str(info.value)


@given(
    scheme=st.sampled_from(["http", "https"]),
    host=st.sampled_from(["127.0.0.1", "localhost", "vllm.internal", "[::1]", "gpu-7.example.com"]),
    port=st.one_of(st.none(), st.integers(1, 65535)),
    path=st.sampled_from(["", "/", "/v1", "/v1/", "/api/v1", "/openai/v1"]),
)
def test_derived_metrics_url_stays_on_the_base_urls_origin(scheme: str, host: str, port: int | None, path: str) -> None:
    netloc = host if port is None else f"{host}:{port}"
    base = f"{scheme}://{netloc}{path}"
    derived = urlsplit(metrics_url_from_base(base))
    parts = urlsplit(base)
    assert (derived.scheme, derived.hostname, derived.port) == (parts.scheme, parts.hostname, parts.port)
    assert derived.path == "/metrics" and not derived.query and derived.username is None
    spec = register_model("m", base_url=base)
    assert spec.resolved_metrics_url == metrics_url_from_base(base)


def test_explicit_metrics_url_is_used_as_given() -> None:
    spec = register_model("m", base_url="http://127.0.0.1:8000/v1", metrics_url="http://127.0.0.2:9100/metrics")
    assert spec.resolved_metrics_url == "http://127.0.0.2:9100/metrics"


# -- where the token goes -----------------------------------------------------------------------------------------
def auth_headers(server: FaultServer) -> list[str | None]:
    return [headers.get("Authorization") for _, headers in server.requests]


def test_token_is_sent_to_the_models_own_origin_only(clock: FakeClock) -> None:
    with fault_server(page(good_page())) as own, fault_server(page(good_page()), host="127.0.0.2") as other:
        spec = register_model("own", base_url=f"{own.url}/v1", served_model_name=LLAMA, api_key=TOKEN)
        ModelRuntime(spec, clock=clock).target()
        spec = register_model(
            "explicit-same-origin",
            base_url=f"{own.url}/v1",
            metrics_url=f"{own.url}/custom/metrics",
            served_model_name=LLAMA,
            api_key=TOKEN,
        )
        ModelRuntime(spec, clock=clock).target()
        assert auth_headers(own) == [f"Bearer {TOKEN}"] * 2
        spec = register_model(
            "explicit-other-host",
            base_url=f"{own.url}/v1",
            metrics_url=f"{other.url}/metrics",
            served_model_name=LLAMA,
            api_key=TOKEN,
        )
        controller = ModelRuntime(spec, clock=clock)
        controller.target()
        assert controller.core.last_ok is True
        assert auth_headers(other) == [None]


def test_redirect_to_another_host_is_not_followed_and_gets_no_token(clock: FakeClock) -> None:
    with fault_server(page(good_page()), host="127.0.0.2") as other, fault_server() as own:
        for status in (301, 302, 303, 307, 308):
            own.respond(redirect(f"{other.url}/metrics", status=status))
            spec = register_model("m", base_url=f"{own.url}/v1", served_model_name=LLAMA, api_key=TOKEN)
            controller = ModelRuntime(spec, clock=clock)
            controller.target()
            assert controller.core.last_ok is False and "another origin" in str(controller.core.last_error)
        assert other.requests == []
        assert set(auth_headers(own)) == {f"Bearer {TOKEN}"}  # the model's own origin did get it


def test_prometheus_server_never_gets_the_token(clock: FakeClock) -> None:
    with fault_server(page('{"status": "error", "error": "nope"}')) as prom, fault_server() as own:
        spec = register_model(
            "m", base_url=f"{own.url}/v1", prometheus_url=prom.url, served_model_name=LLAMA, api_key=TOKEN
        )
        ModelRuntime(spec, clock=clock).target()
        assert prom.requests and auth_headers(prom) == [None] * len(prom.requests)
        assert own.requests == []


# -- the token never comes back out ---------------------------------------------------------------------------------
@pytest.fixture
def everything_logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):  # the root logger: ours, httpx's and httpcore's records
        yield caplog


def all_text(caplog: pytest.LogCaptureFixture) -> str:
    parts = []
    for record in caplog.records:
        parts.append(record.getMessage())
        parts.append(repr(record.args))
        if record.exc_info and record.exc_info[1] is not None:
            parts.append("".join(traceback.format_exception(record.exc_info[1])))
    return "\n".join(parts)


SCENARIOS = {
    "200": page(good_page()),
    "401": page(b"unauthorized", status=401),
    "500": page(b"boom", status=500),
    "redirect-same-origin": redirect("/elsewhere/metrics"),
    "garbage": page(b"\x00\xff" * 100),
}


@pytest.mark.parametrize("answer", list(SCENARIOS))
def test_planted_token_appears_nowhere(
    answer: str, everything_logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_CONCURRENCY_POLL_S", "0")
    outputs: list[str] = []
    with fault_server(SCENARIOS[answer]) as server:
        spec = register_model("m", base_url=f"{server.url}/v1", served_model_name=LLAMA, api_key=TOKEN)
        for _ in range(2):
            outputs.append(str(bounded(lambda: resolve_capacity("m"))))
            outputs.append(str(bounded(lambda: asyncio.run(aresolve_capacity("m")))))
        controller = controller_for("m")
        assert controller is not None and controller.source is not None
        outputs += [repr(spec), str(spec), repr(controller), repr(controller.source), repr(controller.core)]
        outputs += [str(get_utilization("m")), str(get_all_utilization()), str(controller.core.last_error)]
        # The exception a direct read raises, with its traceback.
        try:
            controller.source.read()
        except Exception as exc:
            outputs.append("".join(traceback.format_exception(exc)))
        try:
            asyncio.run(controller.source.aread())
        except Exception as exc:
            outputs.append("".join(traceback.format_exception(exc)))
        assert all(h.get("Authorization") == f"Bearer {TOKEN}" for _, h in server.requests)  # it was used
    text = "\n".join(outputs) + all_text(everything_logged)
    assert TOKEN not in text
    if answer != "200":
        assert "metrics poll failed" in text  # the failures were really captured


def test_token_from_a_config_file_env_var_appears_nowhere(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, everything_logged: pytest.LogCaptureFixture
) -> None:
    from pathlib import Path

    monkeypatch.setenv("MY_VLLM_KEY", TOKEN)
    with fault_server(page(b"no", status=401)) as server:
        path = Path(str(tmp_path)) / "models.toml"
        path.write_text(f'[models.m]\nbase_url = "{server.url}/v1"\napi_key_env = "MY_VLLM_KEY"\n')
        monkeypatch.setenv("MODEL_CONCURRENCY_CONFIG", str(path))
        assert resolve_capacity("m") == 1
        spec = get_model("m")
        assert spec is not None and spec.api_key == TOKEN
        text = "\n".join([repr(spec), str(get_all_utilization()), repr(controller_for("m"))])
        assert auth_headers(server) == [f"Bearer {TOKEN}"]
    assert TOKEN not in text + all_text(everything_logged)


@pytest.mark.parametrize("suffix", ["\n"])
def test_token_with_a_trailing_newline_appears_nowhere(
    suffix: str, everything_logged: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    with fault_server(page(good_page())) as server:
        spec = register_model("m", base_url=f"{server.url}/v1", served_model_name=LLAMA, api_key=TOKEN + suffix)
        controller = ModelRuntime(spec, clock=clock)
        controller.target()
        text = str(controller.core.last_error) + all_text(everything_logged)
        try:
            fetch_text(f"{server.url}/metrics", api_key=TOKEN + suffix, token_origin=controller.source.token_origin)  # type: ignore[union-attr]
        except ScrapeError as exc:
            text += str(exc)
    assert TOKEN not in text


CLI = "import sys; from model_concurrency.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("answer", ["200", "401", "500"])
def test_watch_once_output_has_no_token(answer: str, tmp_path: object) -> None:
    """The real command in a subprocess, verbose, its token from the environment: stdout and stderr are clean."""
    from pathlib import Path

    from model_concurrency.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    if "watch" not in (commands or {}):
        pytest.skip("model-concurrency watch does not exist in this tree")
    with fault_server(SCENARIOS[answer]) as server:
        path = Path(str(tmp_path)) / "models.toml"
        path.write_text(
            f'[models.m]\nbase_url = "{server.url}/v1"\nserved_model_name = "{LLAMA}"\napi_key_env = "MY_VLLM_KEY"\n'
        )
        env = {**os.environ, "MY_VLLM_KEY": TOKEN, "MODEL_CONCURRENCY_POLL_S": "0", "COLUMNS": "200"}
        done = subprocess.run(
            [sys.executable, "-c", CLI, "-v", "watch", "--once", "--config", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert auth_headers(server) and set(auth_headers(server)) == {f"Bearer {TOKEN}"}  # the token was used
    assert done.returncode == 0, done.stderr
    assert "m" in done.stdout and ("ok" in done.stdout if answer == "200" else "failed" in done.stdout)
    assert TOKEN not in done.stdout + done.stderr


def test_scrape_limits_repr_and_spec_equality_do_not_need_the_token() -> None:
    spec = register_model("m", base_url="http://127.0.0.1:8000/v1", api_key=TOKEN)
    assert TOKEN not in repr(spec) and TOKEN not in repr(ScrapeLimits())
    assert "api_key" not in repr(spec)
