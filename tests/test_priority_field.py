"""Our calls carry vLLM's ``priority`` when the model is configured with one (ModelSpec.priority), and the
emulator reads it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from model_concurrency import config
from model_concurrency.emulator.app import _priority
from model_concurrency.emulator.openai_shapes import ApiError
from model_concurrency.integrations.httpx import with_priority


@pytest.fixture
def batch_model() -> Iterator[None]:
    config.register_model("batch", base_url="http://127.0.0.1:9/v1", priority=10)
    config.register_model("plain", base_url="http://127.0.0.1:9/v1")
    yield
    config.unregister_all()


def _call(path: str, body: dict[str, object]) -> httpx.Request:
    return httpx.Request("POST", f"http://127.0.0.1:9/v1{path}", json=body)


@pytest.mark.usefixtures("batch_model")
def test_the_configured_priority_is_added_to_completion_calls() -> None:
    for path in ("/chat/completions", "/completions"):
        sent = with_priority("batch", _call(path, {"model": "batch", "messages": []}))
        assert json.loads(sent.content)["priority"] == 10
        assert sent.headers["content-length"] == str(len(sent.content))


@pytest.mark.usefixtures("batch_model")
def test_a_call_keeps_its_own_priority_and_others_are_untouched() -> None:
    own = _call("/chat/completions", {"model": "batch", "priority": 3})
    assert with_priority("batch", own) is own
    plain = _call("/chat/completions", {"model": "plain"})
    assert with_priority("plain", plain) is plain
    embed = _call("/embeddings", {"model": "batch", "input": "x"})
    assert with_priority("batch", embed) is embed


def test_a_bad_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="priority"):
        config.register_model("bad", base_url="http://127.0.0.1:9/v1", priority="high")  # type: ignore[arg-type]
    assert _priority({"priority": 7}) == 7 and _priority({}) == 0
    with pytest.raises(ApiError):
        _priority({"priority": "7"})
