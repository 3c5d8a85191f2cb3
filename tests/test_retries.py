"""retries= (gate/retries.py): which failures are resent, how long between attempts, through map_concurrent and
map_concurrent_sync against a real loopback server."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from fault_servers import fault_server
from model_concurrency import gate_stats, map_concurrent, map_concurrent_sync
from model_concurrency.config import register_model
from model_concurrency.gate.retries import RetryPolicy, retry_policy


class Top:
    """A stand-in for random.Random whose draws are all 1.0: the backoff at the top of its jitter."""

    def random(self) -> float:
        return 1.0


def refusal(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://h/")
    return httpx.HTTPStatusError(
        "no", request=request, response=httpx.Response(status, headers=headers, request=request)
    )


def test_delays_exact() -> None:
    policy = RetryPolicy(3, rng=Top())  # type: ignore[arg-type]
    assert [policy.delay(refusal(503), a) for a in range(4)] == [0.25, 0.5, 1.0, None]
    assert policy.delay(refusal(429, {"retry-after": "7"}), 0) == 7.0  # the named delay when longer
    assert policy.delay(refusal(429, {"retry-after-ms": "100"}), 2) == 1.0  # the backoff when longer
    assert policy.delay(httpx.ConnectError("refused"), 0) == 0.25  # outage
    assert policy.delay(refusal(429, {"x-llm-d-request-dropped-reason": "evicted-x"}), 0) == 0.25
    assert policy.delay(refusal(429, {"x-should-retry": "false"}), 0) is None
    assert policy.delay(refusal(400), 0) is None
    assert policy.delay(refusal(500), 0) is None
    assert policy.delay(ValueError("a bug"), 0) is None
    assert policy.delay(None, 0) is None
    assert RetryPolicy(20, rng=Top()).delay(refusal(503), 19) == 30.0  # capped  # type: ignore[arg-type]
    assert retry_policy(0) is None
    own = RetryPolicy(2, base_s=0.01)
    assert retry_policy(own) is own and retry_policy(RetryPolicy(0)) is None
    for bad_count in (-1, True):
        with pytest.raises(ValueError, match="retries"):
            retry_policy(RetryPolicy(bad_count))
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="retries"):
            retry_policy(bad)  # type: ignore[arg-type]


def answers(statuses: list[int], headers: dict[str, str]) -> Callable[[BaseHTTPRequestHandler], None]:
    """Each request gets the next status of ``statuses`` (then 200 for ever)."""
    queue = itertools.chain(statuses, itertools.repeat(200))

    def respond(h: BaseHTTPRequestHandler) -> None:
        status = next(queue)
        h.send_response(status)
        for key, value in (headers if status != 200 else {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", "2")
        h.end_headers()
        h.wfile.write(b"ok")

    return respond


@pytest.mark.parametrize(
    ("statuses", "headers", "retries", "attempts", "ok"),
    [
        ([503, 503], {}, 2, 3, True),  # refused twice, then served
        ([503, 503, 503], {}, 2, 3, False),  # out of attempts: the last refusal stands
        ([429], {"retry-after-ms": "20"}, 1, 2, True),
        ([429], {"x-should-retry": "false"}, 3, 1, False),  # the server says no
        ([500], {}, 3, 1, False),  # an error, not a refusal: never resent
        ([503], {}, 0, 1, False),  # the default: no retries
        ([503, 503], {}, RetryPolicy(2, base_s=0.001), 3, True),  # the caller's own policy (its backoff, its rng)
        ([503], {}, RetryPolicy(0), 1, False),
    ],
)
def test_through_map_concurrent_and_threads(
    statuses: list[int], headers: dict[str, str], retries: int | RetryPolicy, attempts: int, ok: bool
) -> None:
    register_model("m", base_url=None, max_parallel_calls=1)
    for front in ("async", "threads"):
        with fault_server(answers(list(statuses), headers)) as server:
            if front == "async":

                async def main() -> list[object]:
                    async with httpx.AsyncClient(timeout=5) as client:

                        async def call(_: int) -> str:
                            response = await client.get(server.url)
                            response.raise_for_status()
                            return response.text

                        return await map_concurrent([0], call, model="m", retries=retries, return_exceptions=True)

                [result] = asyncio.run(main())
            else:

                def get(_: int) -> str:
                    response = httpx.get(server.url, timeout=5)
                    response.raise_for_status()
                    return response.text

                [result] = map_concurrent_sync([0], get, model="m", retries=retries, return_exceptions=True)
            assert (result == "ok") is ok, front
            assert len(server.requests) == attempts, front
    assert gate_stats("m").calls == 2 * attempts
