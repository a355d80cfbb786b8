"""Repository-level checks: packaging, the exercise pipeline over the real units, and JupyterLab.

The library tests live beside this file in folders mirroring course_lib/. These tests look at
the course as a learner and an instructor meet it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# --- packaging -------------------------------------------------------------------------------


def test_pyproject_is_the_single_source_of_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[; ]", d)[0].lower() for d in project["dependencies"]}
    assert {"torch", "matplotlib", "ipywidgets", "pandas", "cloudpickle", "psutil", "tqdm"} <= names
    extras = {
        k: {re.split(r"[<>=\[; ]", d)[0].lower() for d in v}
        for k, v in project["optional-dependencies"].items()
    }
    # A learner's install (`make lab`) grades exercises, so it has nbformat and nbclient; the test,
    # lint and type tools come only with a maintainer's (`make test`).
    assert {"jupyterlab", "nbformat", "nbclient"} <= extras["lab"]
    assert {
        "pytest",
        "nbval",
        "ruff",
        "mypy",
        "pytest-timeout",
        "pytest-xdist",
        "playwright",
    } <= extras["dev"]
    assert not {"pytest", "nbval", "ruff", "mypy", "playwright"} & (extras["lab"] | extras["units"])
    env = (ROOT / "environment.yml").read_text()
    assert "python=3.11" in env and "-c constraints.txt" in env and "-e .[lab,dev,units]" in env
    # environment.yml must not list packages of its own: they would drift from pyproject.toml.
    pip_lines = [
        ln.strip() for ln in env.split("pip:")[1].splitlines() if ln.strip().startswith("-")
    ]
    assert pip_lines == ["- -c constraints.txt", "- -e .[lab,dev,units]"], pip_lines


def test_torch_is_pinned_by_the_constraints_file():
    pins = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    assert "torch==2.13.0" in pins
    makefile = (ROOT / "Makefile").read_text()
    # Every pip install in the Makefile goes through a constraints file that pins torch: the
    # course's, or the floor's (`make test-torch-floor` writes torch==$(TORCH_FLOOR) into its own).
    for line in makefile.splitlines():
        if "pip install" in line and "--upgrade pip" not in line:
            assert re.search(r"-c (constraints\.txt|\$\(FLOOR_VENV\)/constraints\.txt)", line), line
    assert 'echo "torch==$(TORCH_FLOOR)" > $(FLOOR_VENV)/constraints.txt' in makefile
    # The floor the Makefile tests is the one pyproject.toml declares.
    floor = re.search(r"^TORCH_FLOOR \?= (\S+)", makefile, re.M).group(1)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={floor.rsplit('.', 1)[0]}" in deps, (floor, deps)


def test_every_unit_has_lecture_solution_and_exercise():
    lectures = {p.name for p in LECTURES}
    solutions = {p.name for p in SOLUTIONS}
    exercises = {p.name for p in EXERCISES}
    assert "00_start_here.ipynb" in lectures
    assert solutions == exercises, "exercises/ must hold exactly one generated file per solution"
    assert solutions <= lectures, f"solutions without a lecture: {sorted(solutions - lectures)}"


def test_lecture_notebooks_are_committed_executed():
    for path in LECTURES:
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert code, f"{path.name} has no code"
        unexecuted = [i for i, c in enumerate(code) if c.get("execution_count") is None]
        assert not unexecuted, (
            f"{path.name}: code cells {unexecuted} were not executed; run `make notebooks`"
        )
        assert any(c.get("outputs") for c in code), f"{path.name}: no stored outputs"
        errors = [c for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: stored error outputs"


def test_every_stored_explorer_says_that_running_the_cell_connects_it():
    """A stored Explore widget is a copy: its Run button does nothing until the cell runs. Each
    lecture that stores one also stores the note that says so (shown on disconnected views)."""
    with_explorer = 0
    for path in LECTURES:
        meta = json.loads(path.read_text())["metadata"].get("widgets", {})
        state = meta.get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
        runs = [m for m in state.values() if m.get("model_name") == "ButtonModel"]
        if not runs:
            continue
        with_explorer += 1
        notes = [m for m in state.values() if "course-stored-note" in json.dumps(m)]
        assert len(notes) == len(runs), f"{path.name}: {len(runs)} Run buttons, {len(notes)} notes"
    assert with_explorer >= 18, with_explorer  # units 01-18


def test_stored_outputs_show_no_install_paths():
    """A learner reads the stored outputs on a web page: none may carry the machine that made
    them (the repository's absolute path, another checkout's, a home or temporary folder, a
    site-packages path: an optional library's import log, a warning's file name, a traceback)."""
    marks = re.compile(
        "|".join(
            [re.escape(str(ROOT))]
            + [
                r"site-packages/",
                r"/\.venv/",
                r"/home/",
                r"/root/",
                r"/Users/",
                r"/work/",
                r"/tmp/",
            ]
        )
    )
    found = []
    for path in LECTURES + SOLUTIONS:
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", "")) + "".join(
                    "".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")
                )
                text += "\n".join(out.get("traceback", []))
                found += [f"{path.name} cell {i}: {m}" for m in marks.findall(text)]
    assert found == [], found


# --- exercise pipeline over the real units ---------------------------------------------------


def test_exercises_are_in_sync_with_solutions():
    from course_tools.exercises import check_exercises

    problems = check_exercises(ROOT / "solutions", ROOT / "exercises")
    assert problems == [], "run `make exercises`: " + "; ".join(problems)


def _joined(output: dict) -> dict:
    """An output with its multi-line strings joined (the JSON may store them as lists of lines)."""
    return {k: "".join(v) if isinstance(v, list) and k == "text" else v for k, v in output.items()}


def test_exercise_check_cells_show_targets_not_passes():
    """An unfilled exercise never looks run or passed: no execution count anywhere, and each check
    cell shows "expected once your answer is right: ✓ ..." while the solution's own output (what
    nbval and the grader compare with) sits in its metadata."""
    from course_lib.grading.exercises import TARGET_LABEL, cell_tags, expected_outputs

    checked = 0
    for path in EXERCISES:
        solution = {
            c["id"]: c for c in json.loads((ROOT / "solutions" / path.name).read_text())["cells"]
        }
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            where = f"{path.name} cell {cell['id']}"
            assert cell["execution_count"] is None, f"{where} shows an execution count"
            if "NBVAL_CHECK_OUTPUT" not in cell_tags(cell):
                assert cell["outputs"] == [], f"{where} keeps an output"
                continue
            (shown,) = cell["outputs"]
            plain = "".join(shown["data"]["text/plain"])
            assert shown["output_type"] == "display_data" and plain.startswith(
                TARGET_LABEL + " ✓ task"
            ), where
            assert not any(line.lstrip().startswith("✓") for line in plain.splitlines()), where
            stored = solution[cell["id"]]["outputs"]
            assert [_joined(o) for o in expected_outputs(cell)] == [_joined(o) for o in stored], (
                where
            )
            checked += 1
    assert checked >= len(EXERCISES), checked


@pytest.mark.timeout(600)
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_scores_full_marks_and_exercise_scores_zero(solution):
    from course_lib.grading.grader import grade_notebook

    # The only run of each solution in `make test` (nbval runs the lectures): the grader executes it
    # in a fresh kernel and compares every check cell with the solution's stored output, as nbval
    # would, and no other cell may raise.
    zombies = set(_zombie_children())
    report = grade_notebook(solution, timeout=300)  # in the sandbox where this host has one
    assert report.tasks, f"{solution.name} has no graded task"
    assert report.status == "completed" and not report.cell_errors, report
    assert not report.tampered, report  # the course's own check cells, untouched
    assert report.score == report.total, report
    assert all(t.passed for t in report.tasks), report
    # what the kernel started (a forkserver that outlived it) is not left here as a zombie
    left = set(_zombie_children()) - zombies
    assert not left, f"the grading left zombie processes in the grader: {sorted(left)}"
    # An untouched exercise fails every check: proof that each check can fail. Its cells
    # would only define stubs, so its definitions go straight to the clean processes.
    _untouched_exercise_fails_every_check(solution)


def _zombie_children() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]


def _untouched_exercise_fails_every_check(solution: Path) -> None:
    from course_lib.grading.grader import grade_notebook

    report = grade_notebook(ROOT / "exercises" / solution.name, timeout=300)
    assert report.tasks and not any(t.passed or t.tampered for t in report.tasks), report


def test_grade_cli_bad_input_is_one_line_exit_2(tmp_path):
    not_json = tmp_path / "notes.ipynb"
    not_json.write_text("this is not a notebook")
    for arg in [str(tmp_path / "missing.ipynb"), str(not_json)]:
        proc = subprocess.run(
            [sys.executable, "-m", "course_lib.grade", arg],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert proc.returncode == 2, proc
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert Path(arg).name in lines[0]


# --- JupyterLab ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_jupyterlab_serves_unit_00(tmp_path):
    """What `make lab` starts: a server on which notebooks/00_start_here.ipynb opens."""
    jupyter = Path(sys.executable).parent / "jupyter"
    if not jupyter.exists():
        jupyter = shutil.which("jupyter")
    token = "course-test-token"
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
    )
    cmd = [
        str(jupyter),
        "lab",
        "--no-browser",
        "--ServerApp.port=0",
        f"--IdentityProvider.token={token}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.root_dir=.",
        "--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            m = re.search(r"(http://127\.0\.0\.1:\d+)/lab", log.read_text())
            url = m.group(1) if m else None
            time.sleep(0.5)
        assert url, "JupyterLab printed no URL in 90 s:\n" + log.read_text()
        headers = {"Authorization": f"token {token}"}
        req = urllib.request.Request(
            f"{url}/api/contents/notebooks/00_start_here.ipynb", headers=headers
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            model = json.load(resp)
        assert model["type"] == "notebook" and model["content"]["cells"]
        # The learner also reaches the exercises from the same server.
        req = urllib.request.Request(f"{url}/api/contents/exercises", headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            names = {item["name"] for item in json.load(resp)["content"]}
        assert "00_start_here.ipynb" in names
        # /lab (what the printed URL opens) serves JupyterLab with unit 00 as its default page.
        req = urllib.request.Request(f"{url}/lab", headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200 and b"JupyterLab" in resp.read()
        assert "/lab/tree/notebooks/00_start_here.ipynb" in " ".join(cmd)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
