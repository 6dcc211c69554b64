"""Every link into the glossary (docs/glossary.md) from the notebooks and docs/ lands on a term it defines.

A term's anchor is its heading as GitHub and the site's MyST build slug it (lower case, punctuation dropped,
spaces to hyphens). A link from a word to the glossary must name its term (``glossary.md#warp``): a reader who
follows a word should land on that word's definition, not at the top of the page (only a link whose text is the
glossary itself may point at the page).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs" / "glossary.md"
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*glossary\.md)(#[^)\s]*)?\)")
SOURCES = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(p for p in (ROOT / "docs").glob("*.md") if p != GLOSSARY)


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors() -> set[str]:
    return {slug(line[3:]) for line in GLOSSARY.read_text().splitlines() if line.startswith("## ")}


def links(path: Path) -> list[tuple[str, str | None]]:
    if path.suffix == ".ipynb":
        text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    else:
        text = path.read_text()
    return [(m.group(0), m.group(3)) for m in LINK.finditer(text) if "glossary" not in m.group(1).lower()]


def test_slugs_follow_the_heading_rule():
    assert slug("Little's law") == "littles-law" and slug("L2 cache") == "l2-cache" and slug("ulp") == "ulp"
    assert {"warp", "l2-cache", "cuda-graph", "kv-cache", "gqa", "fma"} <= anchors()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_every_glossary_link_names_a_term_the_glossary_defines(path):
    known = anchors()
    bad = [link for link, anchor in links(path) if anchor is None or anchor[1:] not in known]
    assert not bad, f"glossary links without a term or with an unknown one: {bad}"
