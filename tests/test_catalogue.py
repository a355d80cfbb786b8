"""The course catalogue (course_lib.catalogue): units found from the files, once, for grading,
publishing, the cluster export and navigation."""

from __future__ import annotations

import json
import pathlib

import pytest

from course_lib import catalogue

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _notebook(path: pathlib.Path, heading: str | None = None) -> None:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [heading]}] if heading else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))


def _package(root: pathlib.Path, name: str) -> None:
    (root / "course_lib" / "units" / name).mkdir(parents=True)
    (root / "course_lib" / "units" / name / "__init__.py").write_text("")


@pytest.fixture
def course(tmp_path) -> pathlib.Path:
    """00 with a lecture, a solution, a package and a README row; 01 with a lecture whose heading
    gives its title; 03 a package only (a unit being written)."""
    (tmp_path / "README.md").write_text(
        "| unit | title | measures | status |\n|---|---|---|---|\n"
        "| 00 | [Start](notebooks/00_start.ipynb) | all | available |\n"
    )
    _notebook(tmp_path / "notebooks" / "00_start.ipynb", "# Unit 00 — not this title")
    _notebook(tmp_path / "solutions" / "00_start.ipynb")
    _package(tmp_path, "u00_start")
    _notebook(tmp_path / "notebooks" / "01_two_words.ipynb", "# Unit 01 — Two words, titled")
    _package(tmp_path, "u03_later_unit")
    (tmp_path / "notebooks" / "notes.ipynb").write_text("{}")  # not a unit's name
    (tmp_path / "course_lib" / "units" / "_template").mkdir()
    return tmp_path


def test_units_are_found_from_the_files(course):
    found = catalogue.units(course)
    assert [u.stem for u in found] == ["00_start", "01_two_words", "03_later_unit"]
    first, second, third = found
    assert first.title == "Start" and first.label == "Unit 00 — Start"  # README wins
    assert first.lecture == course / "notebooks" / "00_start.ipynb"
    assert first.solution == course / "solutions" / "00_start.ipynb"
    assert first.exercise == course / "exercises" / "00_start.ipynb"  # where it is generated
    assert first.package == "course_lib.units.u00_start"
    assert first.package_dir == course / "course_lib" / "units" / "u00_start"
    assert second.title == "Two words, titled"  # the lecture's heading
    assert second.solution is None and second.exercise is None and second.package is None
    assert third.title == "Later unit" and third.lecture is None  # the slug in words
    assert third.package == "course_lib.units.u03_later_unit"


def test_a_new_unit_is_there_as_soon_as_its_file_is(course):
    before = [u.number for u in catalogue.units(course)]
    _notebook(course / "solutions" / "02_new.ipynb")
    assert [u.number for u in catalogue.units(course)] == sorted(before + ["02"])


def test_one_number_with_two_slugs_is_refused(course):
    _notebook(course / "solutions" / "01_other_name.ipynb")
    with pytest.raises(ValueError, match=r"unit = '01': expected one slug .* other_name in"):
        catalogue.units(course)


def test_a_unit_by_number_stem_or_package(course):
    for key in (0, "0", "00", "00_start", "u00_start"):
        assert catalogue.unit(key, course).stem == "00_start"
    with pytest.raises(ValueError, match=r"unit = '7': expected one of 00, 01, 03"):
        catalogue.unit("7", course)


def test_neighbours_among_the_lectures(course):
    before, this, after = catalogue.neighbours("00_start", course)
    assert before is None and this.number == "00" and after is not None and after.number == "01"
    assert catalogue.neighbours("01_two_words", course)[2] is None  # 03 has no lecture yet
    with pytest.raises(ValueError, match="stem = '03_later_unit': expected one of"):
        catalogue.neighbours("03_later_unit", course)


def test_readme_table_and_stems(course, tmp_path):
    assert catalogue.readme_table(course / "README.md") == [
        {"unit": "00", "title": "Start", "measures": "all", "status": "available"}
    ]
    (tmp_path / "empty.md").write_text("no table\n")
    with pytest.raises(ValueError, match="expected a course table"):
        catalogue.readme_table(tmp_path / "empty.md")
    assert catalogue.stems(course / "notebooks") == ["00_start", "01_two_words"]
    assert catalogue.stems(course / "nowhere") == []


def test_the_course_itself():
    """Every lecture, solution and unit package of the repository is in the catalogue, and the
    readers agree with it."""
    from course_lib.cluster import experiments
    from course_lib.grading.notebooks import unit_names
    from course_tools.publish import navigation

    found = catalogue.units()
    stems = {u.stem for u in found}
    assert {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")} <= stems
    assert set(unit_names(ROOT / "solutions")) <= stems
    packages = {p.name for p in (ROOT / "course_lib" / "units").glob("u[0-9][0-9]_*")}
    assert packages == {u.package_dir.name for u in found if u.package_dir}
    assert [u.stem for u in navigation.units()] == [u.stem for u in found if u.lecture]
    assert {e.unit for e in experiments().values()} <= {f"u{u.number}" for u in found}
