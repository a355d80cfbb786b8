"""One vocabulary for checking arguments, used by every layer of the course.

Every check raises before any work starts, with one message shape::

    <parameter> = <value>: expected <what is valid>

``TypeError`` when the kind of value is wrong, ``ValueError`` when the value is out of range or
not among the choices. Counts accept ``int``, numpy integers and integral floats such as
``7.5e9`` (papers write parameter counts so); ``bool`` is never a number. Pure Python: no torch,
so formulas and check cells can use it.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, SupportsInt, cast

__all__ = [
    "choice",
    "choices",
    "count",
    "counts",
    "number",
    "divisible",
    "power_of_two",
    "describe",
]


def describe(value: Any) -> str:
    """``repr`` of a value with its type when the type is part of the problem."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(exc: type[Exception], name: str, value: Any, expected: str) -> NoReturn:
    raise exc(f"{name} = {describe(value)}: expected {expected}")


def choice(name: str, value: Any, valid: Iterable[Any], *, case_insensitive: bool = False) -> Any:
    """``value`` if it is one of ``valid`` (strings compared without case when asked)."""
    valid = tuple(valid)
    key = value.lower() if case_insensitive and isinstance(value, str) else value
    try:
        ok = key in valid
    except TypeError:  # unhashable value against a set-like
        ok = False
    if not ok:
        _fail(ValueError, name, value, "one of " + ", ".join(map(str, valid)))
    return key


def choices(name: str, values: Any, valid: Iterable[Any]) -> list[Any]:
    """A list of choices; a single string is a list of one."""
    valid = tuple(valid)
    if isinstance(values, str):
        values = [values]
    chosen: list[Any] = list(values)
    if not chosen:
        _fail(ValueError, name, chosen, "a non-empty list of " + ", ".join(map(str, valid)))
    for v in chosen:
        if v not in valid:
            _fail(
                ValueError,
                name,
                chosen,
                "each one of " + ", ".join(map(str, valid)) + f" ({describe(v)} is not)",
            )
    return chosen


def count(name: str, value: Any, *, minimum: int | None = 0, maximum: int | None = None) -> int:
    """An integer count in ``[minimum, maximum]`` (numpy ints and integral floats accepted)."""
    if type(value) is int and (minimum is None or value >= minimum):
        if maximum is None or value <= maximum:  # the common case, without the ABC checks
            return value
    if isinstance(value, bool):
        _fail(TypeError, name, value, "an int, not a bool")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer():
        value = int(cast(SupportsInt, value))  # typeshed: Real has no __int__ (every Real converts)
    else:
        _fail(TypeError, name, value, f"an int (got {type(value).__name__})")
    if minimum is not None and value < minimum:
        _fail(ValueError, name, value, _range_text(minimum, maximum))
    if maximum is not None and value > maximum:
        _fail(ValueError, name, value, _range_text(minimum, maximum))
    return int(value)


def counts(name: str, values: Any, *, minimum: int = 1) -> list[int]:
    """A non-empty sequence of counts, each ``>= minimum``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | Iterable):
        _fail(TypeError, name, values, f"a non-empty list of ints >= {minimum}")
    values = list(values)
    if not values:
        _fail(ValueError, name, values, f"a non-empty list of ints >= {minimum}")
    out = []
    for v in values:
        try:
            out.append(count(name, v, minimum=minimum))
        except (TypeError, ValueError):
            _fail(ValueError, name, values, f"a non-empty list of ints >= {minimum}")
    return out


def number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    positive: bool = False,
    maximum: float | None = None,
    finite: bool = False,
) -> float:
    """A real number; ``positive`` means ``> 0``, ``minimum``/``maximum`` are inclusive,
    ``finite`` refuses infinities (a speed or a size that is infinite makes every ratio 0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(TypeError, name, value, f"a number (got {type(value).__name__})")
    x = cast(float, value)  # typeshed's Real declares no comparisons; every Real has float's
    if x != x:  # NaN
        _fail(ValueError, name, value, "a number, not NaN")
    if finite and x in (float("inf"), float("-inf")):
        _fail(ValueError, name, value, "a finite number" + (" > 0" if positive else ""))
    if positive and not x > 0:
        _fail(ValueError, name, value, "a number > 0")
    if minimum is not None and x < minimum:
        _fail(ValueError, name, value, f"a number >= {minimum}")
    if maximum is not None and x > maximum:
        _fail(ValueError, name, value, f"a number <= {maximum}")
    return x


def divisible(name: str, value: Any, by_name: str, by: Any, *, note: str = "") -> int:
    """``value`` (an int) if it is a multiple of ``by``: ``n_embd = 10: expected a multiple of
    n_head = 4``; ``note`` (why, what to do instead) follows after ``; ``."""
    n = count(name, value, minimum=None)
    m = count(by_name, by, minimum=1)
    if n % m:
        _fail(ValueError, name, n, f"a multiple of {by_name} = {m}" + (f"; {note}" if note else ""))
    return n


def power_of_two(
    name: str, value: Any, *, minimum: int = 1, maximum: int | None = None, note: str = ""
) -> int:
    """``value`` (an int in ``[minimum, maximum]``) if it is a power of two, as recursive doubling
    needs: ``world_size = 6: expected a power of two (1, 2, 4, 8, ...)``; ``note`` follows."""
    n = count(name, value, minimum=minimum, maximum=maximum)
    if n < 1 or n & (n - 1):
        first = 1 << (max(minimum, 1) - 1).bit_length()  # the smallest valid one
        last = maximum if maximum is not None else 8 * first
        powers = [str(first << k) for k in range(64) if first << k <= last]
        listed = ", ".join(powers + ([] if maximum is not None else ["..."]))
        _fail(ValueError, name, n, f"a power of two ({listed})" + (f"; {note}" if note else ""))
    return n


def _range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an int in {minimum}..{maximum}"
    if minimum is not None:
        return f"an int >= {minimum}"
    return f"an int <= {maximum}"
