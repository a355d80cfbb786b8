"""Citations a learner can follow.

The course's background texts (S0-S4) are not in the repository: a lecture names one only as a
link to its entry in docs/references.md, and never points to a folder learners do not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"
NOTEBOOKS = sorted(
    p for folder in ("notebooks", "solutions", "exercises") for p in (ROOT / folder).glob("*.ipynb")
)
LINK_TO_REFERENCES = re.compile(r"\[[^\]]*\]\(\.\./docs/references\.md(?:#([^)\s]*))?\)")
CODE_OR_MATH = re.compile(r"`[^`]*`|\$\$.*?\$\$|\$[^$]*\$", re.S)
BARE_SOURCE = re.compile(r"(?<![\w/])S[0-4](?![\w])")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", markdown, re.M)}


def markdown_cells(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            yield index, cell.source


def test_github_slug():
    assert github_slug("S2: Practitioner guide to memory, and frameworks") == (
        "s2-practitioner-guide-to-memory-and-frameworks"
    )


def test_references_describe_each_background_text():
    text = REFERENCES.read_text(encoding="utf-8")
    found = anchors(text)
    for n in range(5):
        assert any(a.startswith(f"s{n}-") for a in found), f"no heading for S{n}"
    assert "primary-sources" in found
    assert "shared/sources" not in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_markdown_cites_what_a_learner_can_open(path):
    known = anchors(REFERENCES.read_text(encoding="utf-8"))
    problems = []
    for index, source in markdown_cells(path):
        if "shared/sources" in source:
            problems.append(f"cell {index}: points to shared/sources (learners do not have it)")
        for match in LINK_TO_REFERENCES.finditer(source):
            if match.group(1) is not None and match.group(1) not in known:
                problems.append(f"cell {index}: #{match.group(1)} is no heading of references.md")
        rest = CODE_OR_MATH.sub("", LINK_TO_REFERENCES.sub("", source))
        for match in BARE_SOURCE.finditer(rest):
            line = rest[: match.start()].count("\n")
            problems.append(f"cell {index}: bare {match.group(0)} in {rest.splitlines()[line]!r}")
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)
