"""Typed rows and their frames (see :mod:`course_lib.kit`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

#: a field's metadata key for a column name that is no Python name ("measured / predicted")
COLUMN = "column"


def column(name: str) -> dict[str, str]:
    """The metadata of a field whose column is called ``name``:
    ``ratio: float = dataclasses.field(metadata=kit.column("measured / predicted"))``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name = {name!r}: expected a non-empty column name")
    return {COLUMN: name}


def _fields(row_type: type) -> tuple[dataclasses.Field[Any], ...]:
    if not (isinstance(row_type, type) and dataclasses.is_dataclass(row_type)):
        raise TypeError(f"row_type = {row_type!r}: expected a dataclass type (a unit's row)")
    if not row_type.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(
            f"row_type = {row_type.__name__}: a row is frozen; declare it @dataclass(frozen=True)"
        )
    return dataclasses.fields(row_type)


def columns(row_type: type) -> tuple[str, ...]:
    """The column names of ``row_type``, a frozen dataclass: its fields in declaration order
    (a field whose metadata is :func:`column` under that name)."""
    return tuple(f.metadata.get(COLUMN, f.name) for f in _fields(row_type))


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
    names = [f.name for f in _fields(row_type)]
    for i, row in enumerate(rows):
        if type(row) is not row_type:
            raise TypeError(
                f"rows[{i}] = {type(row).__name__}: expected {row_type.__name__} "
                "(one row type per frame)"
            )
    return pd.DataFrame(
        [[getattr(r, n) for n in names] for r in rows], columns=list(columns(row_type))
    )


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
