"""With no answer written, each known way to fake a grade scores 0 (units 05, 10, 12 and 14: a
unit with no ranks, two whose checks launch ranks, and the planner).

Each cheat is one extra cell in the untouched exercise. The clean process is run directly for
the cheats that act on the grade's process (rebinding ``unit``, patching the check functions at
top level or from a decorator that runs when the cell is carried, switching off the profiler or
calling the course's answer from a thread); the input transformer acts on the learner's kernel,
so it goes through the whole grade command (units 05 and 12).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from course_lib.grading.clean import clean_verdict, jobs_for
from course_lib.grading.grader import grade_notebook
from course_lib.grading.isolate import carried_statements
from course_lib.grading.notebooks import read_notebook, solution_tasks
from course_lib.grading.zygote import Zygote

REPO = Path(__file__).resolve().parents[2]

# unit: (stem, first task, (task, learner function, the course's own answer it may not use))
UNITS = {
    "05": (
        "05_cpu_offload",
        ("choose_offload", "course_lib.measure.estimate.offload:offload_split", 2),
    ),
    "10": (
        "10_zero_fsdp",
        ("smallest_stage", "course_lib.units.u10_zero_fsdp.run_scale:smallest_stage", 4),
    ),
    "12": (
        "12_pipeline_parallelism",
        ("v_holder", "course_lib.units.u12_pipeline_parallelism.checks:_v_walk", 3),
    ),
    "14": ("14_planning_a_run", ("problems", "course_lib.plan.memory:check_layout", 2)),
}
FAST = {"05"}  # the other units' runs are in the slow lane: the same code path, more processes


def _lanes(keys):
    return [k if k in FAST else pytest.param(k, marks=pytest.mark.slow) for k in keys]


def _cheats(unit: str) -> dict[str, str]:
    module = f"course_lib.units.u{UNITS[unit][0]}"
    return {
        "rebind unit": (
            "class _Checks:\n"
            "    def __getattr__(self, name):\n"
            "        return lambda *a, **k: print('✓ task 1: faked')\n"
            "class _Unit:\n"
            "    checks = _Checks()\n"
            "unit = _Unit()\n"
        ),
        "patch the checks": (
            f"import {module}.checks as _c\n"
            "for _n in dir(_c):\n"
            "    if _n.startswith('check_'):\n"
            "        setattr(_c, _n, lambda *a, _n=_n, **k: print('✓ faked'))\n"
        ),
        "patch from a decorator": (
            "def _patch(f):\n"
            f"    import {module}.checks as _c\n"
            "    for _n in dir(_c):\n"
            "        if _n.startswith('check_'):\n"
            "            setattr(_c, _n, lambda *a, **k: print('✓ faked'))\n"
            "    return f\n"
            "@_patch\n"
            "def _helper():\n"
            "    pass\n"
        ),
    }


def _learner(unit: str, extra: str, tmp_path: Path) -> tuple[Path, dict]:
    stem = UNITS[unit][0]
    nb = nbformat.read(REPO / "exercises" / f"{stem}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(extra))
    path = tmp_path / f"{stem}.ipynb"
    nbformat.write(nb, path)
    return path, nb


def _trick(unit: str, trick: str) -> str:
    name, reference, _ = UNITS[unit][1]
    module, qualname = reference.split(":")
    body = (
        "    import sys\n    sys.setprofile(None)\n    return _answer(*args, **kwargs)\n"
        if trick == "sys.setprofile(None)"
        else "    import threading\n    box = []\n"
        "    t = threading.Thread(target=lambda: box.append(_answer(*args, **kwargs)))\n"
        "    t.start()\n    t.join()\n    return box[0] if box else None\n"
    )
    return f"from {module} import {qualname} as _answer\n\ndef {name}(*args, **kwargs):\n{body}"


TRICKS = ("sys.setprofile(None)", "a thread")


def _bound(stmt: ast.stmt) -> list[str]:
    """The names a carried class or import binds."""
    if isinstance(stmt, ast.ClassDef):
        return [stmt.name]
    return [(a.asname or a.name).split(".")[0] for a in getattr(stmt, "names", [])]


SPLIT_ANSWER = "a right answer split over cells"
# unit 05's task 2: the answer's table as a literal constant in one cell, a helper in another:
# both travel
_SPLIT_HELPERS = (
    'DEVICE_BYTES = {"none": 2 + 2 + 4 + 4 + 4, "optimizer": 2 + 2, "optimizer+grads": 2, "all": 0}\n'
    "\n\ndef _fits(per_param, n, activations, budget):\n"
    "    return per_param * n + activations <= budget\n"
    "\n\ndef choose_offload(n_params, budget_bytes, activation_bytes):\n"
    "    for level, per_param in DEVICE_BYTES.items():\n"
    "        if _fits(per_param, n_params, activation_bytes, budget_bytes):\n"
    "            return level\n"
    "    return None\n"
)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """``verdicts(unit)``: every cheat of the unit run in one clean-process batch (one zygote
    per unit: each cheat is its own forked process), by cheat name."""
    done: dict[str, dict] = {}

    def run(unit: str) -> dict:
        if unit not in done:
            tmp = tmp_path_factory.mktemp(f"u{unit}")
            stem = UNITS[unit][0]
            solution = read_notebook(REPO / "solutions" / f"{stem}.ipynb")
            expected = solution_tasks(solution, stem)
            first, trick_task = min(expected), UNITS[unit][1][2]
            cases = {name: (src, first) for name, src in _cheats(unit).items()}
            cases.update({t: (_trick(unit, t), trick_task) for t in TRICKS})
            if unit == "05":  # the honest answer beside the cheats, in the same zygote
                cases[SPLIT_ANSWER] = (_SPLIT_HELPERS, 2)
            jobs = []
            for source, task in cases.values():
                _, nb = _learner(unit, source, tmp)
                jobs.append(jobs_for(f"course_lib.units.u{stem}", solution, nb, expected)[task])
            with Zygote(jobs[0].unit, cwd=tmp, seed=3) as zygote:
                results = zygote.run(jobs, timeout=240)
            done[unit] = {
                name: clean_verdict(result, expected[job.task])
                for name, job, result in zip(cases, jobs, results)
            }
        return done[unit]

    return run


@pytest.mark.parametrize("cheat", ["rebind unit", "patch the checks", "patch from a decorator"])
@pytest.mark.parametrize("unit", _lanes(UNITS))
def test_a_cell_that_fakes_the_checks_scores_zero(unit, cheat, verdicts):
    result = verdicts(unit)[cheat]
    assert not result.passed, result
    if (
        cheat == "patch from a decorator"
    ):  # ran when the definition was carried: caught as tampering
        assert "tampered: the course's code changed" in result.message
        assert result.tampered == "course_lib changed during the check"
    else:  # never carried: the untouched stub is what the check sees
        assert "not implemented yet" in result.message
        # and so for every task: what travels of this cell is definitions that do nothing until
        # called (the rebinding and the patching loop stay behind), so each task's clean process
        # is the untouched exercise's, which scores 0 on every task (tests/test_course.py)
        carried = carried_statements(ast.parse(_cheats(unit)[cheat]), set())
        assert all(isinstance(s, (ast.ClassDef, ast.Import)) for s in carried), carried
        assert not {"unit", "checks"} & {n for s in carried for n in _bound(s)}


@pytest.mark.parametrize("trick", TRICKS)
@pytest.mark.parametrize("unit", _lanes(UNITS))
def test_the_courses_answer_behind_a_trick_is_refused(unit, trick, verdicts):
    result = verdicts(unit)[trick]
    assert not result.passed
    assert "uses the course's own" in result.message, result.message


@pytest.mark.slow
# the transformer acts on the learner's kernel, before any check runs: a unit with no ranks and
# 12, whose checks launch ranks (the case the issue found), cover the two kinds of check cells
@pytest.mark.parametrize("unit", ["05", "12"])
def test_an_input_transformer_that_rewrites_check_cells_scores_zero(unit, tmp_path):
    transformer = (
        "def _rewrite(lines):\n"
        "    return ['print(\"✓ faked\")\\n' if 'unit.checks.' in l else l for l in lines]\n"
        "get_ipython().input_transformers_post.append(_rewrite)\n"
    )
    path, _ = _learner(unit, transformer, tmp_path)
    # the transformer goes first, so it would see every check cell of the kernel run
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(1, nb.cells.pop())
    nbformat.write(nb, path)
    report = grade_notebook(path, seed=5)
    assert report.score == 0, report.format_table()
    assert all("faked" not in t.message for t in report.tasks)


def test_a_right_answer_split_over_cells_passes(verdicts):
    verdict = verdicts("05")[SPLIT_ANSWER]
    assert verdict.passed, verdict.message
