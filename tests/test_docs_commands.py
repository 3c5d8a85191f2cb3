"""Each figure sits beside the command that reproduces it: README.md and docs/*.md, section by section.

A section is a heading (any level) and the lines up to the next heading; what precedes the first heading is a
section too. A section that holds a measured table or an image must also hold a command: a line of a code block
(fenced, or indented four spaces after a blank line) or an inline code span that starts with ``model-concurrency``,
``python``, ``make``, ``.venv/bin/`` or ``pytest``, after any ``VAR=value`` assignments, ``$`` prompt and the
wrappers ``nice``, ``time``, ``/usr/bin/time [-f "..."]`` and ``timeout N``.

A table is measured when a header cell names a measured figure (:data:`MEASURED`: goodput, throughput, a
percentile, Jain, makespan, TTFT/ITL/TPOT, latency, error, wall or CPU time, memory, a rate per second or per hour,
×, ÷, %, a ratio, what was throttled or scraped) and at least one body cell starts with a number. Tables of
parameters, options, keys, knobs or rules (``key | type | default | meaning``, the presets' constants) name no
measured figure and are not held to it. docs/results.md is generated with its commands (test_docs_figures.py) and
docs/policies.md is checked by its own tests; both are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED = {"results.md", "policies.md"}
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in EXCLUDED)]

HEADING = re.compile(r"^#{1,6} ")
FENCE = re.compile(r"^\s*(```|~~~)")
MEASURED = re.compile(
    r"goodput|throughput|\bp\d{1,2}\b|jain|makespan|\bttft\b|\bitl\b|\btpot\b|latency|error|\bwall\b|\bcpu\b|memory"
    r"|/s\b|/hour\b|×|÷|%|ratio|throttled|scrapes|bytes",
    re.IGNORECASE,
)
NUMBER = re.compile(r"^[~≈<>≤≥±+\-−]?\s*\d")
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)|<img\b", re.IGNORECASE)
WRAPPERS = re.compile(
    r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+|nice\s+|time\s+|/usr/bin/time\s+(?:-f\s+(?:\"[^\"]*\"|\S+)\s+)?"
    r"|timeout\s+\S+\s+)*"
)
COMMAND = re.compile(r"(?:model-concurrency|python\d?(?:\.\d+)?|make|pytest)\b|\.venv/bin/")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def is_command(text: str) -> bool:
    return COMMAND.match(WRAPPERS.sub("", text.strip(), count=1)) is not None


def sections(text: str) -> list[tuple[int, str, list[tuple[str, bool]]]]:
    """(line, heading, [(line text, in a code block)]) per section; headings inside code blocks do not count."""
    found: list[tuple[int, str, list[tuple[str, bool]]]] = [(1, "(before the first heading)", [])]
    fenced = indented = False
    previous = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            found[-1][2].append((line, True))
        elif not fenced and HEADING.match(line):
            found.append((number, line.strip(), []))
        else:
            # An indented block opens after a blank line and runs while its lines stay indented (or blank).
            if line.strip():
                indented = line.startswith("    ") and (indented or not previous.strip())
            found[-1][2].append((line, fenced or indented))
        previous = line
    return found


def tables(lines: list[tuple[str, bool]]) -> list[list[list[str]]]:
    """The markdown tables of a section (outside code blocks), each as rows of cells, header first."""
    out: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line, code in [*lines, ("", False)]:
        if not code and line.lstrip().startswith("|"):
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            if len(current) >= 2 and all(re.fullmatch(r":?-{3,}:?", c) for c in current[1] if c):
                out.append(current)
            current = []
    return out


def is_measured(table: list[list[str]]) -> bool:
    header, body = table[0], table[2:]
    return any(MEASURED.search(cell) for cell in header) and any(NUMBER.match(cell) for row in body for cell in row)


def has_command(lines: list[tuple[str, bool]]) -> bool:
    for line, code in lines:
        if code and is_command(line):
            return True
        if not code and any(is_command(span) for span in INLINE.findall(line)):
            return True
    return False


def missing(page: Path) -> list[str]:
    """``line heading`` of each section of ``page`` with a measured table or an image and no command."""
    out = []
    for number, heading, lines in sections(page.read_text(encoding="utf-8")):
        image = any(IMAGE.search(line) for line, code in lines if not code)
        if (image or any(is_measured(t) for t in tables(lines))) and not has_command(lines):
            out.append(f"{number} {heading}")
    return out


def test_every_figure_has_its_command_beside_it() -> None:
    assert len(PAGES) > 5
    gaps = [f"{page.relative_to(ROOT).as_posix()}:{gap}" for page in PAGES for gap in missing(page)]
    assert not gaps, "sections with figures but no command to reproduce them:\n" + "\n".join(gaps)


def test_the_rule_sees_measured_tables_and_images(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n| `seed` | int | 0 | the seed |\n\n"
        "## Measured\n\n| scenario | goodput ÷ oracle |\n| --- | ---: |\n| ramp | 0.97 |\n\n"
        "## Measured, with its command\n\n```\nmodel-concurrency compare ramp\n```\n\n| run | p99 s |\n|---|---|\n"
        "| a | 1.2 |\n\n## Indented\n\n    MODEL_CONCURRENCY_POLL_JITTER=0 .venv/bin/python scripts/x.py\n\n"
        "| run | wall |\n| --- | --- |\n| a | 3 s |\n\n## Inline\n\nRun `make results`.\n\n![plot](a.png)\n\n"
        "## Image alone\n\n![plot](b.png)\n\n## Words only\n\n| run | Jain |\n| --- | --- |\n| a | high |\n",
        encoding="utf-8",
    )
    assert [gap.split(" ", 1)[1] for gap in missing(page)] == ["## Measured", "## Image alone"]


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("model-concurrency sim sims/ramp.toml", True),
        ("MODEL_CONCURRENCY_POLL_JITTER=0 .venv/bin/python scripts/fleet_figures.py jitter multi-client", True),
        ('/usr/bin/time -f "%e s wall" model-concurrency sim sims/fleet-1000.toml', True),
        ("nice .venv/bin/python benchmarks/guidellm_check.py", True),
        ("$ make results", True),
        ("pip install model-concurrency", False),
        ("sims/ramp.toml", False),
        ("makespan", False),
    ],
)
def test_what_counts_as_a_command(text: str, command: bool) -> None:
    assert is_command(text) is command
