"""course_lib.kit: typed rows become frames with the row's fields as columns, in order."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from course_lib import kit


@dataclasses.dataclass(frozen=True)
class Step:
    rank: int
    seconds: float
    name: str = "a"


@dataclasses.dataclass
class Loose:
    rank: int


def test_a_frame_has_one_column_per_field_in_order():
    df = kit.frame([Step(0, 1.5), Step(1, 2.5, "b")])
    assert list(df.columns) == ["rank", "seconds", "name"]
    pd.testing.assert_frame_equal(
        df, pd.DataFrame({"rank": [0, 1], "seconds": [1.5, 2.5], "name": ["a", "b"]})
    )


def test_an_empty_frame_keeps_its_columns_and_needs_its_type():
    assert list(kit.frame([], Step).columns) == ["rank", "seconds", "name"]
    with pytest.raises(ValueError, match="row_type"):
        kit.frame([])


def test_rows_are_frozen_dataclasses_of_one_type():
    with pytest.raises(TypeError, match="frozen"):
        kit.frame([Loose(0)])
    with pytest.raises(TypeError, match="dataclass"):
        kit.columns(dict)
    with pytest.raises(TypeError, match=r"rows\[1\] = Loose: expected Step"):
        kit.frame([Step(0, 1.0), Loose(1)])


def test_a_read_column_that_is_no_field_is_named():
    assert kit.reads_violations("m", {Step: ("rank", "seconds")}) == []
    (found,) = kit.reads_violations("m", {Step: ("rank", "secs")})
    assert "m reads 'secs' of Step" in found and "'seconds'" in found
