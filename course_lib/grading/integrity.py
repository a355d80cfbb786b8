"""Is the course's grading code still what it was? A snapshot taken before any learner code runs.

The grade command's clean process (:mod:`course_lib.grading.isolate`) imports ``course_lib`` and
the unit being graded, then calls :func:`take_snapshot`: for every loaded ``course_lib`` module,
the identity of each module-level object, and for each function (module level or in a class
defined there) its code, defaults and globals. :func:`changes` lists what differs now: a check
function monkeypatched, ``unit.checks`` rebound, a class's method replaced, a module swapped in
``sys.modules``. ``run_learner`` calls it after every learner call and the clean process before
and after each check; any change fails the task as tampered. Names added later are not changes
(lazy imports add them); trapped functions (:mod:`course_lib.grading.traps`) may hold their trap.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["changes", "has_snapshot", "take_snapshot"]

_Members = dict[str, tuple[int, int]]  # name -> (id of the member, id of the function inside or 0)
_SNAPSHOT: dict[str, tuple[int, dict[str, tuple[int, _Members]]]] = {}
_CODES: dict[int, tuple[int, int, int, int]] = {}  # id(function) -> ids of code, defaults, ...
_KEEP_ALIVE: list[Any] = []  # the snapshot's objects: ids stay unique while they live


def _function(value: Any) -> types.FunctionType | None:
    inner = getattr(value, "__func__", value)  # staticmethod, classmethod, bound method
    return inner if isinstance(inner, types.FunctionType) else None


def _members(value: Any, module: str) -> _Members:
    """What to compare of a module-level object: a function itself, a class's own members."""
    if isinstance(value, type) and getattr(value, "__module__", None) == module:
        items = list(vars(value).items())
    elif isinstance(value, types.FunctionType):
        items = [("", value)]
    else:
        return {}
    out: _Members = {}
    for name, member in items:
        f = _function(member)
        out[name] = (id(member), id(f) if f is not None else 0)
        if f is not None:
            _CODES[id(f)] = _code_print(f)
            _KEEP_ALIVE.append(f)
    return out


def _code_print(f: types.FunctionType) -> tuple[int, int, int, int]:
    return (id(f.__code__), id(f.__defaults__), id(f.__kwdefaults__), id(f.__globals__))


def _watched(name: str) -> bool:
    return name == "course_lib" or name.startswith("course_lib.")


def take_snapshot() -> None:
    """Record the loaded ``course_lib`` modules as they are now."""
    _SNAPSHOT.clear()
    _CODES.clear()
    _KEEP_ALIVE.clear()
    for name, module in list(sys.modules.items()):
        if not _watched(name) or module is None:
            continue
        entries = {}
        for attr, value in list(vars(module).items()):
            entries[attr] = (id(value), _members(value, name))
            _KEEP_ALIVE.append(value)
        _SNAPSHOT[name] = (id(module), entries)
        _KEEP_ALIVE.append(module)


def has_snapshot() -> bool:
    return bool(_SNAPSHOT)


def _changed_function(f: types.FunctionType, trapped: dict[int, int]) -> bool:
    now = _code_print(f)
    before = _CODES.get(id(f))
    if before is None or now == before:
        return False
    # a trap installed since the snapshot holds the function's code: that is the grader's own
    return not (now[1:] == before[1:] and trapped.get(id(f)) == now[0])


def _changed_members(value: Any, members: _Members, trapped: dict[int, int]) -> bool:
    current = vars(value) if isinstance(value, type) else {"": value}
    for name, (member_id, function_id) in members.items():
        if name not in current or id(current[name]) != member_id:
            return True
        member = current[name]
        f = _function(member)
        if function_id and (f is None or id(f) != function_id or _changed_function(f, trapped)):
            return True
    return False


def changes() -> list[str]:
    """What differs from the snapshot, one phrase each (empty: nothing, or no snapshot)."""
    if not _SNAPSHOT:
        return []
    from course_lib.grading.traps import installed_traps

    trapped = {id(f): id(code) for f, code in installed_traps().items()}
    found: list[str] = []
    for name, (module_id, entries) in _SNAPSHOT.items():
        module = sys.modules.get(name)
        if module is None or id(module) != module_id:
            found.append(f"module {name} was replaced")
            continue
        now = vars(module)
        for attr, (value_id, members) in entries.items():
            if attr not in now:
                found.append(f"{name}.{attr} was deleted")
            elif id(now[attr]) != value_id:
                found.append(f"{name}.{attr} was replaced")
            elif members and _changed_members(now[attr], members, trapped):
                found.append(f"{name}.{attr} was changed")
    return found
