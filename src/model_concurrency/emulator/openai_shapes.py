"""The OpenAI-compatible request parsing and response shapes the emulator serves, with no engine in sight.

Prompt tokens are counted by a :data:`~.tokens.TokenCounter` (four characters per token unless configured, see
:mod:`.tokens`): what matters to the engine model is the size of each request, and to a benchmark client that its
count agrees with the server's. Output lengths follow vLLM's sampling parameters (``max_tokens``, ``min_tokens``,
``ignore_eos``) around a deterministic "natural" answer length of 8-64 tokens derived from the prompt.
Embeddings are deterministic unit vectors derived from a hash of the input, so a client can check that the
result it got back belongs to the item it sent (results in order) without any model weights.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from model_concurrency.emulator.tokens import TokenCounter, count_chars4

__all__ = [
    "DEFAULT_DIM",
    "ApiError",
    "Completion",
    "chat_prompt_tokens",
    "count_tokens",
    "embedding_inputs",
    "embedding_vector",
    "encode_vector",
    "error_body",
    "parse_completion",
]

DEFAULT_DIM = 16
MAX_DIM = 4096
_WORDS = ("the", "engine", "batch", "token", "queue", "model", "step", "cache", "block", "serve", "fast", "load")


class ApiError(Exception):
    """An error the client should see as OpenAI-style JSON with this HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "BadRequestError",
        param: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.retry_after_s = retry_after_s  # wall seconds, for a 429's Retry-After
        self.headers = headers  # extra response headers (a rejection style's: emulator/rejections.py)

    def __reduce__(self) -> Any:  # crosses the engine-process boundary by pickle
        return (_rebuild_error, (self.status, self.message, self.kind, self.param, self.retry_after_s, self.headers))


def _rebuild_error(
    status: int,
    message: str,
    kind: str,
    param: str | None,
    retry_after_s: float | None,
    headers: dict[str, str] | None = None,
) -> ApiError:
    return ApiError(status, message, kind=kind, param=param, retry_after_s=retry_after_s, headers=headers)


def error_body(err: ApiError) -> dict[str, Any]:
    """vLLM's error shape (``{"error": {...}}``, which the ``openai`` client reads into its exceptions)."""
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.status}}


def count_tokens(text: str) -> int:
    """About four characters per token, at least one (the default counter)."""
    return count_chars4(text)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def embedding_inputs(body: Mapping[str, Any], count: TokenCounter = count_chars4) -> list[tuple[int, bytes]]:
    """``input`` as (token count, hash key) per item: a string, strings, token ids, or lists of token ids."""
    raw = body.get("input")
    if isinstance(raw, str) and raw:
        items: Sequence[Any] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        items = [raw]  # one prompt given as token ids
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise ApiError(400, "'input' must be a non-empty string, list of strings or list of token ids", param="input")
    out: list[tuple[int, bytes]] = []
    for item in items:
        if isinstance(item, str) and item:
            out.append((count(item), item.encode("utf-8")))
        elif isinstance(item, list) and item and all(isinstance(x, int) and not isinstance(x, bool) for x in item):
            out.append((len(item), ",".join(map(str, item)).encode("ascii")))
        else:
            raise ApiError(400, "every input must be a non-empty string or list of token ids", param="input")
    return out


def embedding_dim(body: Mapping[str, Any]) -> int:
    dim = body.get("dimensions", DEFAULT_DIM)
    if dim is None:
        return DEFAULT_DIM
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise ApiError(400, f"'dimensions' must be an integer in [1, {MAX_DIM}]", param="dimensions")
    return dim


def embedding_vector(key: bytes, dim: int) -> list[float]:
    """A unit vector that depends only on the input: equal inputs, equal vectors."""
    values: list[float] = []
    counter = 0
    while len(values) < dim:
        digest = hashlib.blake2b(key, digest_size=64, person=counter.to_bytes(8, "little")).digest()
        for (word,) in struct.iter_unpack("<I", digest):
            values.append(word / 2**31 - 1.0)
        counter += 1
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """``float`` as a JSON list, ``base64`` as little-endian float32 (the ``openai`` client asks for base64)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def chat_prompt_tokens(body: Mapping[str, Any], count: TokenCounter = count_chars4) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    total = 0
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(400, "every message needs a 'role'", param="messages")
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts: count the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError(400, "message content must be a string or a list of parts", param="messages")
        total += count(content) + 4  # role and separators, as chat templates add
    return total


@dataclass(frozen=True, slots=True)
class Completion:
    """What a generation request asks for: sizes, and the deterministic answer the emulator will give."""

    prompt_tokens: int
    output_tokens: int
    finish_reason: str  # "stop" or "length"
    seed: bytes
    max_tokens: int | None = None  # as requested: what a tokens-per-minute limit charges, as hosted APIs do

    @property
    def budget_tokens(self) -> int:
        """Tokens a rate limit charges at admission: the prompt plus ``max_tokens`` (or the answer, if unset)."""
        return self.prompt_tokens + (self.max_tokens if self.max_tokens is not None else self.output_tokens)

    def words(self) -> list[str]:
        """One plain word per output token (so a word-level tokenizer counts exactly ``output_tokens``)."""
        digest = hashlib.blake2b(self.seed, digest_size=32).digest()
        return [_WORDS[(digest[i % len(digest)] + i // len(digest)) % len(_WORDS)] for i in range(self.output_tokens)]

    @property
    def text(self) -> str:
        return " ".join(self.words())


def _optional_int(body: Mapping[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"'{key}' must be an integer >= {minimum}", param=key)
    return value


def parse_completion(
    body: Mapping[str, Any], prompt_tokens: int, seed: bytes, *, max_model_len: int = 8192
) -> Completion:
    """The output length vLLM would produce, given a model whose end-of-sequence token comes after a natural
    8-64 tokens (derived from the prompt, so the same prompt gives the same answer).

    As in vLLM: ``ignore_eos`` ignores that end; ``min_tokens`` suppresses it before ``min_tokens``;
    ``max_tokens`` (or ``max_completion_tokens``) stops at that many with ``finish_reason="length"``, and defaults
    to what is left of ``max_model_len`` after the prompt. An end that falls exactly on the last allowed token is
    still a "stop".
    """
    limit = _optional_int(body, "max_completion_tokens", 1)
    if limit is None:
        limit = _optional_int(body, "max_tokens", 1)
    minimum = _optional_int(body, "min_tokens", 0) or 0
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, "'ignore_eos' must be a boolean", param="ignore_eos")
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(400, "the emulator serves n=1 only", param="n")
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ApiError(
            400,
            f"the prompt ({prompt_tokens} tokens) leaves no room for output in max_model_len {max_model_len}",
            param="messages",
        )
    requested = limit
    if limit is None:
        limit = room
    elif limit > room:
        raise ApiError(
            400,
            f"max_tokens {limit} + prompt {prompt_tokens} tokens exceeds max_model_len {max_model_len}",
            param="max_tokens",
        )
    if minimum > limit:
        raise ApiError(400, f"min_tokens ({minimum}) must be <= max_tokens ({limit})", param="min_tokens")
    if ignore_eos:
        return Completion(prompt_tokens, limit, "length", seed, requested)
    natural = max(8 + hashlib.blake2b(seed, digest_size=1).digest()[0] % 57, minimum)
    if natural > limit:
        return Completion(prompt_tokens, limit, "length", seed, requested)
    return Completion(prompt_tokens, natural, "stop", seed, requested)


def prompt_text(body: Mapping[str, Any], count: TokenCounter = count_chars4) -> tuple[int, bytes]:
    """``prompt`` of /v1/completions: a string or token ids (one prompt only)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return count(prompt), prompt.encode("utf-8")
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        return len(prompt), ",".join(map(str, prompt)).encode("ascii")
    raise ApiError(400, "'prompt' must be a non-empty string or list of token ids (one prompt)", param="prompt")
