"""The learner's side of one grade, run inside the notebook's sandbox (:mod:`.sandbox`).

Reads one request (a JSON line) on stdin: the learner's notebook, its file name, the checks'
jobs (:class:`~course_lib.grading.isolate.CheckJob`; a split check's learner half runs, anything
else whole), the seed, the unit, the seconds a cell and a job may take, the kernel; and, once
the notebook has run, a second line: the split checks' inputs, which the judge's side computed
meanwhile. Then, in the sandbox's scratch folder:

1. starts the zygote the checks are forked from (:mod:`.zygote`), so it imports the course while
2. the notebook runs in a fresh kernel, every cell, errors recorded (:func:`.grader._execute`);
3. runs the jobs of the tasks whose check cell the kernel reached, each in a clean fork;
4. writes one reply line on the stdout it was started with: how the kernel ended, the other
   cells' errors, each task's result (a split check's plain data, encoded).

Nothing here is trusted by the judge: the kernel, the learner's code in the checks' processes and
this process share the sandbox, so the reply is data to check, never a verdict to believe. The
learner's output never reaches the reply's stream: fd 1 and 2 point at ``/dev/null`` before any
kernel or fork starts.
"""

from __future__ import annotations

import json
import os
import select
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

__all__ = ["main"]


def main() -> None:
    reply_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    request = json.loads(_line(None))
    reply: dict[str, Any] = {"course_grade_reply": 1}
    try:
        reply.update(_grade_learner_side(request))
    except Exception as exc:  # noqa: BLE001 - the judge says what was lost
        reply["lost"] = f"the learner's side could not run: {type(exc).__name__}: {exc}"[:500]
    data = (json.dumps(reply) + "\n").encode()
    while data:
        data = data[os.write(reply_fd, data) :]
    os.close(reply_fd)
    os._exit(0)


_INPUTS: list[dict[str, Any]] = []
_PENDING = bytearray()  # what was read from stdin beyond the last line


def _line(timeout: float | None) -> bytes:
    """The next line on stdin (fd 0), waiting at most ``timeout`` seconds (None: for ever);
    b"" when none came."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in _PENDING:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([0], [], [], left)
        chunk = os.read(0, 1 << 20) if ready else b""
        if not chunk:
            break
        _PENDING.extend(chunk)
    line, sep, rest = bytes(_PENDING).partition(b"\n")
    _PENDING[:] = rest
    return line if sep or not rest else b""


def _inputs(timeout: float) -> dict[str, Any]:
    """The second message: each split check's inputs (encoded), which the judge's side computed
    while the notebook ran; {} if none comes within ``timeout`` seconds."""
    if not _INPUTS:
        line = _line(timeout)
        try:
            message = json.loads(line) if line.strip() else {}
        except ValueError:
            message = {}
        _INPUTS.append(message if isinstance(message, dict) else {})
    return _INPUTS[0]


def _grade_learner_side(request: dict[str, Any]) -> dict[str, Any]:
    from course_lib.grading.isolate import CheckJob
    from course_lib.grading.zygote import Zygote

    folder = Path.cwd()
    # the zygote first: it imports the course while this process imports Jupyter's client
    with Zygote(str(request["unit"]), cwd=folder, seed=int(request["seed"])) as zygote:
        import nbformat

        from course_lib.grading.compare import _first_line
        from course_lib.grading.grader import _error_of, _execute

        path = folder / Path(str(request["name"])).name
        nb = nbformat.from_dict(request["notebook"])
        nbformat.write(nb, path)
        jobs = [CheckJob(**spec) for spec in request["jobs"]]
        cells: dict[str, int] = {str(k): int(v) for k, v in request["check_cells"].items()}
        seconds = int(request["cell_seconds"])
        stopped_at, status = _execute(nb, path, seconds, str(request["kernel_name"]))
        todo = [
            replace(job, inputs=_inputs(float(request["job_seconds"])).get(str(job.task)))
            for job in jobs
            if stopped_at is None or cells.get(str(job.task), len(nb.cells)) < stopped_at
        ]
        results = zygote.run(todo, timeout=float(request["job_seconds"])) if todo else []
    errors = [
        [index, error[0], _first_line(error[1])]
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and index not in cells.values() and (error := _error_of(cell))
    ]
    return {
        "stopped_at": stopped_at,
        "status": status,
        "cell_errors": errors,
        "results": {str(job.task): asdict(result) for job, result in zip(todo, results)},
    }
