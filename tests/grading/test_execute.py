"""Executing notebooks in place: deterministic stored outputs, cwd, errors leave the file alone."""

from __future__ import annotations

import shutil
import subprocess
import sys

import nbformat
import pytest

from course_tools.execute import ExecuteError, execute_notebook, main


def test_reexecuting_the_fixture_reproduces_its_bytes(solution, tmp_path):
    """The committed fixture was written by this command: running it again changes nothing."""
    copy = tmp_path / solution.name
    nb = nbformat.read(solution, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    cell.metadata["execution"] = {
        "iopub.status.busy": "2026-01-01T00:00:00"
    }  # stale timing metadata
    nbformat.write(nb, copy)
    execute_notebook(copy, timeout=60)
    again, stored = nbformat.read(copy, as_version=4), nbformat.read(solution, as_version=4)
    # the kernel's full language_info is stored, as JupyterLab writes it: the same but for the
    # Python version of the machine that ran it
    assert again.metadata.language_info.pop("version") and stored.metadata.language_info.pop(
        "version"
    )
    assert again.metadata.kernelspec.display_name == "Python 3 (ipykernel)"
    assert nbformat.writes(again) == nbformat.writes(stored)


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbformat.write(nb, path)
    return path.read_bytes()


def test_cli_uses_the_notebook_directory_and_keeps_failed_notebooks(tmp_path, capsys):
    (tmp_path / "data.txt").write_text("relative path works", encoding="utf-8")
    good = tmp_path / "good.ipynb"
    _notebook(good, "print(open('data.txt').read())")
    bad = tmp_path / "bad.ipynb"
    bad_bytes = _notebook(bad, "x = 1", "1 / 0")
    assert main([str(bad), str(good), "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: cell index 1 raised ZeroDivisionError: division by zero" in err
    assert bad.read_bytes() == bad_bytes  # a failed notebook is not overwritten
    cell = nbformat.read(good, as_version=4).cells[0]
    assert cell.execution_count == 1
    # one print may arrive as several stream messages; the notebook keeps them as they came
    assert {o["output_type"] for o in cell.outputs} == {"stream"}
    assert "".join(o["text"] for o in cell.outputs) == "relative path works\n"
    assert "execution" not in cell.metadata


def test_timeout_and_missing_files(tmp_path):
    slow = tmp_path / "slow.ipynb"
    _notebook(slow, "import time\ntime.sleep(60)")
    with pytest.raises(ExecuteError, match=r"slow\.ipynb: cell index 0 timed out after 1 s"):
        execute_notebook(slow, timeout=1)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got 0"):
        execute_notebook(slow, timeout=0)
    done = subprocess.run(
        [sys.executable, "-m", "course_tools.execute", str(tmp_path / "absent.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2
        and "no such notebook file" in done.stderr
        and "Traceback" not in done.stderr
    )


def _variant(source, dest, sources):
    """A copy of notebook ``source`` at ``dest`` with cell sources replaced by cell id."""
    nb = nbformat.read(source, as_version=4)
    for cell in nb.cells:
        cell.source = sources.get(cell.id, cell.source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


def test_exercise_and_solution_under_nbval(exercise, solution, tmp_path):
    """nbval (lax) passes the solution and fails it when a check prints ✗ or a cell tagged
    NBVAL_CHECK_OUTPUT prints something else than its stored output; it fails every check
    cell of the untouched exercise, passes a filled-in one by comparing with the solution's output
    (not the "expected once ..." text the cell shows), and fails a check cell whose output differs."""
    pytest.importorskip("nbval")
    shutil.copy(solution, tmp_path / "solution.ipynb")
    wrong = "def double(x):\n    return 3 * x"
    broken = _variant(solution, tmp_path / "broken" / "solution.ipynb", {"fixture-3": wrong})
    answers = {
        "fixture-3": "def double(x):\n    return 2 * x",
        "fixture-5": "total = 45\ntotal",
        "fixture-7": "def mean(xs):\n    return sum(xs) / len(xs)",
    }
    # a deterministic cell (metadata tag NBVAL_CHECK_OUTPUT, which nbval itself only knows as
    # "nbval-check-output") whose stored output went stale: compared, so it fails
    stale = _variant(solution, tmp_path / "stale" / "solution.ipynb", {})
    nb = nbformat.read(stale, as_version=4)
    next(c for c in nb.cells if c.id == "fixture-9").outputs[0]["text"] = "deterministic: 41\n"
    nbformat.write(nb, stale)
    filled = _variant(exercise, tmp_path / "filled" / "exercise.ipynb", answers)
    chatty = _variant(
        exercise,
        tmp_path / "chatty" / "exercise.ipynb",
        {**answers, "fixture-6": 'print("hi")\ncheck_equal(2, "total", total, 45)'},
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--nbval-lax",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "course_tools.nbval_targets",
        "-o",
        "addopts=",
        "--rootdir",
        str(tmp_path),
        str(tmp_path / "solution.ipynb"),
        str(broken),
        str(stale),
        str(exercise),
        str(filled),
        str(chatty),
        "-rf",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    failed = sorted(  # "FAILED chatty/exercise.ipynb::Cell 5 - ..." -> "chatty::Cell 5"
        "::".join((where.split("/")[-2], cell))
        for line in done.stdout.splitlines()
        if line.startswith("FAILED ")
        for where, cell in [line[len("FAILED ") :].split(" - ")[0].split("::")]
    )
    # nbval counts code cells only: 3, 5 and 7 are the check cells of tasks 1-3, 4 is the
    # top-level stub itself; the exercise's other cells (incl. the non-graded NBVAL_CHECK_OUTPUT
    # cell 8, compared with its stored expected output) pass
    assert failed == [
        "broken::Cell 3",
        "chatty::Cell 5",
        "exercises::Cell 3",
        "exercises::Cell 4",
        "exercises::Cell 5",
        "exercises::Cell 7",
        "stale::Cell 8",
    ], done.stdout
    # (each generated exercise ends with its grade cell, which passes: 50)
    assert "7 failed, 50 passed" in done.stdout, done.stdout
    assert "✗ task 1" in done.stdout and "Cell outputs differ" in done.stdout


def test_stored_widgets_keep_their_state_and_progress_bars_their_final_text(tmp_path):
    path = tmp_path / "widgets.ipynb"
    _notebook(
        path,
        "from tqdm.auto import tqdm\nfor _ in tqdm(range(7), desc='sweep'):\n    pass",
        "import ipywidgets as w\nslider = w.IntSlider(value=3)\nslider",
        "slider.value = 5",
    )
    execute_notebook(path, timeout=60)
    nb = nbformat.read(path, as_version=4)
    bar = nb.cells[0].outputs[0]["data"]["text/plain"]
    assert bar.startswith("sweep: 100% 7/7"), bar  # not the "0% 0/7" captured when it appeared
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    view = nb.cells[1].outputs[0]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert state[view]["state"]["value"] == 5  # what the page renders without a kernel


def test_a_stored_widget_says_what_it_is_instead_of_its_repr():
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from course_tools.execute import WIDGET_TEXT, _explain_stored_widgets

    view = {
        "application/vnd.jupyter.widget-view+json": {
            "model_id": "abc",
            "version_major": 2,
            "version_minor": 0,
        }
    }
    explorer = new_output("display_data", data={**view, "text/plain": "VBox(children=(HBox(...)))"})
    bar = new_output("display_data", data={**view, "text/plain": "100% 7/7 [00:01<00:00]"})
    nb = new_notebook(cells=[new_code_cell("x", outputs=[explorer, bar])])
    _explain_stored_widgets(nb)
    texts = [out["data"]["text/plain"] for out in nb.cells[0].outputs]
    assert texts == [WIDGET_TEXT, "100% 7/7 [00:01<00:00]"]
