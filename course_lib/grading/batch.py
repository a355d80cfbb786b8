"""Grade a whole class: every notebook under a folder, one CSV row per learner and task.

    python -m course_lib.grade submissions/ --csv grades.csv --jobs 2 [--feedback DIR]

* Notebooks are found anywhere under the folder, under any file name, and matched to their unit
  the way one notebook is (metadata ``course.unit``, else the file name; see
  :func:`course_lib.grading.grader.find_solution`).
* The learner is the first folder below the submissions folder (``submissions/alice/…``), or the
  file's stem for a notebook directly in it.
* Skipped, each with one line in the summary: a file that is not a notebook or not an exercise of
  this course, a notebook of a unit with no solution, a second notebook of the same learner and
  unit (the first by path is graded).
* Each notebook is graded in a worker process (``--jobs`` at a time), in a fresh kernel: a kernel
  that dies or a cell that hangs scores 0 for the rest of that notebook and never stops the batch;
  nor does a cell that kills the worker itself (that notebook is graded again alone, and scores 0
  if it kills that worker too).
  Notebooks are graded unit by unit, and each worker keeps its zygote (the clean process the
  checks are forked from, :mod:`course_lib.grading.zygote`) warm for the next notebook of the same
  unit instead of importing torch and the unit again for every notebook.
* Written: the CSV (learner, unit, notebook, task, points, passed, tampered, message), and a
  Markdown feedback file per learner and notebook with the ✓/✗ lines (``--feedback``, default
  ``feedback/`` beside the CSV). Printed: a summary table per learner and unit.

Exit status 0 when at least one notebook was graded, 2 when nothing could be (a missing or empty
folder, only skipped files).
"""

from __future__ import annotations

import csv
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.grading.exercises import ExerciseError, load_notebook_json
from course_lib.grading.grader import GradingInputError, find_solution, grade_notebook
from course_lib.grading.report import GradeReport, TaskResult

__all__ = ["Submission", "collect", "grade_folder"]

CSV_FIELDS = (
    "learner",
    "unit",
    "notebook",
    "task",
    "points",
    "passed",
    "tampered",
    "message",
    "seed",
    "status",
    "isolation",
)


@dataclass(frozen=True)
class Submission:
    """One notebook to grade."""

    learner: str  # the first folder below the submissions folder, or the file's stem
    unit: str  # NN_topic of the solution it is graded against
    path: Path


def _learner(folder: Path, path: Path) -> str:
    parts = path.relative_to(folder).parts
    return parts[0] if len(parts) > 1 else path.stem


@dataclass(frozen=True)
class Ungraded:
    """A file under the folder that could not be graded, and why; it still gets CSV rows."""

    learner: str
    unit: str  # the unit its name matches, or ""
    path: Path
    status: str  # "unreadable", "not an exercise", "duplicate"
    why: str


def collect(
    folder: Path, solutions_dir: Path | str | None = None
) -> tuple[list[Submission], list[str], list[Ungraded]]:
    """(notebooks to grade, one line per skipped file, the skipped files as rows), in path
    order."""
    if not folder.is_dir():
        raise GradingInputError(f"submissions = {str(folder)!r}: no such folder")
    found: list[Submission] = []
    skipped: list[str] = []
    ungraded: list[Ungraded] = []
    seen: set[tuple[str, str]] = set()
    for path in sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts):
        rel = path.relative_to(folder)
        learner = _learner(folder, path)
        try:
            _, data = load_notebook_json(path)
        except (ExerciseError, GradingInputError) as exc:
            why = str(exc).removeprefix(str(path) + ": ")
            skipped.append(f"{rel}: skipped: {why}")
            ungraded.append(
                Ungraded(learner, _unit_by_name(path, solutions_dir), path, "unreadable", why)
            )
            continue
        try:
            unit = find_solution(path, data, solutions_dir).stem
        except (ExerciseError, GradingInputError) as exc:
            why = str(exc).removeprefix(str(path) + ": ")
            skipped.append(f"{rel}: skipped: {why}")
            ungraded.append(Ungraded(learner, "", path, "not an exercise", why))
            continue
        if (learner, unit) in seen:
            why = f"a second notebook of {learner} for unit {unit}"
            skipped.append(f"{rel}: skipped: {why}")
            ungraded.append(Ungraded(learner, unit, path, "duplicate", why))
            continue
        seen.add((learner, unit))
        found.append(Submission(learner, unit, path))
    return found, skipped, ungraded


def _unit_by_name(path: Path, solutions_dir: Path | str | None) -> str:
    """The unit an unreadable file's name points at (``NN_...``), or ""."""
    try:
        return find_solution(path, {}, solutions_dir).stem
    except (ExerciseError, GradingInputError):
        return ""


def _grade_one(args: tuple[Submission, str | None, float, str]) -> GradeReport:
    submission, solutions_dir, timeout, isolation = args
    # each learner's checks draw their own cases: the seed comes from the learner's id
    return grade_notebook(
        submission.path,
        solutions_dir=solutions_dir,
        timeout=timeout,
        learner=submission.learner,
        isolation=isolation,
    )


def _reports(
    todo: list[Submission], solutions_dir: str | None, timeout: float, jobs: int, isolation: str
) -> Iterator[tuple[Submission, GradeReport]]:
    """Reports in the order of ``todo``, graded ``jobs`` at a time in worker processes.

    A worker that dies (a learner's cell can kill its kernel's parent) breaks the whole pool, and
    which notebook did it is not known: each notebook the break took is graded again alone, and
    one that kills its own worker again scores 0 with that said."""
    from tqdm.auto import tqdm

    # unit by unit, so that a worker's judges mostly find their unit's imports warm
    order = sorted(range(len(todo)), key=lambda i: todo[i].unit)
    bar = tqdm(total=len(todo), desc="grading", unit="notebook", leave=False)
    try:
        reports, lost = _in_pool(todo, order, (solutions_dir, timeout, isolation), jobs, bar)
        for i in lost:
            again, _ = _in_pool(todo, [i], (solutions_dir, timeout, isolation), 1, bar)
            reports[i] = again.get(i) or _killed_report(todo[i], solutions_dir, isolation)
            bar.update(0 if i in again else 1)
    finally:
        bar.close()
    for i, submission in enumerate(todo):
        yield submission, reports[i]


def _in_pool(
    todo: list[Submission],
    order: list[int],
    how: tuple[str | None, float, str],
    jobs: int,
    bar: Any,
) -> tuple[dict[int, GradeReport], list[int]]:
    """({index: report} of the notebooks graded, [indices a dead worker took with it])."""
    context = multiprocessing.get_context("spawn")  # a clean interpreter per worker
    reports: dict[int, GradeReport] = {}
    lost: list[int] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        work = {i: pool.submit(_grade_one, (todo[i], *how)) for i in order}
        for i, future in work.items():  # in submission order: a worker's next is its unit's
            try:
                reports[i] = future.result()
            except BrokenProcessPool:
                lost.append(i)
                continue
            except Exception as exc:  # noqa: BLE001 - one notebook's error never stops the batch
                reports[i] = _killed_report(todo[i], how[0], how[2], f"{type(exc).__name__}: {exc}")
            bar.update()
    return reports, lost


def _killed_report(
    submission: Submission, solutions_dir: str | None, isolation: str, error: str = ""
) -> GradeReport:
    """0 for every task of a notebook whose grading process was killed twice (or failed)."""
    from course_lib.grading.grader import _load

    _, solution, expected, _ = _load(submission.path, solutions_dir)
    why = (
        f"not graded: {error[:300]}"
        if error
        else "not graded: the grading process was killed while this notebook ran"
    )
    tasks = [TaskResult(t, spec.points, False, why) for t, spec in expected.items()]
    status = "grading error" if error else "grading process killed"
    where = "sandbox" if isolation == "required" else isolation
    return GradeReport(submission.path, solution, tasks, status, isolation=where)


def _ungraded_rows(
    item: Ungraded, folder: Path, solutions_dir: str | None, isolation: str
) -> list[tuple[Any, ...]]:
    """0-point rows for a file that was not graded: one per task of the unit its name matches
    (a duplicate: one row), else one row with the unit empty."""
    from course_lib.grading.grader import default_solutions_dir
    from course_lib.grading.notebooks import read_notebook, solution_tasks

    where = item.path.relative_to(folder).as_posix()
    tasks: list[tuple[int | str, int | float]] = [("", 0)]
    if item.unit and item.status != "duplicate":
        base = Path(solutions_dir) if solutions_dir is not None else default_solutions_dir()
        solution = base / f"{item.unit}.ipynb"
        try:
            expected = solution_tasks(read_notebook(solution), solution)
            tasks = [(t, spec.points) for t, spec in expected.items()] or tasks
        except (ExerciseError, OSError, ValueError):
            pass
    return [
        (item.learner, item.unit, where, task, points, False, "", f"{item.status}: {item.why}",
         "", item.status, isolation)
        for task, points in tasks
    ]  # fmt: skip


def _feedback(submission: Submission, report: GradeReport) -> str:
    lines = [f"# {submission.learner}: unit {submission.unit}", ""]
    lines += [f"Graded `{submission.path.name}`: {report.score}/{report.total} points.", ""]
    for t in report.tasks:
        lines.append(f"- {'✓' if t.passed else '✗'} task {t.task} ({t.points} pt): {t.message}")
    if report.tampered:
        lines += ["", "Check cells changed in the notebook:"]
        lines += [f"- {line}" for line in report.tampered]
    if report.status != "completed":
        lines += ["", f"Grading stopped: {report.status}."]
    return "\n".join(lines) + "\n"


def grade_folder(
    folder: Path | str,
    csv_path: Path | str,
    *,
    jobs: int = 2,
    solutions_dir: Path | str | None = None,
    timeout: float,
    feedback: Path | str | None = None,
    isolation: str = "auto",
) -> tuple[list[tuple[Submission, GradeReport]], list[str]]:
    """Grade every notebook under ``folder``; write the CSV (a row for every task of every
    notebook, and 0-point rows for every file that could not be graded) and feedback files;
    return ((submission, report) per graded notebook, skipped lines). The course's files, the
    solutions and the environment are fingerprinted before and after:
    :class:`CourseChanged` (after the CSV is written) if anything changed."""
    from course_lib import validate
    from course_lib.grading.fingerprint import environment_fingerprint
    from course_lib.grading.sandbox import SandboxUnavailable, resolve_isolation

    validate.count("jobs", jobs, minimum=1)
    try:
        where = resolve_isolation(isolation)
    except (ValueError, SandboxUnavailable) as exc:
        raise GradingInputError(str(exc)) from None
    folder, csv_path = Path(folder), Path(csv_path)
    todo, skipped, ungraded = collect(folder, solutions_dir)
    if not todo and not ungraded:
        raise GradingInputError(f"submissions = {str(folder)!r}: no notebooks (*.ipynb) under it")
    feedback_dir = Path(feedback) if feedback is not None else csv_path.parent / "feedback"
    sol = None if solutions_dir is None else str(solutions_dir)
    before = environment_fingerprint(solutions_dir)
    how = "required" if where == "sandbox" else "none"  # every notebook as the first one
    done = list(_reports(todo, sol, timeout, jobs, how)) if todo else []
    changed = environment_fingerprint(solutions_dir).changes(before)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        for s, report in done:
            for t in report.tasks:
                row = (s.learner, s.unit, s.path.relative_to(folder).as_posix(), t.task)
                writer.writerow(
                    row
                    + (t.points, t.passed, t.tampered, t.message, report.seed)
                    + (report.status, report.isolation)
                )
        for item in ungraded:
            writer.writerows(_ungraded_rows(item, folder, sol, where))
    for s, report in done:
        target = feedback_dir / s.learner / f"{s.unit}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_feedback(s, report), encoding="utf-8")
    if changed:
        raise CourseChanged(changed)
    return done, skipped


class CourseChanged(RuntimeError):
    """The course's files, solutions or environment changed while a batch was graded."""

    def __init__(self, changed: list[str]):
        shown = ", ".join(changed[:5]) + (
            f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        super().__init__(
            f"the course's files changed while the batch was graded ({shown}): its grades "
            "cannot be trusted; restore the course (git status) and grade again"
        )
        self.changed = changed


def summary(done: list[tuple[Submission, GradeReport]], skipped: list[str]) -> str:
    """The table printed after a batch: learner, unit, score, status; then the skipped files."""
    rows = [("learner", "unit", "score", "status")]
    rows += [
        (
            s.learner,
            s.unit,
            f"{r.score}/{r.total}",
            r.status + (" (tampered)" if r.tampered else ""),
        )
        for s, r in done
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in rows]
    lines += skipped
    lines.append(f"graded {len(done)} notebook(s), skipped {len(skipped)}")
    if any(r.isolation != "sandbox" for _, r in done):
        lines.append(
            "isolation: none - a self-check: the notebooks ran without a sandbox, with the "
            "grader's user and files (README, 'Grading a class')"
        )
    return "\n".join(lines)
