"""Navigation between units: the footer cell of every lecture and the site's previous/next links.

"Next" and "previous" come from the lectures present in ``notebooks/`` (so unit 14 links unit 15
once ``notebooks/15_*.ipynb`` exists), titles from README.md's course table, both as the course's
catalogue finds them (:mod:`course_lib.catalogue`: ``Unit``, ``neighbours``). ``python -m
course_tools.publish nav notebooks/*.ipynb`` (run by ``make notebooks``) writes or refreshes the
footer: a markdown cell with the id :data:`FOOTER_ID` at the end of the lecture, skipped in slides.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from course_lib import catalogue
from course_lib.catalogue import ROOT, Unit, neighbours

__all__ = ["FOOTER_ID", "Unit", "footer", "github_slug", "neighbours", "units", "write_footer"]

FOOTER_ID = "course-nav"


def units(root: Path = ROOT) -> list[Unit]:
    """The units that have a lecture in ``root/notebooks``, in order (:mod:`course_lib.catalogue`)."""
    return [u for u in catalogue.units(root) if u.lecture is not None]


def footer(stem: str, root: Path = ROOT) -> str:
    """The markdown of the lecture's last cell: its exercise, the next and the previous unit."""
    before, this, after = neighbours(stem, root)
    lines = ["---", "", "**Where next**", ""]
    lines.append(f"- Practise: [Unit {this.number} exercises](../exercises/{this.stem}.ipynb)")
    if after is not None:
        lines.append(f"- Next: [{after.label}]({after.stem}.ipynb)")
    else:
        lines.append("- Next: this is the last unit written so far.")
    if before is not None:
        lines.append(f"- Previous: [{before.label}]({before.stem}.ipynb)")
    lines.append(
        "- All units: [the course map](../README.md);"
        " works cited: [references](../docs/references.md)"
    )
    return "\n".join(lines)


def write_footer(path: str | Path, root: Path = ROOT) -> bool:
    """Append or refresh the footer cell of the lecture at ``path``; True if it changed."""
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    text = footer(Path(path).stem, root)
    cells = [c for c in nb.cells if c.get("id") == FOOTER_ID]
    if cells and cells[0].source == text and nb.cells[-1] is cells[0]:
        return False
    for cell in cells:
        nb.cells.remove(cell)
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = FOOTER_ID
    cell.metadata = {"slideshow": {"slide_type": "skip"}, "tags": ["slide:skip"]}
    nb.cells.append(cell)
    nbformat.write(nb, path)
    return True


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens.

    docs/references.md is linked by these anchors from the lectures and from the site.
    """
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")
