"""What crosses the grading wall (course_lib.grading.plain) and the two halves of a check
(course_lib.grading.split): exact round trips, refusals of anything else, and a learner's side
that can only ever fail a task."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.grading import plain
from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.split import CollectFailed, split_check


def test_plain_data_round_trips_exactly():
    data = {
        "ints": [0, -(2**70), 3],
        2: (1.5, float("inf"), "✓ text"),
        ("a", 1): None,
        "flags": [True, False],
        "t32": torch.randn(3, 4),
        "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "fp8": torch.randn(5).to(torch.float8_e4m3fn),
        "i64": torch.tensor([2**40, -1]),
        "scalar": torch.tensor(7.0),
        "empty": torch.empty(0, 3),
        "view": torch.arange(12.0).reshape(3, 4).t(),
        "param": torch.nn.Parameter(torch.ones(2)),
        "dtype": torch.float16,
        "size": torch.Size([2, 3]),
    }
    back = plain.roundtrip(data)
    assert (
        back["ints"] == data["ints"] and back[("a", 1)] is None and back["flags"] == [True, False]
    )
    assert back[2][:1] == (1.5,) and math.isinf(back[2][1]) and back[2][2] == "✓ text"
    assert math.isnan(plain.roundtrip(float("nan")))
    for key in ("t32", "bf16", "fp8", "i64", "scalar", "empty", "view"):
        assert back[key].dtype == data[key].dtype and back[key].shape == data[key].shape
        raw = [t.contiguous().reshape(-1).view(torch.uint8) for t in (back[key], data[key])]
        assert torch.equal(*raw)
    assert type(back["param"]) is torch.Tensor and not back["param"].requires_grad
    assert back["dtype"] is torch.float16 and back["size"] == (2, 3)


def test_anything_else_crosses_as_a_description():
    import numpy as np

    class Sneaky:
        def __eq__(self, other):  # would pass any comparison, if it crossed
            return True

        def __repr__(self):
            return "Sneaky()"

    for value, type_name in ((np.int64(3), "numpy.int64"), (Sneaky(), "Sneaky"), ({1, 2}, "set")):
        back = plain.roundtrip(value)
        assert isinstance(back, plain.Opaque) and type_name in back.type_name
        assert back != 3 and not isinstance(back, type(value))
    assert plain.describe(plain.roundtrip(np.int64(3))) == "numpy.int64 np.int64(3)"
    assert plain.describe(16.0) == "float 16.0"


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"__plain__": "tensor", "dtype": "float32", "shape": [2], "data": "AAAA"}', "needs 8"),
        ('{"__plain__": "dtype", "name": "__class__"}', "not a torch dtype"),
        ('{"__plain__": "code", "co": 1}', "unknown tag"),
        ('{"just": "a dict"}', "not data written by"),
        ('{"__plain__": "float", "value": "1e999"}', "expected nan, inf"),
        ("[" * 40 + "]" * 40, "nested deeper"),
        ("not json", "not JSON"),
        ('{"__plain__": "dict", "items": [[{"__plain__": "opaque"}, 1]]}', "dict key"),
    ],
)
def test_anything_not_written_by_encode_is_refused(text, match):
    with pytest.raises(plain.PlainDataError, match=match):
        plain.decode(text)


def test_size_is_bounded(monkeypatch):
    monkeypatch.setattr(plain, "MAX_BYTES", 1000)
    with pytest.raises(plain.PlainDataError, match="at most 1,000 may cross"):
        plain.encode(torch.zeros(1000))
    with pytest.raises(plain.PlainDataError, match="at most 1,000 may cross"):
        plain.decode(" " * 2000)


def _collect(fn, task: int = 7):
    return {"got": run_learner(task, fn, 20)}


def _judge(data, task: int = 7):
    if not isinstance(data, dict) or data.get("got") != 40:
        fail(task, f"double(20) = {data.get('got') if isinstance(data, dict) else data!r}")
    passed(task, "double(20) = 40")


CHECK = split_check(_collect, _judge)


def test_the_self_check_runs_both_halves(capsys):
    CHECK(lambda x: 2 * x)
    assert capsys.readouterr().out.strip() == "✓ task 7: double(20) = 40"
    with pytest.raises(AssertionError, match="✗ task 7: double.20. = 21"):
        CHECK(lambda x: x + 1)
    with pytest.raises(AssertionError, match="not implemented yet"):
        CHECK(lambda x: (_ for _ in ()).throw(NotImplementedError()))
    assert CHECK.task == 7 and CHECK.__name__ == "_collect"  # named after its collect


def test_a_failed_learner_side_crosses_as_a_failure_and_only_fails(capsys):
    failed = CHECK.run_collect(lambda x: 1 / 0)
    assert list(failed) == [CollectFailed.KEY] and failed[CollectFailed.KEY].startswith("✗ task 7")
    for forged in (failed, {CollectFailed.KEY: "✓ task 7: double(20) = 40"}):
        with pytest.raises(AssertionError, match="✗ task 7"):
            CHECK.run_judge(plain.roundtrip(forged))
    CHECK.run_judge(plain.roundtrip(CHECK.run_collect(lambda x: 2 * x)))
    assert capsys.readouterr().out.strip() == "✓ task 7: double(20) = 40"


def test_a_collect_needs_its_task_number():
    with pytest.raises(TypeError, match="collect = .*expected a keyword 'task'"):
        split_check(lambda fn: None, _judge)
