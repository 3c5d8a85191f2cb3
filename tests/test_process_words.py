"""The docs, code comments, presets and scripts describe the product as it is, not how it was built.

History has two homes: CHANGELOG.md and the commit messages. Anywhere else a numbered development step ("session
13", "issue 22's generator"), an experiment's verdict ("tried and not kept"), a commit id, a branch name or the day
some work was done leaves a reader unable to tell what holds now from what held once. This test scans every text
file a reader meets (docs/, README.md, src/, policies/, sims/, benchmarks/, scripts/, notebooks/, examples/) and
fails listing ``path:line: text`` for each such word. The tests (tests/*.py, this file aside, whose cases hold such
words on purpose) are scanned for numbered project issues: a test says what it checks and why, as it holds now.

Two kinds of pattern: ``ANYWHERE`` applies to every line of every scanned file (these forms are never product, even
inside a string); ``PROSE`` applies only to prose, that is Markdown, TOML, and the comments and triple-quoted strings
(docstrings) of Python files, because a hex word or a date inside code can be a cache key, a test vector or a model
name. A line of a generated report that says "generated on" keeps its date.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Patterns for every line. Each names a step of the work, which means nothing to a reader of the product.
ANYWHERE: list[tuple[str, re.Pattern[str]]] = [
    # A numbered development session: the reader has no session list; the fact belongs in the present tense.
    ("session number", re.compile(r"\bsessions? \d+", re.IGNORECASE)),
    # A numbered work item of this project ("issue 22", "issues 11-14", "issue #5"); upstream issues are cited by
    # their URL (github.com/vllm-project/vllm/issues/11320), which this does not match.
    ("issue number", re.compile(r"\bissues? #?\d+", re.IGNORECASE)),
    # "step 3 of the work": a development step, not a step of the engine or of a policy.
    ("development step", re.compile(r"\bstep \d+ of (?:the|our) (?:work|development)\b", re.IGNORECASE)),
    # An experiment's verdict. What was not kept is not in the product; its record is the changelog.
    ("tried, not kept", re.compile(r"\btried,? (?:and )?not kept\b", re.IGNORECASE)),
    ("tried ... not kept", re.compile(r"\btried\b[^.]{0,60}\bnot kept\b|\bnot kept\b[^.]{0,60}\btried\b", re.I)),
    # "commit abc1234": a commit id is a point in history; the product is whatever is checked out.
    ("commit id", re.compile(r"\bcommits? `?[0-9a-f]{7,40}\b", re.IGNORECASE)),
    # A branch by name ("branch `hosted`", "the `fuzz` branch", "on branch main"): branches come and go. A branch of
    # the code ("whichever branch runs") is product, so only a named or checked-out branch counts.
    ("branch name", re.compile(r"\bbranch `[\w./-]+`|`[\w./-]+` branch\b|\bon branch\b", re.IGNORECASE)),
    # Figures qualified by when they were taken rather than by what they measure.
    ("earlier figures", re.compile(r"\b(?:earlier|previous|old) figures\b", re.IGNORECASE)),
]

# The tests are held to this one: their data may hold dates, hex words or "session" in its product sense.
ISSUE_NUMBER = dict(ANYWHERE)["issue number"]

# A short hex word with a digit and a letter in it: the shape of an abbreviated commit id.
_HEX = r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"

# Patterns for prose only (Markdown, TOML, Python comments and docstrings).
PROSE: list[tuple[str, re.Pattern[str]]] = [
    # A commit id alone in backticks, or after "main"/"at"/"parent", or alone in parentheses: history, as above.
    ("commit id", re.compile(rf"(?<![\w`])`{_HEX}`(?!`)")),
    ("commit id", re.compile(rf"\b(?:main|master|parent|reverted in|at) {_HEX}\b")),
    ("commit id", re.compile(rf"\({_HEX}[,;)]")),
    # The day some work was done ("measured 2026-12-01"): true of the work, not of the product.
    ("date of work", re.compile(r"\b20\d\d-\d\d-\d\d\b")),
]

# Prose only in Markdown: words that in a code comment name part of the product.
DOCS_ONLY: list[tuple[str, re.Pattern[str]]] = [
    # "this session", "that session's": a session of the work, counted from the writer's day. (In code a session is
    # a Ray or HTTP session: "this session's to reset" is product.)
    ("this session", re.compile(r"\b(?:this|that|next|previous|last|an earlier|a later) session\b", re.IGNORECASE)),
    # A branch named by its role ("this branch", "the helpers' branches", "(embed branch)"): in a code comment,
    # "this branch" is a branch of the code.
    (
        "branch name",
        re.compile(
            r"\b(?:this|that|which|the same|a feature|their|the helpers') branch(?:es)?\b|\bbranches that built\b"
            r"|\b[a-z]+ branch\)",
            re.IGNORECASE,
        ),
    ),
]

# Lines that may keep a date: the header a report generator writes, and a cited source's line (its URL beside it),
# where the date is the source's publication, not a day of this project's work.
DATE_ALLOWED = re.compile(r"generated on|https?://|github\.com/", re.IGNORECASE)
# The header ``model-concurrency report`` writes on docs/results.md names the commit and the time of the run it was
# made from: the run's provenance, which the page must state, not a day or a step of the project's work.
REPORT_HEADER = re.compile(r"^Generated by `model-concurrency report ")
RUN_PROVENANCE = {"commit id", "date of work"}

SCANNED = ["docs", "README.md", "src", "policies", "sims", "benchmarks", "scripts", "notebooks", "examples"]
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".ico", ".pyc", ".so", ".gz", ".zip", ".parquet"}


def _files() -> list[Path]:
    """Every text file under the scanned roots, without following symlinks (bundled/ links back to policies/)."""
    found: list[Path] = []
    for name in SCANNED:
        root = ROOT / name
        if root.is_file():
            found.append(root)
            continue
        for directory, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
            for filename in sorted(filenames):
                path = Path(directory) / filename
                if path.is_symlink() or path.suffix.lower() in BINARY_SUFFIXES:
                    continue
                found.append(path)
    return found


def _python_prose_lines(text: str) -> set[int]:
    """The 1-based line numbers of a Python file that hold a comment or a triple-quoted string."""
    lines: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                lines.add(token.start[0])
            elif token.type == tokenize.STRING:
                body = token.string.lstrip("rRbBuUfF")
                if body.startswith(('"""', "'''")):
                    lines.update(range(token.start[0], token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        # Not parseable as a whole: treat every line as prose, which errs on the side of reporting.
        return set(range(1, text.count("\n") + 2))
    return lines


def _hits(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []  # binary
    if "\x00" in text:
        return []
    relative = path.relative_to(ROOT).as_posix()
    if path.suffix == ".py":
        prose_lines = _python_prose_lines(text)
    elif path.suffix in {".md", ".toml", ".txt", ""}:
        prose_lines = None  # every line is prose
    else:
        prose_lines = set()  # data (e.g. a CSV): the ANYWHERE forms only
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        names = [name for name, pattern in ANYWHERE if pattern.search(line)]
        if prose_lines is None or number in prose_lines:
            for name, pattern in PROSE:
                if name == "date of work" and DATE_ALLOWED.search(line):
                    continue
                if pattern.search(line):
                    names.append(name)
        if path.suffix == ".md":
            names.extend(name for name, pattern in DOCS_ONLY if pattern.search(line))
        if REPORT_HEADER.match(line):
            names = [name for name in names if name not in RUN_PROVENANCE]
        if names:
            found.append(f"{relative}:{number}: [{', '.join(dict.fromkeys(names))}] {line.strip()}")
    return found


def test_the_scan_sees_the_docs_and_the_sources() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in _files()}
    assert "README.md" in files
    assert "docs/README.md" in files
    assert "src/model_concurrency/controller.py" in files
    assert "CHANGELOG.md" not in files
    assert not any(name.startswith(("tests/", ".venv/")) for name in files)


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        ("Measured in session 13 on the generator.", True),
        ("Before issue 22 one item aborted the run (issue #5).", True),
        ("Tried and not kept: a faster ramp.", True),
        ("Tried, and not kept:", True),
        ("Before = the engine as of commit f0a1f58.", True),
        ("Measured on branch `hosted`.", True),
        ("One draw per poll whichever branch runs.", False),
        ("A session of the HTTP client is reused.", False),
        ("the runtime is this session's to reset", False),
        ("(vLLM 0.21.0, 2025-08)", False),
        ("github.com/vllm-project/vllm/issues/11320", False),
    ],
)
def test_the_patterns(line: str, flagged: bool) -> None:
    assert any(pattern.search(line) for _, pattern in ANYWHERE) is flagged


def _test_files() -> list[Path]:
    """The test modules and their helpers, this file aside."""
    return sorted(path for path in (ROOT / "tests").glob("*.py") if path.name != Path(__file__).name)


def _issue_hits(path: Path) -> list[str]:
    relative = path.relative_to(ROOT).as_posix()
    lines = enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
    return [f"{relative}:{number}: {line.strip()}" for number, line in lines if ISSUE_NUMBER.search(line)]


def test_the_test_scan_sees_the_tests_but_not_this_file() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in _test_files()}
    assert {"tests/conftest.py", "tests/test_knobs.py"} <= files
    assert "tests/test_process_words.py" not in files


def test_no_issue_numbers_in_the_tests() -> None:
    hits = [hit for path in _test_files() for hit in _issue_hits(path)]
    assert not hits, f"{len(hits)} project issue numbers in tests (history goes to CHANGELOG.md):\n" + "\n".join(hits)


def test_no_process_words_outside_the_changelog() -> None:
    hits = [hit for path in _files() for hit in _hits(path)]
    assert not hits, f"{len(hits)} process words (history goes to CHANGELOG.md):\n" + "\n".join(hits)
