"""The learner's-value helpers of course_lib.grading.plain that every unit's checks share: a
learner's numbers and containers as plain data (learner_number, learner_value), a find-the-bug
diagnosis across the wall (bug_data on the learner's side, judge_bug on the judge's), the name of
what came back (type_name), and the judge's guard on a list of answers (split.need_list)."""

from __future__ import annotations

import collections
import fractions

import numpy as np
import pytest
import torch

from course_lib.grading import plain
from course_lib.grading.plain import (
    Opaque,
    bug_data,
    judge_bug,
    learner_number,
    learner_value,
    type_name,
)
from course_lib.grading.split import need_list


class _Liar(int):
    """An int that equals anything: it must cross as the plain int it holds."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class _Refuses(int):
    """An int subclass whose conversion raises: it stays as it is (and crosses as a description)."""

    def __int__(self):
        raise ValueError("no")


def _exact(value, expected) -> bool:
    return type(value) is type(expected) and value == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (np.int64(3), 3),
        (np.int32(-2), -2),
        (np.float64(2.5), 2.5),
        (np.float32(0.5), 0.5),
        (fractions.Fraction(1, 4), 0.25),
        (_Liar(7), 7),
        (7, 7),
        (1.5, 1.5),
    ],
)
def test_learner_number_makes_any_number_the_plain_int_or_float_it_equals(value, expected):
    got = learner_number(value)
    assert _exact(got, expected)
    assert _exact(plain.roundtrip(got), expected)


@pytest.mark.parametrize(
    "value, expected",
    [(np.float64(2.5), 2.5), (_Liar(7), 7), (3, 3), (True, True)],
)
def test_builtin_only_converts_int_and_float_subclasses(value, expected):
    assert _exact(learner_number(value, builtin_only=True), expected)


@pytest.mark.parametrize("value", [np.int64(3), np.float32(0.5), fractions.Fraction(1, 2)])
def test_builtin_only_leaves_other_numbers_as_they_are(value):
    assert learner_number(value, builtin_only=True) is value
    assert isinstance(plain.roundtrip(learner_number(value, builtin_only=True)), plain.Opaque)


@pytest.mark.parametrize("value", [True, None, "3", b"3", {1}, torch.tensor(2.0)])
def test_learner_number_leaves_what_is_not_a_number(value):
    assert learner_number(value) is value


def test_a_number_that_refuses_conversion_stays_as_it_is_and_crosses_as_a_description():
    bad = _Refuses(3)
    assert learner_number(bad) is bad and learner_value([bad])[0] is bad
    assert isinstance(plain.roundtrip(learner_number(bad)), plain.Opaque)


def test_learner_value_reads_containers_item_by_item():
    Pair = collections.namedtuple("Pair", "a b")
    value = {
        "pair": Pair(np.int64(1), np.float64(2.0)),
        "list": [np.int64(3), [np.float32(0.5)]],
        np.int64(4): "numpy key",
        ("a", 1): "tuple key",
        7: None,
    }
    got = learner_value(value)
    assert got == {
        "pair": (1, 2.0),
        "list": [3, [0.5]],
        4: "numpy key",
        "('a', 1)": "tuple key",
        7: None,
    }
    assert type(got["pair"]) is tuple and type(got["list"][0]) is int
    assert all(type(k) in (str, int) for k in got)
    assert plain.roundtrip(got) == got


def test_learner_value_stops_at_its_depth():
    inner = [np.int64(1)]
    got = learner_value([inner, np.int64(2)], 1)
    assert got[0] is inner and _exact(got[1], 2)
    assert learner_value([[[np.int64(5)]]]) == [[[5]]]
    deep: list = [np.int64(9)]
    for _ in range(plain.LEARNER_DEPTH):
        deep = [deep]  # the number sits one level below the depth read
    got = plain.roundtrip(learner_value(deep))
    for _ in range(plain.LEARNER_DEPTH):
        got = got[0]
    assert isinstance(got[0], plain.Opaque) and got[0].type_name == "numpy.int64"


def test_learner_value_builtin_only_keeps_numpy_ints_opaque():
    got = plain.roundtrip(learner_value((np.float64(1.5), np.int64(2)), builtin_only=True))
    assert _exact(got[0], 1.5) and isinstance(got[1], plain.Opaque)


def test_a_key_whose_repr_raises_crosses_as_its_type_name():
    class Key:
        def __repr__(self):
            raise RuntimeError("no")

    assert learner_value({Key(): 1}) == {"<Key>": 1}


# --------------------------------------------------------------------------- find the bug
CHOICES = {"a": "the first reason", "b": "the right reason"}


def _verdict(data) -> str:
    with pytest.raises(AssertionError) as info:
        judge_bug(4, plain.roundtrip(data), CHOICES, "b", "look again")
    return str(info.value)


def test_the_right_letter_passes_in_any_case_and_spacing():
    for answer in ("b", " B ", "b\n"):
        assert judge_bug(4, plain.roundtrip(bug_data(answer)), CHOICES, "b", "look again") is None


def test_a_wrong_choice_names_what_it_says_and_the_hint():
    assert _verdict(bug_data("a")) == "✗ task 4: bug 'a' (the first reason): look again"


@pytest.mark.parametrize(
    "answer, shown", [("z", "'z'"), ("", "''"), (3, "3"), (None, "None"), (["b"], "['b']")]
)
def test_anything_but_a_choice_is_refused_with_how_it_reads(answer, shown):
    assert _verdict(bug_data(answer)) == f"✗ task 4: bug must be one of ['a', 'b'], got {shown}"


def test_bug_data_is_plain_even_when_repr_raises():
    class Odd:
        def __repr__(self):
            raise RuntimeError("no")

    assert bug_data(Odd()) == {"bug": None, "bug_repr": "<Odd>"}
    assert bug_data("b") == {"bug": "b", "bug_repr": "'b'"}
    assert len(bug_data("x" * 1000)["bug_repr"]) == 200


@pytest.mark.parametrize(
    "data", [None, "b", ["b"], {}, {"bug": 2}, {"bug": None, "bug_repr": "b"}, {"bug": {"b"}}]
)
def test_malformed_data_is_a_verdict_not_a_crash(data):
    assert _verdict(data).startswith("✗ task 4: bug must be one of ['a', 'b'], got ")


# --------------------------------------------------------------------------- type_name, need_list
@pytest.mark.parametrize(
    "value, full, short",
    [
        (np.int64(3), "numpy.int64", "int64"),  # crosses as an Opaque: the learner's type
        (np.float32(0.5), "numpy.float32", "float32"),
        (collections.Counter("ab"), "collections.Counter", "Counter"),
        (3.0, "float", "float"),
        ((1, 2), "tuple", "tuple"),
        (None, "NoneType", "NoneType"),
        (torch.zeros(2), "Tensor", "Tensor"),
    ],
)
def test_type_name_names_the_type_the_learner_made_on_either_side(value, full, short):
    seen = plain.roundtrip(value)  # what the judge holds
    assert type_name(seen) == full and type_name(seen, short=True) == short
    if not isinstance(seen, Opaque):  # in the learner's kernel: the same name
        assert type_name(value) == full


def test_type_name_of_an_opaque_is_its_recorded_name():
    assert type_name(Opaque("my.module.Odd", "<Odd>")) == "my.module.Odd"
    assert type_name(Opaque("my.module.Odd", "<Odd>"), short=True) == "Odd"
    assert type_name(Opaque("Odd", "<Odd>"), short=True) == "Odd"


def test_need_list_hands_back_the_list_itself():
    data = [1, "two", None]
    assert need_list(3, data, 3, "answer") is data
    assert need_list(3, [], 0, "answer") == []


@pytest.mark.parametrize("data", [None, (1, 2), [1], [1, 2, 3], {"0": 1, "1": 2}, "ab"])
def test_need_list_refuses_anything_but_a_list_of_n(data):
    with pytest.raises(AssertionError) as info:
        need_list(3, data, 2, "answer")
    assert str(info.value) == "✗ task 3: the run handed back no answer for each of the 2 cases"
    with pytest.raises(AssertionError) as info:
        need_list(5, data, 2, "(data, scale)", "tensors")
    assert str(info.value) == (
        "✗ task 5: the run handed back no (data, scale) for each of the 2 tensors"
    )
