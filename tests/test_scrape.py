"""The guarded fetch against real hostile servers on 127.0.0.1: caps, deadlines, redirects, compression."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest

from model_concurrency.signals.scrape import ScrapeError, ScrapeLimits, afetch_text, fetch_text
from servers import Behaviour, metrics_server

FAST = ScrapeLimits(timeout_s=0.5, deadline_s=1.0, max_bytes=64 * 1024)


def both(url: str, limits: ScrapeLimits = FAST, **kwargs: object) -> list[str | ScrapeError]:
    """Run the sync and async fetch; return each one's text or error."""
    out: list[str | ScrapeError] = []
    try:
        out.append(fetch_text(url, limits=limits, **kwargs))  # type: ignore[arg-type]
    except ScrapeError as exc:
        out.append(exc)
    try:
        out.append(asyncio.run(afetch_text(url, limits=limits, **kwargs)))  # type: ignore[arg-type]
    except ScrapeError as exc:
        out.append(exc)
    return out


def errors(results: list[str | ScrapeError], match: str) -> None:
    for r in results:
        assert isinstance(r, ScrapeError), r
        assert match in str(r), str(r)


def test_plain_body() -> None:
    with metrics_server(Behaviour(body=b"hello")) as s:
        assert both(f"{s.url}/metrics") == ["hello", "hello"]


def test_body_over_cap() -> None:
    with metrics_server(Behaviour(body=b"x" * (FAST.max_bytes + 1))) as s:
        errors(both(f"{s.url}/metrics"), "larger than")


def test_gzip_bomb_stops_at_cap() -> None:
    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024), compresslevel=9)  # 50 MiB of zeros in ~50 KiB
    with metrics_server(Behaviour(body=bomb, headers={"Content-Encoding": "gzip"})) as s:
        errors(both(f"{s.url}/metrics"), "larger than")


def test_corrupt_gzip() -> None:
    with metrics_server(Behaviour(body=b"\x1f\x8bnot really gzip", headers={"Content-Encoding": "gzip"})) as s:
        errors(both(f"{s.url}/metrics"), "corrupt")


def test_deflate_body() -> None:
    with metrics_server(Behaviour(body=zlib.compress(b"ok"), headers={"Content-Encoding": "deflate"})) as s:
        assert both(f"{s.url}/metrics") == ["ok", "ok"]


def test_unknown_encoding() -> None:
    with metrics_server(Behaviour(body=b"x", headers={"Content-Encoding": "br"})) as s:
        errors(both(f"{s.url}/metrics"), "content-encoding")


def test_trickling_server_hits_the_deadline() -> None:
    with metrics_server(Behaviour(body=b"y" * 200, trickle_bytes_per_s=20)) as s:
        errors(both(f"{s.url}/metrics", ScrapeLimits(timeout_s=0.5, deadline_s=0.6)), "deadline")


def test_server_that_never_answers_times_out() -> None:
    with metrics_server(Behaviour(hang=True)) as s:
        for r in both(f"{s.url}/metrics", ScrapeLimits(timeout_s=0.3, deadline_s=0.6)):
            assert isinstance(r, ScrapeError)


def test_connection_refused() -> None:
    with metrics_server() as s:
        url = f"{s.url}/metrics"
    errors(both(url), "ConnectError")


@pytest.mark.parametrize("status", [401, 404, 500])
def test_http_errors(status: int) -> None:
    with metrics_server(Behaviour(body=b"no", status=status)) as s:
        errors(both(f"{s.url}/metrics"), f"HTTP {status}")


def test_redirect_to_another_origin_is_not_followed() -> None:
    with metrics_server(Behaviour(body=b"secret")) as other, metrics_server() as s:
        s.behaviour = Behaviour(status=302, headers={"Location": f"{other.url}/metrics"})
        errors(both(f"{s.url}/metrics", api_key="tok", token_origin=("http", "127.0.0.1", 1)), "another origin")
        assert other.requests == []


def test_same_origin_redirect_is_followed_with_token() -> None:
    with metrics_server() as s:
        host, port = s.server.server_address[:2]
        origin = ("http", str(host), int(port))
        s.behaviour = Behaviour(status=307, headers={"Location": "/metrics"})
        results = both(f"{s.url}/old", api_key="tok", token_origin=origin)
        errors(results, "redirect")  # loops on itself: bounded by the redirect limit
        assert len(s.requests) == 2 * 4
        assert all(headers.get("Authorization") == "Bearer tok" for _, headers in s.requests)


def test_tls_handshake_failure() -> None:
    # An https URL pointed at a plain-HTTP server fails the handshake: a ScrapeError, not an SSL exception.
    with metrics_server(Behaviour(body=b"x")) as s:
        url = s.url.replace("http://", "https://") + "/metrics"
        for r in both(url):
            assert isinstance(r, ScrapeError)
