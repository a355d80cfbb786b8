"""What travels to the ranks: ``(fn, args, kwargs)`` pickled by value, and a warning when it is large.

Part of :func:`course_lib.launch` (runtime/launch.py); ``pickle_values``: what ``ranks.push``
sends to persistent ranks (runtime/rankset.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import cloudpickle

_LARGE_PAYLOAD_BYTES = 50 * 2**20  # a pickled fn + arguments above 50 MiB get a warning, once
_warned_large_payloads: set[str] = set()


def _pickle_payload(fn: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """cloudpickle ``(fn, args, kwargs)``; on failure name the culprit and its type."""
    try:
        return bytes(cloudpickle.dumps((fn, args, kwargs)))
    except Exception as whole_error:
        candidates = [("fn", fn)] + [
            (f"positional argument args[{i}]", a) for i, a in enumerate(args)
        ]
        candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        for label, value in candidates:
            try:
                cloudpickle.dumps(value)
            except Exception as exc:
                raise TypeError(
                    f"{label} of type {type(value).__name__} cannot be pickled by "
                    f"cloudpickle, so it cannot be sent to the ranks ({exc}); pass "
                    "something picklable (tensors, numbers, dataclasses, functions) "
                    "or create it inside fn"
                ) from exc
        raise TypeError(f"the arguments cannot be pickled together: {whole_error}") from whole_error


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _captured_sizes(
    fn: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[str, int]]:
    """(label, pickled size) of what fn carries along: globals it names, closure variables,
    arguments; largest first. Only called for a payload already known to be large."""
    parts: list[tuple[str, Any]] = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        module_globals = getattr(fn, "__globals__", {})
        parts += [
            (f"global {name}", module_globals[name])
            for name in code.co_names
            if name in module_globals
        ]
        cells = getattr(fn, "__closure__", None) or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                parts.append((f"closure variable {name}", cell.cell_contents))
            except ValueError:  # an empty cell
                pass
    parts += [(f"args[{i}]", a) for i, a in enumerate(args)]
    parts += [(f"keyword argument {k}", v) for k, v in kwargs.items()]
    sizes = []
    for label, value in parts:
        try:
            sizes.append((label, len(cloudpickle.dumps(value))))
        except Exception:  # the whole payload pickled; a part alone may not
            continue
    return sorted((p for p in sizes if p[1] >= 2**20), key=lambda p: -p[1])


def _warn_large_payload(
    fn: object, args: tuple[Any, ...], kwargs: dict[str, Any], size: int
) -> None:
    """Once per function name: the payload travels to every rank on every launch."""
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    if name in _warned_large_payloads:
        return
    _warned_large_payloads.add(name)
    parts = _captured_sizes(fn, args, kwargs)[:3]
    largest = (
        "; the largest parts: " + ", ".join(f"{label} ({_mib(n)})" for label, n in parts)
        if parts
        else ""
    )
    warnings.warn(
        f"launch: {name} and its arguments pickle to {_mib(size)}{largest}. All of it is sent to "
        "every rank on every launch. Create large data inside fn, or save it once (torch.save) "
        "and load it inside fn, so that each rank builds or reads its own; if the ranks need the "
        "caller's object, pass it as an argument, where the cost is visible at the call.",
        UserWarning,
        stacklevel=3,
    )


def pickle_values(values: dict[str, Any]) -> bytes:
    """``values`` for ``ranks.push`` cloudpickled, after checking each name and value: ValueError
    for a name every rank defines itself (``rank``, ...), TypeError naming a value that cannot be
    pickled (see :meth:`~course_lib.runtime.rankset.RankSet.push`)."""
    from course_lib import validate
    from course_lib.runtime.protocol import RANK_NAMES

    for name, value in values.items():
        if name in RANK_NAMES:
            raise ValueError(
                f"{name} = {validate.describe(value)}: expected a name the ranks do not define "
                f"themselves; `{name}` is {RANK_NAMES[name]} in each rank and is never replaced"
            )
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TypeError(
                f"{name} = {validate.describe(value)}: expected a value that can be pickled to "
                f"send to the ranks; a {type(value).__name__} cannot be ({why})"
            ) from None
    return bytes(cloudpickle.dumps(values))
