"""Quoting the tuning record in a notebook: the numbers a notebook's prose cites from ``docs/tuning.md`` are looked
up in the named section of the record before they are shown, so the prose cannot drift from the one place that keeps
the measurements."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["RECORD", "section", "show_quotes"]

RECORD = Path(__file__).resolve().parents[2] / "docs" / "tuning.md"


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def section(anchor: str, record: Path = RECORD) -> str:
    """The text of the record's ``## `` section whose anchor is ``anchor`` (e.g. ``"eviction-hints"``)."""
    if not Path(record).is_file():
        raise FileNotFoundError(f"no tuning record at {record}: it is docs/tuning.md of a clone of ropekit's repository "
                                "(an installed wheel ships the package only)")
    text = Path(record).read_text(encoding="utf-8")
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    sections = {_anchor(title): body for title, body in zip(parts[1::2], parts[2::2])}
    if anchor not in sections:
        raise KeyError(f"anchor: no section {anchor!r} in {Path(record).name}; it has {sorted(sections)}")
    return sections[anchor]


def show_quotes(quotes: Mapping[str, Sequence[str]], record: Path = RECORD) -> list[tuple[str, str]]:
    """Assert that every number in ``quotes`` ({section anchor: numbers as the record writes them}) appears in that
    section of the record, and display them as a table: section, numbers. Returns the rows."""
    rows = []
    for anchor, numbers in quotes.items():
        body = section(anchor, record)
        absent = [n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?!\.?\d)", body)]
        assert not absent, f"quotes: {absent} not in the tuning record's section {anchor!r}"
        rows.append((anchor, ", ".join(numbers)))
    try:
        from IPython.display import Markdown, display
    except ImportError:  # outside a notebook: the rows are the result
        return rows
    table = ["| tuning record section | numbers quoted above, found there |", "|---|---|"]
    table += [f"| [{anchor}](../docs/tuning.md#{anchor}) | {numbers} |" for anchor, numbers in rows]
    display(Markdown("\n".join(table)))
    return rows
