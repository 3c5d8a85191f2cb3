"""Every preset explains its parameters: each top-level ``key = value`` line carries a trailing ``#`` comment.

A preset is what users copy to tune a policy, so each knob says on its own line what it does. The keys every preset
has (``name``, ``policy``, ``description``) explain themselves. The presets must still load with their comments.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from model_concurrency.policies.registry import load_policy

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "policies").glob("*.toml"))
SELF_EXPLAINED = frozenset({"name", "policy", "description"})
KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)\s*=")


def parameter_lines(path: Path) -> list[tuple[int, str, str]]:
    """``(line number, key, line)`` for each top-level parameter assignment (tables end the top level)."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith("["):
            break
        match = KEY.match(line)
        if match and match.group(1) not in SELF_EXPLAINED:
            found.append((number, match.group(1), line))
    return found


def trailing_comment(line: str) -> str | None:
    """The text of the line's trailing comment: after the first ``#`` that is not inside the value."""
    for position, char in enumerate(line):
        if char != "#":
            continue
        try:
            tomllib.loads(line[:position])
        except tomllib.TOMLDecodeError:
            continue  # the "#" is inside a string value
        return line[position + 1 :].strip()
    return None


def test_the_presets_are_found() -> None:
    assert len(PRESETS) > 10
    assert any(parameter_lines(path) for path in PRESETS)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_parameter_key_has_a_trailing_comment(path: Path) -> None:
    bare = [f"{path.name}:{number}: {line}" for number, _, line in parameter_lines(path) if not trailing_comment(line)]
    assert not bare, "parameter keys without a trailing '# what it does' comment:\n" + "\n".join(bare)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_parameter_line_parses_to_its_key(path: Path) -> None:
    values = tomllib.loads(path.read_text())
    for _, key, _ in parameter_lines(path):
        assert key in values


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_commented_preset_still_loads(path: Path) -> None:
    policy = load_policy(path)
    assert callable(policy.next_target)


def test_trailing_comment_skips_a_hash_inside_a_string() -> None:
    assert trailing_comment('signal = "a#b"    # the signal') == "the signal"
    assert trailing_comment('signal = "a#b"') is None
    assert trailing_comment("step = 1.0") is None
