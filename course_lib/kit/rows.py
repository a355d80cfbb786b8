"""Typed rows and their frames (see :mod:`course_lib.kit`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd


def columns(row_type: type) -> tuple[str, ...]:
    """The field names of ``row_type``, a frozen dataclass, in declaration order."""
    if not (isinstance(row_type, type) and dataclasses.is_dataclass(row_type)):
        raise TypeError(f"row_type = {row_type!r}: expected a dataclass type (a unit's row)")
    if not row_type.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(
            f"row_type = {row_type.__name__}: a row is frozen; declare it @dataclass(frozen=True)"
        )
    return tuple(f.name for f in dataclasses.fields(row_type))


def frame(rows: Iterable[Any], row_type: type | None = None) -> pd.DataFrame:
    """One DataFrame row per ``rows`` item, one column per field of their row type.

    ``row_type`` names the type when ``rows`` may be empty (the frame keeps its columns); every
    row must be an instance of that one type.
    """
    rows = list(rows)
    if row_type is None:
        if not rows:
            raise ValueError("rows = []: pass row_type so that an empty frame has its columns")
        row_type = type(rows[0])
    names = columns(row_type)
    for i, row in enumerate(rows):
        if type(row) is not row_type:
            raise TypeError(
                f"rows[{i}] = {type(row).__name__}: expected {row_type.__name__} "
                "(one row type per frame)"
            )
    return pd.DataFrame([[getattr(r, n) for n in names] for r in rows], columns=list(names))


def reads_violations(module_name: str, reads: Mapping[type, Iterable[str]]) -> list[str]:
    """The names in a module's ``READS`` (row type -> columns it reads) that are not fields."""
    found = []
    for row_type, names in reads.items():
        fields = set(columns(row_type))
        for name in names:
            if name not in fields:
                found.append(
                    f"{module_name} reads {name!r} of {row_type.__name__}, whose fields are "
                    f"{sorted(fields)}"
                )
    return found
