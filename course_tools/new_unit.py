"""Start a unit: ``python -m course_tools.new_unit NN TOPIC "Title"`` (``make new-unit``).

Copies the required modules of ``course_lib/units/_template/`` (``REQUIRED_MODULES`` and
``__init__.py``; the optional ``cluster.py`` is copied by hand when a unit needs it) to
``course_lib/units/uNN_TOPIC/`` and an empty test folder ``tests/units/uNN_TOPIC/``, filling in
the number, topic and title. Refuses to overwrite.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from course_lib.units import REQUIRED_MODULES

ROOT = pathlib.Path(__file__).resolve().parents[1]


def new_unit(number: str, topic: str, title: str, *, root: pathlib.Path = ROOT) -> pathlib.Path:
    if not re.fullmatch(r"\d\d", number):
        raise ValueError(f"NN = {number!r}: expected two digits, e.g. 05")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", topic):
        raise ValueError(
            f"TOPIC = {topic!r}: expected lower_case_with_underscores, e.g. cpu_offload"
        )
    target = root / "course_lib" / "units" / f"u{number}_{topic}"
    if target.exists():
        raise FileExistsError(f"{target.relative_to(root)} exists already")
    target.mkdir(parents=True)
    template = root / "course_lib" / "units" / "_template"
    for name in ("__init__", *REQUIRED_MODULES):
        src = template / f"{name}.py"
        text = src.read_text().replace("NN_TOPIC", f"{number}_{topic}")
        text = text.replace("Unit NN", f"Unit {number}").replace("TITLE", title)
        (target / src.name).write_text(text)
    tests = root / "tests" / "units" / f"u{number}_{topic}"
    tests.mkdir(parents=True, exist_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("number", help="two digits, e.g. 05")
    parser.add_argument("topic", help="lower_case_with_underscores, e.g. cpu_offload")
    parser.add_argument("title", nargs="?", default=None, help='e.g. "CPU offload"')
    args = parser.parse_args(argv)
    try:
        path = new_unit(
            args.number, args.topic, args.title or args.topic.replace("_", " ").capitalize()
        )
    except (ValueError, FileExistsError) as exc:
        print(f"new-unit: {exc}", file=sys.stderr)
        return 2
    print(
        f"created {path.relative_to(ROOT)}/ (run.py, plots.py, widgets.py, checks.py) and "
        f"tests/units/{path.name}/; add notebooks/{args.number}_{args.topic}.ipynb and "
        f"solutions/{args.number}_{args.topic}.ipynb"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
