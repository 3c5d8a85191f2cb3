"""How the emulator counts prompt tokens: deterministic, and selectable so a benchmark client can agree with it.

Why selectable: a benchmark client (guidellm, vLLM's ``benchmark_serving``) counts tokens with its own tokenizer
and compares its figures per token with the server's. The emulator has no model weights, so it offers:

* ``chars4`` (default): ``ceil(len(text) / 4)``, at least 1 (OpenAI's rule of thumb: about four characters per
  token). Cheap and stable; what the figures in docs/live.md use.
* ``words``: one token per match of ``\\w+|[^\\w\\s]+``, at least 1. This is exactly the split of the
  ``tokenizers`` library's ``Whitespace`` pre-tokenizer, so a client using a word-level tokenizer built with it
  (every word in its vocabulary, or an ``[UNK]`` token) counts the same number of tokens.
* a path to a ``tokenizer.json``: that tokenizer itself (needs the ``tokenizers`` package), without special tokens.

Generated text is made of plain words (one word per output token), so under ``words`` a client counting the
streamed text gets the ``completion_tokens`` the emulator reports.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TokenCounter", "make_counter"]

TokenCounter = Callable[[str], int]

_WORD = re.compile(r"\w+|[^\w\s]+")


def count_chars4(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def count_words(text: str) -> int:
    return max(1, sum(1 for _ in _WORD.finditer(text)))


def make_counter(name: str) -> TokenCounter:
    """``chars4``, ``words`` or a ``tokenizer.json`` path; a clear ``ValueError`` for anything else."""
    if name == "chars4":
        return count_chars4
    if name == "words":
        return count_words
    path = Path(name)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"tokenizer must be 'chars4', 'words' or a tokenizer.json path; {name!r} is none of them")
    try:
        tokenizers = importlib.import_module("tokenizers")  # optional: only this option needs it
    except ImportError:
        raise ValueError(f"tokenizer {name!r} needs the 'tokenizers' package (pip install tokenizers)") from None
    tokenizer: Any = tokenizers.Tokenizer.from_file(str(path))

    def count(text: str) -> int:
        return max(1, len(tokenizer.encode(text, add_special_tokens=False).ids))

    return count
