"""Shared fixtures: the tiny torch-free unit ``99_fixture`` and learner variants of it."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_tools.exercises import build_exercises

FIXTURES = Path(__file__).parent / "fixtures"
SOLUTIONS = FIXTURES / "solutions"
SOLUTION = SOLUTIONS / "99_fixture.ipynb"


@pytest.fixture
def solutions_dir() -> Path:
    """The fixture solutions directory (holds only 99_fixture.ipynb)."""
    return SOLUTIONS


@pytest.fixture
def solution() -> Path:
    """The executed fixture solution: three graded tasks (1, 2 worth 2 points, 3)."""
    return SOLUTION


@pytest.fixture
def exercise(tmp_path) -> Path:
    """A freshly generated exercises/99_fixture.ipynb inside tmp_path."""
    (path,) = build_exercises(SOLUTIONS, tmp_path / "exercises")
    return path


@pytest.fixture
def make_learner():
    """``make_learner(exercise, {cell_id: source}, insert_after={cell_id: source})`` -> Path."""
    return _learner_notebook


def _learner_notebook(
    exercise: Path, answers: dict[str, str], *, insert_after: dict[str, str] | None = None
) -> Path:
    """Write a copy of ``exercise`` with cell sources replaced (by cell id) and code cells inserted."""
    nb = nbformat.read(exercise, as_version=4)
    by_id = {cell.id: cell for cell in nb.cells}
    for cell_id, source in answers.items():
        by_id[cell_id].source = source
    for cell_id, source in (insert_after or {}).items():
        index = next(i for i, cell in enumerate(nb.cells) if cell.id == cell_id)
        new = nbformat.v4.new_code_cell(source)
        new.id = f"inserted-{index}"
        nb.cells.insert(index + 1, new)
    path = exercise.parent.parent / "learner" / exercise.name
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, path)
    return path
