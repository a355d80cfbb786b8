"""No exercise task is answered by its lecture or by its own check's printed line.

For every unit, the solution's code runs (``_answers_probe.py``: in a child forked per unit from
one process that imported torch, no ranks) at a drawn grading seed (the worked examples a
lecture could print are the same at every seed), and every plain number an answer function
returns while its task's check cell runs is a reference answer. Each is written the ways a lecture
prints numbers (``1234567``, ``1,234,567``, ``0.9264``, ``92.64 %``, ``17,307.5``, 4-7 significant
digits) and searched, as a whole number, in the unit's lecture (every cell's source and stored
output) and in the solution's stored check lines (the exercise shows them as "expected once your
answer is right"). A task fires when all its searchable answers at a seed are found: units 01 and
02 grade the lecture's worked examples (7B and 70B shapes; 175B on 300B tokens) beside cases drawn
per grading, which no page prints, so copying the examples passes nothing. Small integers (below
1,000), round numbers (two significant digits, powers of two) and spellings with fewer than four
significant digits are too common to mean anything and are not searched.

Units where it still fires are listed in ``KNOWN`` (strict xfail): they are reported, to be fixed
in their own units; an entry that stops firing fails until it is removed.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _grading_seeds import FIXTURE_SEEDS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("_answers_probe.py")
UNITS = sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))

#: units whose lecture or check lines print a task's answer today (reported; fixed in the unit)
KNOWN: dict[str, str] = {}


def _sig_digits(text: str) -> int:
    digits = re.sub(r"[^0-9]", "", text.split("e")[0]).lstrip("0")
    return len(digits)


def _round(x: float) -> bool:
    """A round number (two significant digits or fewer, or a power of two): printed everywhere
    as a size or a setting, it answers nothing."""
    if x == 0 or any(abs(x - float(f"{x:.{k}g}")) <= 1e-9 * abs(x) for k in (1, 2)):
        return True
    n = abs(x)
    return float(n).is_integer() and int(n) & (int(n) - 1) == 0


def spellings(x: float) -> set[str]:
    """The ways a lecture could print ``x``, each with at least four significant digits."""
    out: set[str] = set()
    if _round(x):
        return out
    if float(x).is_integer():
        n = int(x)
        if abs(n) >= 1000:
            out |= {str(n), f"{n:,}"}
        return out
    for k in range(4, 8):
        s = f"{x:.{k}g}"
        if "e" not in s:
            out.add(s)
    for d in range(0, 5):
        for s in (f"{x:.{d}f}", f"{x:,.{d}f}"):
            if _sig_digits(s) >= 4:
                out.add(s)
    if 0 < abs(x) < 1:  # a share: also as a percentage
        for d in (1, 2):
            s = f"{100 * x:.{d}f}"
            if _sig_digits(s) >= 3:
                out |= {f"{s} %", f"{s}%"}
    return {s for s in out if _sig_digits(s) >= 3}


def _text(cell: dict) -> str:
    parts = ["".join(cell.get("source", []))]
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append("".join(out["text"]))
        for kind, value in out.get("data", {}).items():
            if kind.startswith("text/"):
                text = "".join(value) if isinstance(value, list) else str(value)
                parts.append(html.unescape(re.sub(r"<[^>]+>", " ", text)))
    return "\n".join(parts)


def haystacks(unit: str) -> dict[str, str]:
    """Where an answer must not appear: the lecture, and the solution's stored check lines."""
    lecture = json.loads((ROOT / "notebooks" / f"{unit}.ipynb").read_text(encoding="utf-8"))
    solution = json.loads((ROOT / "solutions" / f"{unit}.ipynb").read_text(encoding="utf-8"))
    checks = [
        _text({"outputs": c.get("outputs", [])})
        for c in solution["cells"]
        if any(t.startswith("task-") for t in c.get("metadata", {}).get("tags", []))
    ]
    return {
        "the lecture": "\n".join(_text(c) for c in lecture["cells"]),
        "a check's printed line": "\n".join(checks),
    }


@functools.cache
def _every_unit(seed: str) -> dict[str, dict | str]:
    """unit -> its answers at ``seed``, or why there are none: every solution probed in one
    process that imports torch once and runs each notebook in a child forked from it."""
    env = {**os.environ, "COURSE_GRADE_SEED": seed, "PYTHONDONTWRITEBYTECODE": "1"}
    paths = [str(ROOT / "solutions" / f"{unit}.ipynb") for unit in UNITS]
    probe = subprocess.Popen(
        [sys.executable, str(PROBE), *paths], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = probe.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(probe.pid, signal.SIGKILL)  # the probe and the child it forked
        stdout, stderr = probe.communicate()
    done = subprocess.CompletedProcess(probe.args, probe.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, dict | str] = {unit: f"not probed: {done.stderr[-2000:]}" for unit in UNITS}
    for line in done.stdout.splitlines():
        if line.startswith('{"notebook": '):
            reply = json.loads(line)
            unit = Path(reply["notebook"]).stem
            found[unit] = reply.get(
                "answers", f"exit status {reply.get('error')}; {done.stderr[-2000:]}"
            )
    return found


def answers(unit: str, seed: str) -> dict[str, list[float]]:
    found = _every_unit(seed)[unit]
    assert isinstance(found, dict), f"{unit}: the probe failed: {found}"
    return found


def printed_answers(unit: str) -> list[str]:
    """Every (seed, task, answer, spelling, where) found, for the tasks whose answers are all
    printed: a task is answered by what a learner can read only when every one of its answers
    that can be searched for is there (a task that also grades cases drawn per grading, which
    no lecture prints, cannot be passed by copying the worked example it shares with the
    lecture; its check may name that example)."""
    places = haystacks(unit)
    hits = []
    for seed in FIXTURE_SEEDS:  # one drawn seed: the worked examples are the same at every seed
        for task, values in answers(unit, seed).items():
            found, searched = [], 0
            for x in values:
                if not spellings(x):
                    continue
                searched += 1
                where_x = [
                    f"seed {seed}, task {task}: {x!r} printed as {s!r} in {where}"
                    for s in sorted(spellings(x))
                    for where, text in places.items()
                    if re.search(rf"(?<![\d.,]){re.escape(s)}(?![\d]|[.,]\d)", text)
                ]
                if where_x:
                    found.append(where_x)
            if searched and len(found) == searched:
                hits += [line for lines in found for line in lines]
    return hits


def test_spellings_are_what_a_lecture_prints():
    assert {"17,307.5", "17307.5", "17,308", "17308"} <= spellings(17307.5)
    assert spellings(158240) == {"158240", "158,240"}
    assert spellings(12) == set()  # too common to mean anything
    assert spellings(0.1) == spellings(0.09999999999999998) == set()  # round, however stored
    assert spellings(2**24) == spellings(25000) == set()  # a power of two, a round setting
    assert "92.63 %" in spellings(0.926320) and "0.9263" in spellings(0.926320)
    text = "goodput 0.9263 at 16K; 158,240 tokens; 1158240 is another number"
    found = [
        s
        for s in spellings(158240)
        if re.search(rf"(?<![\d.,]){re.escape(s)}(?![\d]|[.,]\d)", text)
    ]
    assert found == ["158,240"]


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param(u, marks=pytest.mark.xfail(reason=KNOWN[u], strict=True)) if u in KNOWN else u
        for u in UNITS
    ],
)
def test_no_task_is_answered_by_its_lecture_or_check_line(unit):
    hits = printed_answers(unit)
    assert not hits, f"{unit}: a task's answer is printed:\n" + "\n".join(hits[:20])
