"""One message shape for argument checks (``course_lib.validate``), checked on the source text.

Every ``raise ValueError(...)`` / ``raise TypeError(...)`` in course_lib whose message is a string
literal or an f-string starts ``<parameter> = <value>: expected <what is valid>`` (or the
``<parameter> is ...`` / ``<parameter> must ...`` forms older checks use), so a learner reads the
same sentence wherever a call goes wrong. Errors that are not about an argument are listed in
``NOT_ARGUMENTS`` with the reason: the list may shrink, never grow, and an entry whose raises are
all back in the shape must be removed. The new ``validate`` helpers are tested at the end.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from course_lib import validate

PACKAGE = Path(__file__).resolve().parents[1] / "course_lib"

#: "<parameter> = ", "<parameter> is ", "<parameter> must ", or "<parameter>: expected"; a
#: parameter may be dotted, indexed, a call (``model_fn()``) or a command-line option (``--x``)
SHAPE = re.compile(r"^[\w\[\]\.{}'\"(), *-]+? (= |is |must )|^[\w\[\]\.{}()'\"-]+: expected")

#: "path:function" -> why its messages are not argument checks. Shrink it, never grow it.
NOT_ARGUMENTS: dict[str, str] = {
    "runtime/_payload.py:_pickle_payload": "a pickling failure of what is sent to the ranks",
    "runtime/_rank_server.py:_handle": "an internal protocol error (unknown request kind)",
    "cluster/results.py:_encode": "a value an experiment returned cannot be stored",
    "cluster/results.py:_decode": "a corrupt or foreign results file",
    "cluster/experiment.py:_coerce": "a unit's default of a type settings cannot express",
    "techniques/lora.py:LoRALinear.merge": "the layer's state (a quantized base), not an argument",
}


def _message(call: ast.Call) -> str | None:
    """The message's text with ``{}`` for each f-string field; None when it is not a literal."""
    if not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in arg.values)
    return None


def _raises(path: Path):
    """(function qualified name, line, message) of each ValueError/TypeError raised in a file."""

    def walk(node: ast.AST, scope: list[str]):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from walk(child, scope + [child.name])
                continue
            if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call):
                func = child.exc.func
                if isinstance(func, ast.Name) and func.id in ("ValueError", "TypeError"):
                    text = _message(child.exc)
                    if text is not None:
                        yield ".".join(scope) or "<module>", child.lineno, text
            yield from walk(child, scope)

    yield from walk(ast.parse(path.read_text(), filename=str(path)), [])


def out_of_shape(root: Path = PACKAGE) -> dict[str, list[str]]:
    """ "path:function" -> ["line: message", ...] for every message not in the shape."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for function, line, text in _raises(path):
            if not SHAPE.match(text):
                found.setdefault(f"{rel}:{function}", []).append(f"{line}: {text[:100]!r}")
    return found


def test_argument_checks_share_one_message_shape():
    bad = {k: v for k, v in out_of_shape().items() if k not in NOT_ARGUMENTS}
    assert not bad, (
        "messages not in the shape '<parameter> = <value>: expected ...' (use "
        "course_lib.validate, or write the message in that shape):\n"
        + "\n".join(f"  {k}: {line}" for k, lines in bad.items() for line in lines)
    )


def test_the_list_of_exceptions_only_shrinks():
    stale = sorted(set(NOT_ARGUMENTS) - set(out_of_shape()))
    assert not stale, f"remove these entries from NOT_ARGUMENTS, they are in the shape now: {stale}"


def test_the_check_sees_a_message_out_of_shape(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f(n):\n"
        "    if n < 0:\n"
        "        raise ValueError(f'n = {n}: expected an int >= 0')\n"
        "    raise TypeError(f'bad n {n}')\n"
    )
    assert out_of_shape(tmp_path) == {"m.py:f": ["4: 'bad n {}'"]}


# ------------------------------------------------------------------------------ the helpers
def test_number_finite():
    assert validate.number("peak_flops", 1e15, positive=True, finite=True) == 1e15
    assert validate.number("x", float("inf")) == float("inf")  # allowed unless asked
    with pytest.raises(ValueError, match=r"^inter_GBps = inf: expected a finite number > 0$"):
        validate.number("inter_GBps", float("inf"), positive=True, finite=True)
    with pytest.raises(ValueError, match=r"^x = -inf: expected a finite number$"):
        validate.number("x", float("-inf"), finite=True)


def test_divisible():
    assert validate.divisible("n_embd", 12, "n_head", 4) == 12
    assert validate.divisible("n", np.int64(8), "m", np.int32(4)) == 8
    assert type(validate.divisible("n", np.int64(8), "m", 4)) is int
    with pytest.raises(ValueError) as info:
        validate.divisible("n_embd", 10, "n_head", 4)
    assert str(info.value) == "n_embd = 10: expected a multiple of n_head = 4"
    with pytest.raises(ValueError) as info:
        validate.divisible("numel", 10, "world_size", 4, note="so the formulas are exact")
    assert str(info.value) == (
        "numel = 10: expected a multiple of world_size = 4; so the formulas are exact"
    )
    with pytest.raises(TypeError) as info:
        validate.divisible("n", True, "m", 2)
    assert str(info.value) == "n = True: expected an int, not a bool"
    with pytest.raises(TypeError, match="m = True: expected an int, not a bool"):
        validate.divisible("n", 4, "m", True)
    with pytest.raises(ValueError, match="m = 0: expected an int >= 1"):
        validate.divisible("n", 4, "m", 0)


def test_power_of_two():
    assert [validate.power_of_two("world_size", n) for n in (1, 2, 4, 1024)] == [1, 2, 4, 1024]
    assert validate.power_of_two("world_size", np.int64(8)) == 8
    with pytest.raises(ValueError) as info:
        validate.power_of_two("world_size", 6)
    assert str(info.value) == "world_size = 6: expected a power of two (1, 2, 4, 8, ...)"
    with pytest.raises(ValueError) as info:
        validate.power_of_two("world_size", 3, minimum=2, maximum=16, note="for recursive doubling")
    assert str(info.value) == (
        "world_size = 3: expected a power of two (2, 4, 8, 16); for recursive doubling"
    )
    with pytest.raises(ValueError, match=r"world_size = 0: expected a power of two \(1, 2"):
        validate.power_of_two("world_size", 0, minimum=0)
    with pytest.raises(ValueError, match="world_size = 32: expected an int in 2..16"):
        validate.power_of_two("world_size", 32, minimum=2, maximum=16)
    with pytest.raises(TypeError) as info:
        validate.power_of_two("world_size", True)
    assert str(info.value) == "world_size = True: expected an int, not a bool"
