"""Run one solution notebook's code in this process and print, as JSON, the numbers each task's
answer functions returned while that task's check cell ran (the reference answers, drawn at the
grading seed in ``COURSE_GRADE_SEED``).

    python tests/grading/_answers_probe.py solutions/15_context_parallelism.ipynb
    python tests/grading/_answers_probe.py solutions/*.ipynb   # one JSON line per notebook

Several notebooks: torch and course_lib are imported once, and each notebook runs in a child
forked from that process, as a fresh interpreter would after the same imports (its own
namespace, folder and state; nothing it does reaches the next one); each child's JSON is printed
on a line of its own, ``{"notebook": path, "answers": {...}}``, or ``"error"`` and the child's
exit status when it did not finish.

No rank is launched: ``course_lib.launch`` refuses (a check that needs ranks records nothing,
and a code answer that returns tensors records nothing either: only plain numbers are answers a
lecture could print). Used by ``test_answers_not_printed.py``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from pathlib import Path


class _NoRanks(RuntimeError):
    pass


def _no_ranks(*args, **kwargs):
    raise _NoRanks("the answers probe launches no ranks")


def _block_launches() -> None:
    import course_lib
    import course_lib.runtime.launch as launch_module

    launch_module.launch = _no_ranks
    course_lib.launch = _no_ranks


def _numbers(value, depth: int = 0):
    """The plain numbers in a returned value (ints, floats, in tuples, lists and dict values)."""
    if depth > 3:
        return
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return
        yield value
    elif isinstance(value, tuple | list):
        for v in value[:64]:
            yield from _numbers(v, depth + 1)
    elif isinstance(value, dict):
        for v in list(value.values())[:64]:
            yield from _numbers(v, depth + 1)
    elif type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        yield from _numbers(value.item(), depth + 1)


def main(path: str) -> None:
    _block_launches()
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    found: dict[str, list] = {}
    current: list[str | None] = [None]

    def record(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            result = fn(*args, **kwargs)
            if current[0] is not None:
                found.setdefault(current[0], []).extend(_numbers(result))
            return result

        return wrapper

    namespace: dict = {"__name__": "__main__"}
    os.chdir(Path(path).resolve().parent)
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if source.lstrip().startswith(("%", "!")):
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        task = next((t.split("-", 1)[1] for t in tags if t.startswith("task-")), None)
        before = set(namespace)
        current[0] = task
        try:
            exec(compile(source, f"<{Path(path).name} cell>", "exec"), namespace)  # noqa: S102
        except BaseException as exc:  # noqa: BLE001 - a cell that needs ranks: go on
            print(f"cell skipped: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        finally:
            current[0] = None
        for name in set(namespace) - before:
            value = namespace[name]
            if callable(value) and getattr(value, "__module__", None) == "__main__":
                if not isinstance(value, type):  # functions only: a class is not an answer
                    namespace[name] = record(value)
    print(json.dumps(found))


def main_each(paths: list[str]) -> None:
    """Each notebook in a child forked after the imports every one of them makes."""
    import torch  # noqa: F401 - imported once, before the forks

    import course_lib  # noqa: F401
    import course_lib.runtime.launch  # noqa: F401

    for path in paths:
        sys.stdout.flush()
        sys.stderr.flush()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its stdout is the pipe
            os.close(read)
            os.dup2(write, 1)
            code = 0
            try:
                main(path)
            except BaseException as exc:  # noqa: BLE001 - reported by the parent
                print(f"probe failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        os.close(write)
        with os.fdopen(read, encoding="utf-8") as pipe:
            out = pipe.read()
        _, status = os.waitpid(pid, 0)
        lines = out.strip().splitlines()
        if os.waitstatus_to_exitcode(status) == 0 and lines:
            print(json.dumps({"notebook": path, "answers": json.loads(lines[-1])}), flush=True)
        else:
            exit_code = os.waitstatus_to_exitcode(status)
            print(json.dumps({"notebook": path, "error": exit_code}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        main_each(sys.argv[1:])
