"""The docs stay readable: README.md plus docs/*.md at most 35,000 words, no page over 6,000.

A page that grows past the limit is a page that repeats another or tells how a figure was found (that goes in
CHANGELOG.md and the commit messages); words are counted as ``wc -w`` counts them.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _words(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").split())


def test_no_page_is_over_6000_words() -> None:
    over = {path.relative_to(ROOT).as_posix(): _words(path) for path in PAGES if _words(path) > 6000}
    assert over == {}


def test_the_docs_and_readme_are_at_most_35000_words() -> None:
    assert len(PAGES) > 5
    assert sum(_words(path) for path in PAGES) <= 35000
