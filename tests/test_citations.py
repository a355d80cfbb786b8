"""Citations a learner can follow, and navigation between units.

The course's background texts (S0-S4) are not in the repository: a lecture names one only as a
link to its entry in docs/references.md, and never points to a folder learners do not have.
Every lecture ends with links to its exercise and to the next and previous units present.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from course_tools.publish import navigation

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"
NOTEBOOKS = sorted(
    p for folder in ("notebooks", "solutions", "exercises") for p in (ROOT / folder).glob("*.ipynb")
)
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LINK_TO_REFERENCES = re.compile(r"\[[^\]]*\]\(\.\./docs/references\.md(?:#([^)\s]*))?\)")
CODE_OR_MATH = re.compile(r"`[^`]*`|\$\$.*?\$\$|\$[^$]*\$", re.S)
BARE_SOURCE = re.compile(r"(?<![\w/])S[0-4](?![\w])")


def anchors(markdown: str) -> set[str]:
    return {
        navigation.github_slug(m.group(1))
        for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", markdown, re.M)
    }


def markdown_cells(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            yield index, cell.source


def test_github_slug():
    assert navigation.github_slug("S2: Practitioner guide to memory, and frameworks") == (
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


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_lecture_ends_with_its_exercise_and_neighbours(path):
    nb = nbformat.read(path, as_version=4)
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and last.get("id") == navigation.FOOTER_ID, (
        f"{path.name}: no footer; run `python -m course_tools.publish nav {path.name}`"
    )
    links = re.findall(r"\]\(([^)]+)\)", last.source)
    assert f"../exercises/{path.name}" in links
    stems = [p.stem for p in LECTURES]
    i = stems.index(path.stem)
    expected_next = {f"{stems[i + 1]}.ipynb"} if i + 1 < len(stems) else set()
    expected_previous = {f"{stems[i - 1]}.ipynb"} if i > 0 else set()
    siblings = {link for link in links if re.fullmatch(r"\d\d_\w+\.ipynb", link)}
    assert siblings == expected_next | expected_previous
    for link in links:
        target = (path.parent / link.split("#")[0]).resolve()
        assert target.exists(), f"{path.name}: footer links {link}, which does not exist"
    assert last.source == navigation.footer(path.stem), f"{path.name}: footer is stale"
    assert "slide:skip" in last.metadata.get("tags", [])
