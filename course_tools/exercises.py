"""Build ``exercises/`` from ``solutions/`` and detect drift (``make exercises``).

    python -m course_tools.exercises build [--solutions solutions --out exercises]
    python -m course_tools.exercises check [--solutions solutions --out exercises]

One notebook's transformation (what an exercise is made of) lives with the grader, in
:mod:`course_lib.grading.exercises`, because a learner's ``python -m course_lib.grading.exercises
reset NN`` writes one exercise back the same way; this module builds and checks the folder.
Every solution is validated before anything is written; a malformed one raises
:class:`~course_lib.grading.notebooks.ExerciseError` naming the file, the cell index and the line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from course_lib.grading.exercises import make_exercise
from course_lib.grading.notebooks import ExerciseError, read_notebook, render_notebook, unit_names

__all__ = ["build_exercises", "check_exercises", "main"]


def _expected_files(solutions_dir: Path, out_dir: Path) -> dict[Path, str]:
    if not solutions_dir.is_dir():
        raise ExerciseError(f"{solutions_dir}: no such solutions directory")
    expected: dict[Path, str] = {}
    for unit in unit_names(solutions_dir):
        path = solutions_dir / f"{unit}.ipynb"
        nb = read_notebook(path)
        expected[out_dir / path.name] = render_notebook(
            make_exercise(nb, path, solution_rel=f"solutions/{path.name}")
        )
    return expected


def _is_generated(path: Path) -> bool:
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        return isinstance(meta.get("course"), dict) and "generated_from" in meta["course"]
    except (OSError, ValueError, AttributeError):
        return False


def build_exercises(
    solutions_dir: Path | str = "solutions", out_dir: Path | str = "exercises"
) -> list[Path]:
    """Write ``out_dir/NN_topic.ipynb`` for every ``solutions_dir/NN_topic.ipynb``; return the paths.

    Files are only rewritten when their bytes change. Exercise notebooks that this generator wrote
    earlier (metadata ``course.generated_from``) whose solution no longer exists are deleted; other
    files in ``out_dir`` are left alone (``check_exercises`` reports them). Everything is validated
    before anything is written.
    """
    solutions_dir, out_dir = Path(solutions_dir), Path(out_dir)
    expected = _expected_files(solutions_dir, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, text in expected.items():
        data = text.encode("utf-8")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
    for path in sorted(out_dir.glob("*.ipynb")):
        if path not in expected and _is_generated(path):
            path.unlink()
    return sorted(expected)


def check_exercises(
    solutions_dir: Path | str = "solutions", out_dir: Path | str = "exercises"
) -> list[str]:
    """Problems (one line each) if ``out_dir`` differs from what :func:`build_exercises` writes; [] if in sync."""
    solutions_dir, out_dir = Path(solutions_dir), Path(out_dir)
    expected = _expected_files(solutions_dir, out_dir)
    problems = []
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"missing: {path} (run make exercises)")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(
                f"stale: {path} differs from what make exercises writes from {solutions_dir / path.name} "
                "(edited by hand, or the solution changed); run make exercises"
            )
    if out_dir.is_dir():
        for path in sorted(out_dir.glob("*.ipynb")):
            if path not in expected:
                problems.append(
                    f"extra: {path} has no solution {solutions_dir / path.name}; delete it"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_tools.exercises",
        description="Generate exercises/ from solutions/ (build) or check that they are in sync "
        "(check). A learner starts one exercise over with "
        "python -m course_lib.grading.exercises reset NN.",
    )
    parser.add_argument("command", choices=["build", "check"])
    parser.add_argument(
        "--solutions", default="solutions", help="solutions directory (default: solutions)"
    )
    parser.add_argument(
        "--out", default="exercises", help="exercises directory (default: exercises)"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for path in build_exercises(args.solutions, args.out):
                print(path)
            return 0
        problems = check_exercises(args.solutions, args.out)
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(
            f"{len(problems)} problem(s): {args.out}/ is out of sync with {args.solutions}/",
            file=sys.stderr,
        )
        return 1
    print(f"{args.out}/ is in sync with {args.solutions}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
