"""``python -m course_lib.grade NOTEBOOK.ipynb`` (or a folder of them): score an exercise
notebook per task, or a whole class into a CSV.

See :mod:`course_lib.grading.grader` for how the solution is found and how outputs are compared,
and :mod:`course_lib.grading.batch` for a folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from course_lib.grading.grader import DEFAULT_TIMEOUT, GradingInputError, grade_notebook

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grade",
        description="Score an exercise notebook per task against its solution's expected outputs; "
        "given a folder, grade every notebook under it (a whole class) into a CSV.",
    )
    parser.add_argument("notebook", help="the exercise notebook to grade (.ipynb), or a folder")
    parser.add_argument(
        "--solutions",
        default=None,
        help="solutions directory (default: solutions/ of this course_lib's repository)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per cell (default {DEFAULT_TIMEOUT})",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--seed", type=int, default=None, help="the seed the checks draw their cases from"
    )
    parser.add_argument(
        "--learner", default=None, help="the learner's id (the default seed is derived from it)"
    )
    parser.add_argument("--csv", default=None, help="a folder's grades: the CSV file to write")
    parser.add_argument("--jobs", type=int, default=2, help="a folder: notebooks graded at once")
    parser.add_argument("--feedback", default=None, help="a folder: where feedback files go")
    parser.add_argument(
        "--isolation",
        default="auto",
        help="where the learner's code runs: auto (a sandbox where this host can make one, else "
        "none, said in the report), required (the sandbox or refuse), none (a plain process: a "
        "self-check)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from course_lib.grading.sandbox import ISOLATION_CHOICES

    if args.isolation not in ISOLATION_CHOICES:
        print(
            f"grade: error: --isolation {args.isolation!r}: expected one of "
            f"{', '.join(ISOLATION_CHOICES)}",
            file=sys.stderr,
        )
        return 2
    if Path(args.notebook).is_dir() or args.csv is not None:
        return _main_folder(args)
    try:
        report = grade_notebook(
            args.notebook,
            solutions_dir=args.solutions,
            timeout=args.timeout,
            seed=args.seed,
            learner=args.learner,
            isolation=args.isolation,
        )
    except GradingInputError as exc:
        print(f"grade: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, ensure_ascii=False))
    else:
        print(report.format_table())
    return 0 if report.all_passed else 1


def _main_folder(args: argparse.Namespace) -> int:
    """``python -m course_lib.grade FOLDER --csv grades.csv``: exit 0 when anything was graded."""
    from course_lib.grading.batch import CourseChanged, grade_folder, summary

    csv_path = args.csv if args.csv is not None else "grades.csv"
    try:
        done, skipped = grade_folder(
            args.notebook,
            csv_path,
            jobs=args.jobs,
            solutions_dir=args.solutions,
            timeout=args.timeout,
            feedback=args.feedback,
            isolation=args.isolation,
        )
    except (GradingInputError, ValueError, TypeError) as exc:
        print(f"grade: error: {exc}", file=sys.stderr)
        return 2
    except CourseChanged as exc:
        print(f"grade: error: {exc}", file=sys.stderr)
        print(f"wrote {csv_path} (not to be trusted)", file=sys.stderr)
        return 3
    print(summary(done, skipped))
    if not done:
        print(f"grade: error: nothing to grade under {args.notebook}", file=sys.stderr)
        return 2
    print(f"wrote {csv_path}")
    return 0


def _exit_now(code: int) -> None:
    """Leave without tearing the interpreter down: the report is written and flushed, the exit
    functions (the stubs' temporary folder, multiprocessing's helpers) run, and the ~0.7 s
    Python spends unloading torch, pandas and their modules one by one is skipped."""
    import atexit
    import os

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
