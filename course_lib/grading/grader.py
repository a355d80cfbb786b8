"""Score a learner's exercise notebook per task against the solution's expected outputs.

    python -m course_lib.grade exercises/03_precision.ipynb [--solutions DIR] [--timeout S] [--json]
        [--seed N | --learner ID]

1. Find the solution: the notebook's metadata ``course.unit`` (or ``course.generated_from``), else
   its file name ``NN_topic.ipynb`` (or, for a renamed copy, the one solution with the same ``NN_``
   prefix), looked up in ``--solutions`` or else in ``solutions/`` next to the ``course_lib``
   package being run.
2. Run the learner's notebook cell by cell in a fresh kernel (nbclient, cwd = the notebook's
   directory): their cells, their errors (recorded; execution goes on). The check cells (found by
   their ``task-N`` tag) do not run there: the report (and the JSON's ``tampered``) names every
   check cell that was edited, moved, deleted or added (:mod:`course_lib.grading.tamper`).
3. Each task's verdict comes from a clean process (:mod:`course_lib.grading.clean`,
   :mod:`course_lib.grading.isolate`): the learner's definitions carried by source, the course's
   answers trapped, the solution's check code run with cases drawn from the grading seed
   (``--seed``, else derived from ``--learner``, the metadata ``course.learner`` or the file name).
   Task N passes iff the check returns, prints the ✓ line the solution stores (trailing
   whitespace aside) and finds ``course_lib`` unchanged.
4. If the kernel dies or a cell runs over ``--timeout`` seconds, every task whose check cell has not
   completed scores 0 with the message "kernel died" / "cell timed out after S s".

Exit status: 0 if every task passes, 1 otherwise, 2 for bad input (missing file, not a notebook, no
matching solution), reported as one line on stderr.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from course_lib.grading.clean import jobs_for
from course_lib.grading.compare import (  # noqa: F401 (re-exported)
    SKIP_COMPARE,
    _first_line,
    coalesce_streams,
    compare_outputs,
)
from course_lib.grading.exercises import (
    ExerciseError,
    SolutionTask,
    load_notebook_json,
    read_notebook,
    solution_tasks,
    unit_names,
)
from course_lib.grading.isolate import CheckJob
from course_lib.grading.judge import JudgeSide, judge_task, seed_env
from course_lib.grading.notebooks import CHECK_TAG, SOLUTION_NAME, cell_task
from course_lib.grading.report import GradeReport, TaskResult
from course_lib.grading.sandbox import run_learner_side
from course_lib.grading.tamper import check_cell_changes, describe_change

__all__ = [
    "DEFAULT_TIMEOUT",
    "GradeReport",
    "GradingInputError",
    "TaskResult",
    "coalesce_streams",
    "compare_outputs",
    "find_solution",
    "grade_notebook",
]

DEFAULT_TIMEOUT = 120  # seconds per cell; exercise cells take a few seconds on 2 CPU cores


class GradingInputError(ValueError):
    """Bad input to the grader: missing file, not a notebook, or no matching solution."""


# --------------------------------------------------------------------------- finding the solution
def default_solutions_dir() -> Path:
    """``solutions/`` of the repository holding the running ``course_lib`` package."""
    import course_lib

    return Path(course_lib.__file__).resolve().parent.parent / "solutions"


def find_solution(path: Path | str, nb: Any, solutions_dir: Path | str | None = None) -> Path:
    """The solution notebook matching learner notebook ``nb`` (a NotebookNode or its JSON dict, read from ``path``)."""
    path = Path(path)
    explicit = solutions_dir is not None
    solutions_dir = Path(solutions_dir) if solutions_dir is not None else default_solutions_dir()
    if not solutions_dir.is_dir():
        hint = "" if explicit else "; pass --solutions DIR"
        raise GradingInputError(f"{path}: no solutions directory at {solutions_dir}{hint}")
    units = unit_names(solutions_dir)
    known = f"known units in {solutions_dir}: {', '.join(units) if units else 'none'}"
    metadata = nb.get("metadata", {})
    course = metadata.get("course", {}) if isinstance(metadata, dict) else {}
    course = course if isinstance(course, dict) else {}
    if isinstance(course.get("unit"), str) and course["unit"]:
        wanted, why = (
            f"{Path(course['unit']).name}.ipynb",
            f"metadata course.unit={course['unit']!r}",
        )
    elif isinstance(course.get("generated_from"), str) and course["generated_from"]:
        wanted, why = (
            Path(course["generated_from"]).name,
            f"metadata course.generated_from={course['generated_from']!r}",
        )
    else:
        wanted, why = path.name, "file name"
        if not (solutions_dir / wanted).is_file():
            prefix = re.match(r"^(\d\d)_", path.name)
            same = [u for u in units if prefix and u.startswith(prefix.group(1) + "_")]
            if len(same) == 1:
                return solutions_dir / f"{same[0]}.ipynb"
    candidate = solutions_dir / wanted
    if not (SOLUTION_NAME.match(candidate.name) and candidate.is_file()):
        raise GradingInputError(
            f"{path}: no matching solution for {Path(wanted).stem!r} (from its {why}); {known}"
        )
    return candidate


# --------------------------------------------------------------------------- grading
def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("course_lib.grading.grader.nbclient")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def _error_of(cell: Any) -> tuple[str, str] | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return str(output.get("ename", "Error")), str(output.get("evalue", ""))
    return None


def _error_message(ename: str, evalue: str) -> str:
    first = _first_line(evalue)
    if ename == "AssertionError":
        return first or "AssertionError"
    return f"{ename}: {first}" if first else ename


def grade_notebook(
    path: Path | str,
    *,
    solutions_dir: Path | str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    kernel_name: str = "python3",
    seed: int | None = None,
    learner: str | None = None,
    isolation: str = "auto",
) -> GradeReport:
    """Execute the learner notebook at ``path`` and score each graded task of its solution.

    ``timeout`` is seconds per cell (rounded up to whole seconds, as nbclient counts them).
    Everything the learner wrote runs on the learner's side (:mod:`course_lib.grading.sandbox`):
    the notebook in a fresh kernel, and each split check's learner half in a clean process;
    ``isolation`` says where: ``"auto"`` (a bubblewrap sandbox where this host can make one, else
    a plain process, and the report says the grade is then a self-check), ``"required"`` (the
    sandbox or :class:`GradingInputError`), ``"none"``. The verdicts are computed here, by the
    checks' judges (:mod:`course_lib.grading.split`), from the plain data that came back. The
    checks draw their cases with ``seed``, by default derived from ``learner`` (else the
    notebook's metadata ``course.learner``, else its file name).
    Returns a :class:`GradeReport` (``.tasks``: ``TaskResult(task, points, passed, message)``,
    ``.score``, ``.total``, ``.seed``, ``.isolation``). Raises :class:`GradingInputError` for a
    missing file, a file that is not a notebook, a notebook with no matching solution (or a
    malformed solution), or an isolation this host cannot give.
    """
    where = _isolation(isolation, timeout)
    seconds, path = int(math.ceil(timeout)), Path(path)
    nb, solution, expected, solution_nb = _load(path, solutions_dir)
    seed = _seed(nb, path, seed, learner)
    changes = check_cell_changes(nb, expected, [cell.get("id") for cell in solution_nb.cells])
    unit = f"course_lib.units.u{solution.stem}"
    side = JudgeSide(unit, solution_nb, expected, seed).start()  # while the notebook runs
    check_cells = _place_checks(nb, path, expected)
    jobs = {
        t: replace(job, mode="auto")  # the split checks' learner halves; any other check whole
        for t, job in jobs_for(unit, solution_nb, nb, expected).items()
    }
    request = _request(nb, path, jobs, check_cells, seed, unit, seconds, kernel_name)
    wall = seconds * (len(nb.cells) + 2 * len(jobs)) + 120
    reply = run_learner_side(
        request, isolation=where, unit=unit, wall_seconds=wall, later=side.encoded_inputs
    )
    side.join()
    stopped_at, status, cell_errors, results = _read_reply(reply)
    tasks = []
    with seed_env(seed):
        for task, spec in expected.items():
            result = _score(task, spec, check_cells.get(task), stopped_at, status) or judge_task(
                spec,
                side.judges.get(task),
                results.get(str(task)),
                side.inputs.get(task),
                side.expected.get(task),
            )
            tasks.append(result._replace(tampered=_join(changes.get(task, []), result.tampered)))
    tampered = [
        describe_change(task, kind, task in expected)
        for task, kinds in changes.items()
        for kind in kinds
    ]
    return GradeReport(path, solution, tasks, status, cell_errors, tampered, seed, where)


def _isolation(isolation: str, timeout: Any) -> str:
    """Where the learner's code will run ("sandbox" or "none"); bad input raises."""
    from course_lib.grading.sandbox import SandboxUnavailable, resolve_isolation

    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not timeout > 0
        or math.isinf(timeout)
    ):
        raise GradingInputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    try:
        return resolve_isolation(isolation)
    except (ValueError, SandboxUnavailable) as exc:
        raise GradingInputError(str(exc)) from None


def _request(
    nb: Any,
    path: Path,
    jobs: dict[int, CheckJob],
    check_cells: dict[int, int],
    seed: int,
    unit: str,
    seconds: int,
    kernel_name: str,
) -> dict[str, Any]:
    """What the learner's side is asked to run (:mod:`course_lib.grading.sandbox_main`)."""
    return {
        "notebook": nb,
        "name": path.name,
        "jobs": [asdict(job) for job in jobs.values()],
        "check_cells": {str(t): i for t, i in check_cells.items()},
        "seed": seed,
        "unit": unit,
        "cell_seconds": seconds,
        "job_seconds": 2 * seconds,
        "kernel_name": kernel_name,
    }


def _read_reply(reply: dict[str, Any]) -> tuple[int | None, str, list[str], dict[str, Any]]:
    """(where the kernel stopped, how, the other cells' errors, each task's result) from the
    learner's side; what it may have forged there can only cost the learner marks."""
    if "lost" in reply or not isinstance(reply.get("results"), dict):
        lost = str(reply.get("lost", "the learner's side sent no readable reply"))[:300]
        return 0, lost, [], {}
    stopped = reply.get("stopped_at")
    stopped_at = stopped if isinstance(stopped, int) and not isinstance(stopped, bool) else None
    status = str(reply.get("status", "completed"))[:300]
    items = reply.get("cell_errors")
    errors = []
    for item in items[:200] if isinstance(items, list) else []:
        if isinstance(item, list) and len(item) == 3 and isinstance(item[0], int):
            line = f"cell {item[0] + 1}: {str(item[1])[:80]}: {str(item[2])[:200]}"
            errors.append(line.rstrip(": "))
    return stopped_at, status, errors, reply["results"]


def _join(*parts: Any) -> str:
    flat = [p for part in parts for p in ([part] if isinstance(part, str) else part) if p]
    return ", ".join(flat)


def _seed(nb: Any, path: Path, seed: int | None, learner: str | None) -> int:
    """The grading seed: given, else from the learner's id (argument, metadata, file name)."""
    from course_lib.grading.seeds import seed_for_learner

    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise GradingInputError(f"seed = {seed!r}: expected a non-negative integer")
        return seed
    if learner is None:
        course = nb.get("metadata", {}).get("course", {})
        found = course.get("learner") if isinstance(course, dict) else None
        learner = found if isinstance(found, str) and found.strip() else path.stem
    try:
        return seed_for_learner(learner)
    except ValueError as exc:
        raise GradingInputError(str(exc)) from None


def _load(
    path: Path, solutions_dir: Path | str | None
) -> tuple[Any, Path, dict[int, SolutionTask], Any]:
    """(learner notebook, its solution's path, the solution's graded tasks, the solution
    notebook); bad input raises."""
    try:
        # bad input is reported before nbformat (slow to import) is needed
        _, data = load_notebook_json(path)
        solution = find_solution(path, data, solutions_dir)
        nb = read_notebook(path)
        solution_nb = read_notebook(solution)
        expected = solution_tasks(solution_nb, solution)
    except ExerciseError as exc:
        raise GradingInputError(str(exc)) from None
    if not expected:
        raise GradingInputError(
            f"{path}: its solution {solution} has no graded check cells (tags task-N + {CHECK_TAG})"
        )
    return nb, solution, expected, solution_nb


def _place_checks(nb: Any, path: Path, expected: dict[int, SolutionTask]) -> dict[int, int]:
    """The learner's check cells, by task; outputs cleared. In the learner's kernel a check cell
    only says where its verdict comes from (the clean process runs the solution's check)."""
    check_cells: dict[int, int] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            task = cell_task(cell, where=str(path), index=index)
        except ExerciseError:
            continue
        if task in expected and task not in check_cells:
            check_cells[task] = index
            cell.source = f"# task {task}: checked in a clean process by the grade command"
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return check_cells


def _score(
    task: int, spec: SolutionTask, index: int | None, stopped_at: int | None, status: str
) -> TaskResult | None:
    """A task's result when the notebook decides it (no check cell, the kernel stopped before
    it); None when its clean process must."""
    if index is None:
        return TaskResult(
            task,
            spec.points,
            False,
            f"no check cell for task {task} in the notebook (a code cell tagged task-{task} and {CHECK_TAG})",
        )
    if stopped_at is not None and index >= stopped_at:
        return TaskResult(task, spec.points, False, status)
    return None


def _execute(nb: Any, path: Path, seconds: int, kernel_name: str) -> tuple[int | None, str]:
    """Run every code cell, recording errors; returns (index where execution stopped or None, status)."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from course_lib.grading.kernels import kernel_env, make_client
    from course_lib.runtime.reap import no_process_left

    client = make_client(
        nb, path, timeout=seconds, kernel_name=kernel_name, allow_errors=True, log=_quiet_logger()
    )
    started = False
    try:
        with (
            no_process_left(),
            client.setup_kernel(env=kernel_env()),
        ):  # whatever the answer started
            started = True
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError:
                    pass  # recorded in the cell's outputs (e.g. a cell tagged raises-exception)
                except CellTimeoutError:
                    return index, f"cell timed out after {seconds} s"
                except DeadKernelError:
                    return index, "kernel died"
    except Exception as exc:  # noqa: BLE001 - no kernel (e.g. ipykernel missing): every task scores 0
        if started:
            raise
        return (
            0,
            f"kernel {kernel_name!r} failed to start: {type(exc).__name__}: {_first_line(str(exc))}",
        )
    return None, "completed"
