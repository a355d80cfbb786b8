"""What the grade command reports: one :class:`TaskResult` per task and the :class:`GradeReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple


class TaskResult(NamedTuple):
    task: int
    points: int | float
    passed: bool
    message: str
    tampered: str = ""  # what the learner did to this task's check cell ("edited", ...), or ""


@dataclass
class GradeReport:
    """Result of :func:`course_lib.grading.grader.grade_notebook`."""

    notebook: Path  # the learner's notebook
    solution: Path  # the solution it was graded against
    tasks: list[TaskResult]  # one per graded task of the solution, by task number
    status: str = "completed"  # "completed", "kernel died" or "cell timed out after S s"
    # "cell N: Type: message" of other cells, N counted from 1 as JupyterLab shows it ("Cell N")
    cell_errors: list[str] = field(default_factory=list)
    # one line per check cell the learner edited, moved, deleted or added
    tampered: list[str] = field(default_factory=list)
    seed: int | None = None  # the seed the checks drew their cases from
    # where the learner's code ran: "sandbox" (course_lib.grading.sandbox) or "none" (a plain
    # process with the grader's user and files: the grade is then a self-check)
    isolation: str = "none"

    @property
    def score(self) -> int | float:
        return _num(sum(t.points for t in self.tasks if t.passed))

    @property
    def total(self) -> int | float:
        return _num(sum(t.points for t in self.tasks))

    @property
    def all_passed(self) -> bool:
        return all(t.passed for t in self.tasks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "notebook": str(self.notebook),
            "solution": str(self.solution),
            "status": self.status,
            "score": self.score,
            "total": self.total,
            "tasks": [t._asdict() for t in self.tasks],
            "cell_errors": list(self.cell_errors),
            "tampered": list(self.tampered),
            "seed": self.seed,
            "isolation": self.isolation,
        }

    def format_table(self) -> str:
        rows = [("task", "points", "passed", "message")]
        rows += [
            (str(t.task), _fmt_num(t.points), "✓" if t.passed else "✗", t.message)
            for t in self.tasks
        ]
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        lines = [f"grading {_display(self.notebook)} against {_display(self.solution)}"]
        lines += [f"{r[0]:>{w0}}  {r[1]:>{w1}}  {r[2]:^6}  {r[3]}" for r in rows]
        if self.tampered:
            lines.append("check cells changed in the notebook:")
            lines += [f"  {line}" for line in self.tampered]
        if self.cell_errors:
            lines.append("other cells that raised:")
            lines += [f"  {e}" for e in self.cell_errors]
        if self.status != "completed":
            lines.append(f"stopped: {self.status}")
        if self.seed is not None:
            lines.append(
                f"cases drawn with seed {self.seed} (--seed {self.seed} grades them again)"
            )
        if self.isolation != "sandbox":
            lines.append(
                "isolation: none - a self-check: the notebook ran without a sandbox, with the "
                "grader's user and files (see the README, 'Grading a class')"
            )
        lines.append(f"score: {_fmt_num(self.score)}/{_fmt_num(self.total)} points")
        return "\n".join(lines)


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else relative to the
    course's folder when it lies there (``solutions/NN_topic.ipynb``, not this machine's path)."""
    import course_lib

    resolved = Path(path).resolve()
    for base in (Path.cwd().resolve(), Path(course_lib.__file__).resolve().parent.parent):
        try:
            return str(resolved.relative_to(base))
        except ValueError:
            continue
    return str(path)


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def _fmt_num(x: float) -> str:
    return f"{_num(x):g}" if isinstance(_num(x), float) else str(_num(x))
