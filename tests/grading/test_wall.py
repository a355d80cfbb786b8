"""The wall between a student's notebook and its grade (course_lib.grading.sandbox, .judge).

One batch grades, on a copy of the course, a class in which every attack of
tests/grading/_attacks.py is a student (no answer written, each attack in its own notebook, for
units 00, 08 (its checks launch ranks) and 14; 00, 08 and 10 for switching the traps off; 00, 05
and 14 for the two whose cells act in the kernel alone, where a unit whose checks launch ranks
adds time and no path), beside honest students: the solutions and the untouched
exercises of units 00, 08 and 14. Each test below is one attack class; each asserts that the
attack scores 0 on every task of at least three units, that the honest students keep their true
scores, untampered, and that the course's files are byte-identical afterwards; a regrade of the
honest students, and of the attackers who aimed at them, gives the same scores. Every one of these
attacks scored marks, or changed another student's, before the sandbox (main at 06d6689).
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _attacks import ATTACKS, write_attack

from course_lib.grading.sandbox import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
UNITS = ("00_start_here", "08_collectives", "14_planning_a_run")  # the honest students' units
#: the attacks whose cells act in the learner's kernel only (on the grader's processes and files),
#: the same cells in every unit; a check carries of them only imports, constants and functions
#: it never calls
KERNEL_ONLY = ("forge_kernel", "course_writes")
#: the units each attack is tried on (the course's answer an attack calls exists in these)
ATTACK_UNITS = {
    attack: ("00_start_here", "08_collectives", "10_zero_fsdp")
    if attack == "traps_off"
    else ("00_start_here", "05_cpu_offload", "14_planning_a_run")
    if attack in KERNEL_ONLY
    else ("00_start_here", "08_collectives", "14_planning_a_run")
    for attack in ATTACKS
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        unavailable_reason() is not None, reason=f"no sandbox: {unavailable_reason()}"
    ),
    pytest.mark.timeout(900),
]


def _fingerprint(root: Path) -> dict[str, str]:
    """Every file of the course copy by content (bytecode caches aside), and the root's names."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and "grades" not in path.parts:
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(the CSV rows by (learner, unit, task), the course copy's fingerprints before and after,
    the command's output): one batch of the whole class, graded twice (a regrade)."""
    base = tmp_path_factory.mktemp("wall")
    course = base / "course"
    for name in ("course_lib", "solutions", "exercises"):
        shutil.copytree(ROOT / name, course / name, ignore=shutil.ignore_patterns("backups"))
    subs = base / "submissions"
    for attack, units in ATTACK_UNITS.items():
        for unit in units:
            write_attack(
                course / "exercises" / f"{unit}.ipynb",
                course / "solutions" / f"{unit}.ipynb",
                attack,
                subs / f"{attack}-{unit[:2]}" / f"{unit}.ipynb",
            )
    for unit in UNITS:  # honest students, graded in the same batch after the attacks
        for kind, folder in (("solved", "solutions"), ("blank", "exercises")):
            (subs / f"zz-{kind}-{unit[:2]}").mkdir(parents=True)
            shutil.copy(course / folder / f"{unit}.ipynb", subs / f"zz-{kind}-{unit[:2]}")
    # the regrade: the students an attack on later notebooks would hit, and those attackers
    again = base / "again"
    for folder in subs.iterdir():
        if folder.name.startswith(("zz-", "course_writes-")):
            shutil.copytree(folder, again / folder.name)
    before = _fingerprint(course)
    env = {**os.environ, "PYTHONPATH": str(course)}
    runs = []
    for attempt, folder in enumerate((subs, again)):
        out = base / "grades" / f"run{attempt}.csv"
        out.parent.mkdir(exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "course_lib.grade", str(folder), "--csv", str(out),
             "--jobs", "2", "--isolation", "required", "--timeout", "120"],
            cwd=course, env=env, capture_output=True, text=True, timeout=840,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with out.open(newline="") as f:
            rows = {(r["learner"], r["unit"], r["task"]): r for r in csv.DictReader(f)}
        runs.append((rows, proc.stdout))
    return runs, before, _fingerprint(course)


def _rows(rows: dict, learner: str) -> list[dict]:
    found = [r for (who, _, _), r in rows.items() if who == learner]
    assert found, f"no CSV row for {learner}"
    return found


def _assert_attack_scores_zero(graded, attack: str) -> None:
    (rows, _), (again, _) = graded[0]
    for unit in ATTACK_UNITS[attack]:
        learner = f"{attack}-{unit[:2]}"
        for table in (rows, again) if any(k[0] == learner for k in again) else (rows,):
            for row in _rows(table, learner):
                assert row["passed"] == "False", (attack, unit, row)


def _assert_honest_students_and_course_intact(graded) -> None:
    runs, before, after = graded
    assert after == before, sorted(set(after.items()) ^ set(before.items()))[:5]
    for rows, _ in runs:
        for unit in UNITS:
            solved = _rows(rows, f"zz-solved-{unit[:2]}")
            assert all(r["passed"] == "True" and not r["tampered"] for r in solved), solved
            blank = _rows(rows, f"zz-blank-{unit[:2]}")
            assert all(r["passed"] == "False" and not r["tampered"] for r in blank), blank
    # a regrade gives the same scores
    first, second = runs[0][0], runs[1][0]
    assert second and all(first[k]["passed"] == r["passed"] for k, r in second.items())


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_scores_zero_and_reaches_no_one_else(graded, attack):
    _assert_attack_scores_zero(graded, attack)
    _assert_honest_students_and_course_intact(graded)


def test_every_row_says_the_sandbox_graded_it(graded):
    runs, _, _ = graded
    for rows, _ in runs:
        assert rows and all(r["isolation"] == "sandbox" for r in rows.values())
