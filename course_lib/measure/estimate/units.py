"""Units of bytes, formatting, and small helpers shared by the formula modules."""

from __future__ import annotations

import numbers
from fractions import Fraction

from course_lib import validate as _v

__all__ = ["KiB", "MiB", "GiB", "GB", "exact", "fmt_bytes"]

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9


def exact(x: Fraction) -> int | float:
    """An int when the fraction is whole, else a float."""
    return int(x) if x.denominator == 1 else float(x)


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------
_UNITS = {
    "B": 1,
    "KiB": KiB,
    "MiB": MiB,
    "GiB": GiB,
    "TiB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": GB,
    "TB": 10**12,
}


def fmt_bytes(n: float, unit: str = "auto", *, digits: int = 2) -> str:
    """Format a byte count with its unit: ``unit="auto"`` picks the largest binary unit
    (KiB/MiB/GiB/TiB = powers of 1024) that keeps the number >= 1; or force one of
    B, KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB (1000-based, as papers and vendors use).

    >>> fmt_bytes(3 * 2**30)
    '3.00 GiB'
    >>> fmt_bytes(120e9, "GB", digits=1)
    '120.0 GB'
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Real):  # NaN and inf are formatted
        raise TypeError(f"n = {_v.describe(n)}: expected a number of bytes")
    _v.choice("unit", unit, ("auto", *_UNITS))
    if unit == "auto":
        unit = "B"
        for name in ("KiB", "MiB", "GiB", "TiB"):
            if abs(n) >= _UNITS[name]:
                unit = name
    n = float(n) if not isinstance(n, int) else n
    if unit == "B" and float(n).is_integer():
        return f"{int(n)} B"
    return f"{n / _UNITS[unit]:.{digits}f} {unit}"
