"""The course's units, found once from its files: what grading, publishing, the cluster export
and the lectures' navigation read instead of each looking through folders.

A unit is a two-digit number and a slug (``09`` and ``data_parallelism``), found from any of
``notebooks/NN_slug.ipynb`` (the lecture), ``solutions/NN_slug.ipynb`` (the graded exercise with
its answers; ``exercises/NN_slug.ipynb`` is generated from it) and ``course_lib/units/uNN_slug/``
(its package). A new unit is in the catalogue as soon as one of those exists: nothing here lists
the units by hand. Its title is the one in README.md's course table (``| NN | title | ... |``),
else the lecture's first heading (``# Unit NN — title``), else the slug in words.

    from course_lib import catalogue
    [u.stem for u in catalogue.units()]           # ['00_start_here', ..., '19_inside_the_step']
    catalogue.unit("9").lecture                   # .../notebooks/09_data_parallelism.ipynb

Pure Python (no torch, no notebook library): the bottom of the package order
(tests/test_import_graph.py).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "NOTEBOOK_NAME", "Unit", "units", "unit", "neighbours", "stems", "readme_table"]

#: the course's folder (the repository that holds this package)
ROOT = Path(__file__).resolve().parents[1]
#: a unit's notebook file name: two digits, an underscore, the slug
NOTEBOOK_NAME = re.compile(r"^(?P<number>\d\d)_(?P<slug>[A-Za-z0-9_\-]+)\.ipynb$")
#: a unit's package folder under course_lib/units/
PACKAGE_NAME = re.compile(r"^u(?P<number>\d\d)_(?P<slug>[A-Za-z0-9_]+)$")
_TABLE_ROW = re.compile(r"^\|\s*(\d\d)\s*\|(.+?)\|(.+?)\|(.+?)\|\s*$")
_HEADING = re.compile(r"^#\s+Unit\s+\d\d\s*[—–-]+\s*(?P<title>.+?)\s*$")


@dataclass(frozen=True)
class Unit:
    """One unit of the course and where its files are (None: the unit has none of that kind)."""

    number: str
    """two digits, "09" """
    slug: str
    """the rest of the file names, "data_parallelism" """
    title: str
    """README.md's title, else the lecture's first heading, else the slug in words"""
    lecture: Path | None
    """notebooks/NN_slug.ipynb"""
    solution: Path | None
    """solutions/NN_slug.ipynb"""
    exercise: Path | None
    """exercises/NN_slug.ipynb: where the generator writes it from the solution (None without a
    solution; the file exists once ``make exercises`` ran)"""
    package: str | None
    """the unit's package, "course_lib.units.u09_data_parallelism" """
    package_dir: Path | None
    """its folder, course_lib/units/u09_data_parallelism"""

    @property
    def stem(self) -> str:
        """The notebooks' file stem, "09_data_parallelism"."""
        return f"{self.number}_{self.slug}"

    @property
    def label(self) -> str:
        """ "Unit 09 — Data parallelism (DDP)": how links and headings name the unit."""
        return f"Unit {self.number} — {self.title}"


def stems(folder: Path | str) -> list[str]:
    """The unit notebooks (``NN_slug``) in ``folder``, in order: the one file-name rule."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.iterdir() if p.is_file() and NOTEBOOK_NAME.match(p.name))


def readme_table(readme: Path | str = ROOT / "README.md") -> list[dict[str, str]]:
    """The rows of README.md's course table: unit, title (links reduced to their text), what is
    measured, status."""
    readme = Path(readme)
    rows = []
    for line in readme.read_text(encoding="utf-8").splitlines():
        match = _TABLE_ROW.match(line)
        if match:
            number, title, measures, status = (part.strip() for part in match.groups())
            title = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", title)
            rows.append({"unit": number, "title": title, "measures": measures, "status": status})
    if not rows:
        raise ValueError(
            f"readme = {str(readme)!r}: expected a course table (| NN | title | measures | "
            "status |)"
        )
    return rows


def _lecture_title(path: Path) -> str | None:
    """The title in the lecture's first heading, "# Unit NN — title" (None without one)."""
    try:
        return _heading_title(path, path.stat().st_mtime_ns)
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _heading_title(path: Path, mtime_ns: int) -> str | None:
    """:func:`_lecture_title` of one version of the file (an executed lecture is megabytes)."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return None
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", []))
            match = _HEADING.match(source.splitlines()[0]) if source.strip() else None
            return match.group("title") if match else None
    return None


def _slugs(root: Path) -> dict[str, dict[str, set[str]]]:
    """number -> slug -> the places it was found ("notebooks", "solutions", "package")."""
    found: dict[str, dict[str, set[str]]] = {}
    for folder in ("notebooks", "solutions"):
        for stem in stems(root / folder):
            number, slug = stem.split("_", 1)
            found.setdefault(number, {}).setdefault(slug, set()).add(folder)
    units_dir = root / "course_lib" / "units"
    if units_dir.is_dir():
        for path in units_dir.iterdir():
            match = PACKAGE_NAME.match(path.name)
            if match and (path / "__init__.py").is_file():
                number, slug = match["number"], match["slug"]
                found.setdefault(number, {}).setdefault(slug, set()).add("package")
    return found


def units(root: Path | str = ROOT) -> list[Unit]:
    """Every unit of the course at ``root``, in order of number (read from the files each call:
    a unit added meanwhile is there). Raises ValueError when two files give one number two
    slugs."""
    root = Path(root)
    try:
        titles = {row["unit"]: row["title"] for row in readme_table(root / "README.md")}
    except (OSError, ValueError):
        titles = {}
    out = []
    for number, slugs in sorted(_slugs(root).items()):
        if len(slugs) > 1:
            where = "; ".join(f"{s} in {', '.join(sorted(w))}" for s, w in sorted(slugs.items()))
            raise ValueError(
                f"unit = {number!r}: expected one slug for its lecture, solution and package, "
                f"found {where}"
            )
        ((slug, places),) = slugs.items()
        stem = f"{number}_{slug}"
        lecture = root / "notebooks" / f"{stem}.ipynb" if "notebooks" in places else None
        solution = root / "solutions" / f"{stem}.ipynb" if "solutions" in places else None
        package_dir = root / "course_lib" / "units" / f"u{stem}" if "package" in places else None
        title = titles.get(number) or (lecture and _lecture_title(lecture))
        out.append(
            Unit(
                number=number,
                slug=slug,
                title=title or slug.replace("_", " ").capitalize(),
                lecture=lecture,
                solution=solution,
                exercise=root / "exercises" / f"{stem}.ipynb" if solution else None,
                package=f"course_lib.units.u{stem}" if package_dir else None,
                package_dir=package_dir,
            )
        )
    return out


def unit(key: str | int, root: Path | str = ROOT) -> Unit:
    """One unit by its number (``9``, ``"09"``), its stem (``"09_data_parallelism"``) or its
    package's name (``"u09_data_parallelism"``)."""
    every = units(root)
    text = str(key)
    wanted = text.zfill(2) if text.isdigit() else text.removeprefix("u")
    for u in every:
        if wanted in (u.number, u.stem):
            return u
    raise ValueError(
        f"unit = {key!r}: expected one of {', '.join(u.number for u in every)} (or a stem "
        f"such as {every[0].stem if every else '00_start_here'!r})"
    )


def neighbours(stem: str, root: Path | str = ROOT) -> tuple[Unit | None, Unit, Unit | None]:
    """(previous, this, next) of the lecture ``stem`` among the units that have a lecture; None
    at either end."""
    present = [u for u in units(root) if u.lecture is not None]
    found = [u.stem for u in present]
    if stem not in found:
        raise ValueError(f"stem = {stem!r}: expected one of {', '.join(found)}")
    i = found.index(stem)
    before = present[i - 1] if i > 0 else None
    after = present[i + 1] if i + 1 < len(present) else None
    return before, present[i], after
