"""Fetch a ``/metrics`` page over HTTP without trusting the server.

A metrics endpoint is a dependency of every fan-out, so a broken or hostile one must cost a caller at most one
timeout and a bounded amount of memory:

* ``timeout`` bounds connect and each read; ``deadline`` bounds the whole exchange, so a server that trickles
  one byte a second cannot outlast it (a read timeout alone would never fire);
* the body is read raw and capped at ``max_bytes``; a compressed body is inflated by us, incrementally, under
  the same cap, so a gzip bomb stops at the cap instead of at the end of memory;
* redirects are followed only within the same origin (at most three), so a misconfigured or compromised server
  cannot send the poll, or the bearer token, elsewhere;
* the bearer token is sent only when the metrics URL has the model's own origin.

Every failure is a :class:`ScrapeError` with a one-line reason; the controller logs it and counts a failed poll.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

__all__ = [
    "HttpStatusError",
    "ScrapeError",
    "ScrapeLimits",
    "afetch_text",
    "fetch_text",
    "metrics_url_from_base",
    "origin_of",
]

MAX_REDIRECTS = 3
# What a network, TLS or protocol failure can surface as; each becomes a failed poll with its reason.
_TRANSPORT_ERRORS = (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL, OSError, UnicodeError)


class ScrapeError(RuntimeError):
    """The metrics page could not be fetched within the limits; the poll counts as failed."""


class HttpStatusError(ScrapeError):
    """The endpoint answered with a status other than 200 (or a redirect): ``status`` says which, so a caller can
    tell an endpoint the server does not have (404) from one that failed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ScrapeLimits:
    timeout_s: float = 2.0
    deadline_s: float = 4.0
    max_bytes: int = 8 * 1024 * 1024


def _validated(url: str, what: str) -> httpx.URL:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{what} must be http or https, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError(f"{what} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{what} must not carry credentials in the URL; use api_key")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} must not have a query or fragment")
    try:
        _ = parts.port  # raises on a malformed port
    except ValueError as exc:
        raise ValueError(f"{what} has an invalid port: {exc}") from None
    return httpx.URL(url)


def metrics_url_from_base(base_url: str) -> str:
    """``http://h:8000/v1`` → ``http://h:8000/metrics``: vLLM serves metrics at the root of the API's origin."""
    _validated(base_url, "base_url")
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def check_metrics_url(url: str) -> str:
    """Validate an explicit ``metrics_url`` with the same rules as a derived one."""
    _validated(url, "metrics_url")
    return url


def origin_of(url: str | httpx.URL) -> tuple[str, str, int | None]:
    u = httpx.URL(str(url))
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return (u.scheme, u.host, port)


class _Body:
    """Accumulates a raw body, inflating gzip/deflate incrementally, under one byte cap and one deadline."""

    def __init__(self, encoding: str, limits: ScrapeLimits, deadline: float) -> None:
        self.limits = limits
        self.deadline = deadline
        self.parts: list[bytes] = []
        self.size = 0
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            self.inflater = None
        elif encoding in ("gzip", "x-gzip", "deflate"):
            self.inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # auto-detects gzip and zlib headers
        else:
            raise ScrapeError(f"unsupported content-encoding {encoding!r}")

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limits.max_bytes:
            raise ScrapeError(f"metrics body larger than {self.limits.max_bytes} bytes")
        self.parts.append(data)

    def feed(self, chunk: bytes) -> None:
        if time.monotonic() > self.deadline:
            raise ScrapeError(f"metrics fetch exceeded its {self.limits.deadline_s:g}s deadline")
        if self.inflater is None:
            self._keep(chunk)
            return
        try:
            data = self.inflater.decompress(chunk, self.limits.max_bytes + 1 - self.size)
            self._keep(data)
            while self.inflater.unconsumed_tail:
                data = self.inflater.decompress(self.inflater.unconsumed_tail, self.limits.max_bytes + 1 - self.size)
                if not data:
                    break
                self._keep(data)
        except zlib.error as exc:
            raise ScrapeError(f"corrupt compressed metrics body: {exc}") from None

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", errors="replace")


def _redacted(message: str, secret: str | None) -> str:
    """Some transport errors quote the request (h11 quotes an illegal header value): never pass a key on."""
    return message.replace(secret, "<redacted>") if secret else message


def _headers(
    url: httpx.URL, token_origin: tuple[str, str, int | None] | None, api_key: str | None, accept: str = "text/plain"
) -> dict[str, str]:
    headers = {"Accept": accept, "Accept-Encoding": "gzip, identity"}
    if api_key and token_origin is not None and origin_of(url) == token_origin:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _next_url(response: httpx.Response, url: httpx.URL) -> httpx.URL | None:
    if response.status_code in (301, 302, 303, 307, 308):
        location = response.headers.get("location")
        if not location:
            raise ScrapeError(f"HTTP {response.status_code} redirect without a Location")
        target = httpx.URL(urljoin(str(url), location))
        if origin_of(target) != origin_of(url):
            raise ScrapeError("metrics endpoint redirected to another origin; not followed")
        return target
    if response.status_code != 200:
        raise HttpStatusError(response.status_code, f"metrics endpoint answered HTTP {response.status_code}")
    return None


def fetch_text(
    url: str,
    *,
    api_key: str | None = None,
    token_origin: tuple[str, str, int | None] | None = None,
    limits: ScrapeLimits = ScrapeLimits(),
    accept: str = "text/plain",
) -> str:
    """Blocking fetch, for threads without a running event loop. Raises :class:`ScrapeError`.

    It runs :func:`afetch_text` on a private event loop rather than using httpx's sync client: only a loop can
    enforce the overall deadline while the server is still trickling its status line or headers (a sync read
    timeout restarts with every byte). The private loop is never installed as the thread's current loop, so a
    program that keeps its own loop in this thread is not disturbed.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(
            afetch_text(url, api_key=api_key, token_origin=token_origin, limits=limits, accept=accept)
        )
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def has_control_characters(value: str) -> bool:
    """HTTP forbids these in a header; an API key holding one is refused here and at registration alike."""
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value)


async def afetch_text(
    url: str,
    *,
    api_key: str | None = None,
    token_origin: tuple[str, str, int | None] | None = None,
    limits: ScrapeLimits = ScrapeLimits(),
    accept: str = "text/plain",
) -> str:
    """Non-blocking fetch for event loops: timeout per operation, one deadline over the whole exchange.

    ``accept``: the media type asked for (a JSON endpoint beside the page, SGLang's ``/v1/loads``, is read under
    the same caps)."""
    if api_key is not None and has_control_characters(api_key):
        # Refused before any HTTP library sees it: their protocol errors and debug logs quote header values.
        raise ScrapeError("api_key contains control characters; not sent")
    deadline = time.monotonic() + limits.deadline_s
    current = httpx.URL(url)

    async def run() -> str:
        nonlocal current
        async with httpx.AsyncClient(timeout=limits.timeout_s, follow_redirects=False, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                async with client.stream(
                    "GET", current, headers=_headers(current, token_origin, api_key, accept)
                ) as resp:
                    nxt = _next_url(resp, current)
                    if nxt is None:
                        body = _Body(resp.headers.get("content-encoding", ""), limits, deadline)
                        async for chunk in resp.aiter_raw():
                            body.feed(chunk)
                        return body.text()
                current = nxt
        raise ScrapeError("too many redirects")

    try:
        async with asyncio.timeout(limits.deadline_s):
            return await run()
    except ScrapeError:
        raise
    except TimeoutError:
        raise ScrapeError(f"metrics fetch exceeded its {limits.deadline_s:g}s deadline") from None
    except _TRANSPORT_ERRORS as exc:
        raise ScrapeError(_redacted(f"{type(exc).__name__}: {exc}".rstrip(": "), api_key)) from None
