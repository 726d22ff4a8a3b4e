"""The README's figures are docs/benchmarks.md's, and the docs' links land.

* Every figure of README.md's prose and tables (a number with a unit: ms, s, ×, GiB, MiB, GB,
  MB, %, tokens/s; code blocks aside) sits in a paragraph, table row or list item that links a
  section of docs/benchmarks.md, and appears in that section (with its subsections), so each
  claim on the front page is traceable to the bench that printed it.
* Every link from README.md or docs/*.md to a Markdown file of the repository names a file
  that exists and, with ``#anchor``, a heading it has (GitHub's anchors).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REPO

README = REPO / "README.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"

FIGURE = re.compile(
    r"(?<![\w.,–-])\d+(?:[.,]\d+)*(?:–\d+(?:[.,]\d+)*)?\s?(?:ms|s|×|GiB|MiB|GB|MB|%|tokens/s)(?!\w)"
)
"""A figure as the README writes one: 450 ms, 1.18–1.23 ms, 1,471 ms, 0.89 s, 1.97×."""
BENCH_LINK = re.compile(r"\]\(docs/benchmarks\.md#([^)\s]+)\)")
MD_LINK = re.compile(r"\]\(([^)\s:]+\.md)(?:#([^)\s]+))?\)")


def prose_units(text: str) -> list[str]:
    """The README's paragraphs, table rows and list items, without code (fenced blocks and
    indented ones)."""
    units: list[str] = []
    current: list[str] = []
    fenced = False

    def close() -> None:
        if current:
            units.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            close()
            continue
        if fenced or line.startswith(("    ", "\t")) or not line.strip():
            close()
            continue
        if line.startswith(("|", "* ", "- ")):
            close()
        current.append(line.strip())
        if line.startswith("|"):
            close()
    close()
    return units


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def sections(path: Path) -> dict[str, str]:
    """Each heading's anchor → its text up to the next heading of its level or above."""
    lines = path.read_text().splitlines()
    heads: list[tuple[int, int, str]] = []
    fenced = False
    seen: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^(#{1,6}) (.*)$", line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            heads.append((i, len(m.group(1)), base if n == 0 else f"{base}-{n}"))
    out: dict[str, str] = {}
    for k, (start, level, anchor) in enumerate(heads):
        end = next((s for s, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out[anchor] = "\n".join(lines[start:end])
    return out


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_every_readme_figure_is_in_the_benchmarks_section_it_links() -> None:
    bench = sections(BENCHMARKS)
    checked = 0
    problems: list[str] = []
    for unit in prose_units(README.read_text()):
        figures = FIGURE.findall(unit)
        if not figures:
            continue
        anchors = BENCH_LINK.findall(unit)
        if not anchors:
            problems.append(f"no docs/benchmarks.md section linked beside {figures}: {unit[:120]}")
            continue
        missing = [a for a in anchors if a not in bench]
        if missing:
            problems.append(f"docs/benchmarks.md has no section #{missing[0]}")
            continue
        where = squeezed("\n".join(bench[a] for a in anchors))
        for figure in figures:
            checked += 1
            if squeezed(figure) not in where:
                problems.append(f"{figure!r} is not in docs/benchmarks.md#{', #'.join(anchors)}")
    assert problems == []
    assert checked >= 10  # the table's figures were found, not skipped


@pytest.mark.parametrize(
    "doc",
    [README, *sorted((REPO / "docs").glob("*.md"))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_every_link_to_a_markdown_file_lands(doc: Path) -> None:
    problems: list[str] = []
    for m in MD_LINK.finditer(doc.read_text()):
        target = (doc.parent / m.group(1)).resolve()
        if not target.is_file():
            problems.append(f"{m.group(0)}: no such file")
        elif m.group(2) and m.group(2) not in sections(target):
            problems.append(f"{m.group(0)}: {m.group(1)} has no heading #{m.group(2)}")
    assert problems == []
