"""A check refuses a learner's function that calls the course's own answer (however it got it)."""

import sys

import pytest
import torch

from course_lib.grading import run_learner, watch_references
from course_lib.measure import estimate
from course_lib.measure.estimate import model_state_bytes as bound_before_the_check
from course_lib.techniques.optim import Adam

REF = "course_lib.measure.estimate.memory:model_state_bytes"


def _refused(task, fn, *args, forbid=REF):
    with pytest.raises(AssertionError) as info:
        run_learner(task, fn, *args, forbid=forbid)
    return str(info.value)


def test_passing_the_reference_itself_is_refused():
    msg = _refused(2, estimate.model_state_bytes, 1000)
    assert msg == "✗ task 2: uses the course's own model_state_bytes: write it yourself"


def test_a_wrapper_or_an_alias_bound_earlier_is_refused():
    assert "uses the course's own" in _refused(1, lambda n: estimate.model_state_bytes(n), 10)
    assert "uses the course's own" in _refused(1, lambda n: bound_before_the_check(n)["total"], 10)


def test_a_subclass_of_a_reference_class_is_refused():
    class MyAdam(Adam):
        pass

    def train(steps):
        w = torch.nn.Parameter(torch.ones(3))
        opt = MyAdam([w], lr=0.1)
        for _ in range(steps):
            w.grad = torch.ones(3)
            opt.step()
        return w

    msg = _refused(4, train, 2, forbid=["course_lib.techniques.optim:Adam"])
    assert msg == "✗ task 4: uses the course's own Adam: write it yourself"


def test_own_code_passes_and_returns_its_value():
    def mine(n):
        return 16 * n

    assert run_learner(1, mine, 10, forbid=[REF, "course_lib.techniques.optim:Adam"]) == 160


def test_stub_and_errors_keep_their_verdicts_under_forbid():
    def stub(n):
        raise NotImplementedError("FILL ME IN")

    assert "not implemented yet" in _refused(3, stub, 1)

    def broken(n):
        raise KeyError("oops")

    assert "raised KeyError" in _refused(3, broken, 1)


def test_a_reference_that_fails_inside_is_still_reported_as_used():
    assert "uses the course's own" in _refused(1, estimate.model_state_bytes, -5)


def test_an_existing_profiler_keeps_its_events_and_is_restored():
    seen = []

    def outer(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(outer)
    try:
        with watch_references([REF]) as used:
            estimate.model_state_bytes(100)
        assert sys.getprofile() is outer
    finally:
        sys.setprofile(None)
    assert used == ["model_state_bytes"]
    assert "model_state_bytes" in seen


def test_switching_off_the_profiler_hides_nothing():
    def sneaky(n):
        sys.setprofile(None)
        return estimate.model_state_bytes(n)["total"]

    assert "uses the course's own" in _refused(1, sneaky, 10)


def test_a_thread_that_calls_the_reference_is_refused():
    import threading

    def threaded(n):
        box = []
        t = threading.Thread(target=lambda: box.append(bound_before_the_check(n)["total"]))
        t.start()
        t.join()
        return box[0]

    assert "uses the course's own" in _refused(1, threaded, 10)


def test_a_default_argument_bound_at_definition_is_refused():
    def hidden(n, _answer=estimate.model_state_bytes):
        return _answer(n)["total"]

    assert "uses the course's own" in _refused(1, hidden, 10)


def test_the_original_code_is_back_after_the_check():
    import inspect

    code = estimate.model_state_bytes.__code__
    with watch_references([REF]):
        assert estimate.model_state_bytes.__code__ is not code  # trapped while the check runs
        assert estimate.model_state_bytes(1000)["total"] == 16000
    assert estimate.model_state_bytes.__code__ is code
    assert "n_params" in str(inspect.signature(estimate.model_state_bytes))


@pytest.mark.parametrize(
    "spec, words",
    [
        ("course_lib.measure.estimate", "expected 'module:qualname'"),
        ("course_lib.measure.estimate:no_such_thing", "has no no_such_thing"),
        ("course_lib.measure.estimate:COLLECTIVES", "no Python code"),
    ],
)
def test_bad_reference_names_are_refused_with_the_fix(spec, words):
    with pytest.raises(ValueError, match=words):
        with watch_references([spec]):
            pass


def test_an_autograd_function_class_is_watched_without_endless_recursion():
    # torch.autograd.Function classes and their generated _backward_cls refer to each other
    from course_lib.grading.references import reference_codes

    codes = reference_codes(["course_lib.parallel.tensor.comms:ReduceFromTensorParallelRegion"])
    assert {c.co_name for c in codes} == {"forward", "backward"}


def test_the_package_ships_no_way_to_recompile_the_courses_answers():
    # A copy of a reference compiled anew has new code objects the watch does not know: such a
    # helper lives in tests/_rewritten.py, never in the package a learner imports.
    import ast
    from pathlib import Path

    import course_lib.grading.references as references

    assert not hasattr(references, "rewritten")
    root = Path(references.__file__).parents[1]
    offenders = []
    for path in root.rglob("*.py"):
        nodes = list(ast.walk(ast.parse(path.read_text())))
        reads_source = any(isinstance(n, ast.Attribute) and n.attr == "getsource" for n in nodes)
        compiles = any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "compile"
            for n in nodes
        )
        if reads_source and compiles:  # the builtin compile() of a module's own source
            offenders.append(str(path.relative_to(root)))
    assert offenders == []
