"""Plain data across the grading wall: what a learner's code hands back to the judge.

A graded check is split in two (:mod:`course_lib.grading.split`): the part that calls the
learner's code runs inside the sandbox and returns *plain data*; the judge, outside, reads it.
This module is the only way that data crosses: :func:`encode` turns it into JSON text and
:func:`decode` reads it back, building nothing but

- ``None``, ``bool``, ``int``, ``float`` (``nan`` and ``±inf`` included), ``str``;
- ``list``, ``tuple`` and ``dict`` of them (keys: ``str``, ``int``, ``float``, ``bool``, ``None``
  or tuples of those);
- dense CPU ``torch.Tensor`` (dtype, shape and the raw bytes; no autograd history) and
  ``torch.dtype``, ``torch.Size`` (read back as a tuple);
- :class:`Opaque` for anything else: the type's name and the first 200 characters of its
  ``repr`` as text, so the judge can say *what* came back ("must be an int, got numpy.int64 3")
  without ever holding the object.

No pickle, no code object, no import of anything the learner wrote: the decoder builds the
objects above from JSON alone, within a size and a nesting limit (:class:`PlainDataError`
otherwise).

What every unit's checks share at the wall lives here too: :func:`learner_value` and
:func:`learner_number` (a learner's numbers, of numpy's types too, as the plain ints and floats
the judges compare), :func:`type_name` (what type came back, as the judge names it), and a
find-the-bug diagnosis (:func:`bug_data` on the learner's side,
:func:`judge_bug` on the judge's).
"""

from __future__ import annotations

import base64
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LEARNER_DEPTH",
    "MAX_BYTES",
    "MAX_DEPTH",
    "Opaque",
    "PlainDataError",
    "bug_data",
    "decode",
    "describe",
    "encode",
    "judge_bug",
    "learner_number",
    "learner_value",
    "roundtrip",
    "type_name",
]

#: the most a task's data may take once encoded (a check hands back results, not datasets)
MAX_BYTES = 64 * 1024 * 1024
#: the deepest nesting of lists, tuples and dicts
MAX_DEPTH = 32

_TAG = "__plain__"


class PlainDataError(ValueError):
    """Data that cannot cross the wall: too big, too deep, or not what :func:`encode` writes."""


@dataclass(frozen=True)
class Opaque:
    """Something that is not plain data, as the judge sees it: its type's name and its repr."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return self.text


def _torch():
    import torch

    return torch


def _is_tensor(obj: Any) -> bool:
    torch = _torch_if_loaded()
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_if_loaded():
    import sys

    return sys.modules.get("torch")


def _opaque(obj: Any) -> dict:
    kind = type(obj)
    name = (
        f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__name__
    )
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a learner's __repr__ may raise
        text = f"<{name}>"
    return {_TAG: "opaque", "type": name[:200], "repr": str(text)[:200]}


def _float(value: float) -> Any:
    if math.isfinite(value):
        return value
    return {_TAG: "float", "value": repr(value)}


def _to_json(obj: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PlainDataError(f"data nested deeper than {MAX_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, str)):
        return obj if not isinstance(obj, str) or type(obj) is str else str(obj)
    if type(obj) is int:
        return obj
    if type(obj) is float:
        return _float(obj)
    if type(obj) in (list, tuple):
        items = [_to_json(item, depth + 1) for item in obj]
        return items if type(obj) is list else {_TAG: "tuple", "items": items}
    if type(obj) is dict:
        pairs = [[_to_json(k, depth + 1), _to_json(v, depth + 1)] for k, v in obj.items()]
        return {_TAG: "dict", "items": pairs}
    torch = _torch_if_loaded()
    if torch is not None:
        if isinstance(obj, torch.Size):
            return {_TAG: "tuple", "items": [int(n) for n in obj]}
        if isinstance(obj, torch.dtype):
            return {_TAG: "dtype", "name": str(obj).removeprefix("torch.")}
        if type(obj) in (torch.Tensor, torch.nn.Parameter):
            return _tensor_json(obj)
    return _opaque(obj)


def _tensor_json(t: Any) -> Any:
    torch = _torch()
    if t.layout != torch.strided or t.device.type == "meta" or t.is_quantized:
        return _opaque(t)
    data = t.detach().to("cpu").contiguous()
    payload = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return {
        _TAG: "tensor",
        "dtype": str(data.dtype).removeprefix("torch."),
        "shape": list(data.shape),
        "data": base64.b64encode(payload).decode("ascii"),
    }


def encode(obj: Any) -> str:
    """``obj`` as JSON text; anything not plain becomes an :class:`Opaque` on the other side."""
    text = json.dumps(_to_json(obj, 0), ensure_ascii=True, allow_nan=False)
    if len(text) > MAX_BYTES:
        raise PlainDataError(
            f"the data handed back takes {len(text):,} bytes encoded; at most {MAX_BYTES:,} may cross"
        )
    return text


# --------------------------------------------------------------------------- reading back
_KEY_TYPES = (type(None), bool, int, float, str)


def _key(value: Any) -> Any:
    if isinstance(value, _KEY_TYPES):
        return value
    if isinstance(value, tuple) and all(isinstance(v, _KEY_TYPES) for v in value):
        return value
    raise PlainDataError(f"a dict key must be a number, a string or a tuple of them, not {value!r}")


def _from_json(node: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PlainDataError(f"data nested deeper than {MAX_DEPTH} levels")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_from_json(item, depth + 1) for item in node]
    if not isinstance(node, dict) or not isinstance(node.get(_TAG), str):
        raise PlainDataError("not data written by course_lib.grading.plain.encode")
    kind = node[_TAG]
    if kind == "tuple":
        return tuple(_from_json(item, depth + 1) for item in _list(node, "items"))
    if kind == "dict":
        out = {}
        for pair in _list(node, "items"):
            if not isinstance(pair, list) or len(pair) != 2:
                raise PlainDataError("a dict entry must be a [key, value] pair")
            out[_key(_from_json(pair[0], depth + 1))] = _from_json(pair[1], depth + 1)
        return out
    if kind == "float":
        text = node.get("value")
        if text not in ("nan", "inf", "-inf"):
            raise PlainDataError(f"a float tag holds {text!r}; expected nan, inf or -inf")
        return float(text)
    if kind == "opaque":
        return Opaque(str(node.get("type", "?"))[:200], str(node.get("repr", ""))[:200])
    if kind == "dtype":
        return _dtype(node.get("name"))
    if kind == "tensor":
        return _tensor(node)
    raise PlainDataError(f"unknown tag {kind!r}")


def _list(node: dict, key: str) -> list:
    items = node.get(key)
    if not isinstance(items, list):
        raise PlainDataError(f"a {node[_TAG]} tag needs a list under {key!r}")
    return items


def _dtype(name: Any) -> Any:
    torch = _torch()
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise PlainDataError(f"{name!r} is not a torch dtype")
    return dtype


def _tensor(node: dict) -> Any:
    torch = _torch()
    dtype = _dtype(node.get("dtype"))
    shape = node.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise PlainDataError(f"a tensor's shape must be a list of sizes, got {shape!r}")
    try:
        raw = base64.b64decode(node.get("data", ""), validate=True)
    except (ValueError, TypeError):
        raise PlainDataError("a tensor's data is not base64") from None
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise PlainDataError(
            f"a tensor of shape {tuple(shape)} and dtype {dtype} needs {numel * itemsize} bytes, "
            f"got {len(raw)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).clone()


def decode(text: str | bytes) -> Any:
    """What :func:`encode` wrote, rebuilt (see the module doc); :class:`PlainDataError` for
    anything else."""
    if len(text) > MAX_BYTES:
        raise PlainDataError(f"{len(text):,} bytes of data; at most {MAX_BYTES:,} may cross")
    try:
        node = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PlainDataError(f"the data is not JSON: {str(exc)[:120]}") from None
    return _from_json(node, 0)


def roundtrip(obj: Any) -> Any:
    """``decode(encode(obj))``: what the judge would see of ``obj``."""
    return decode(encode(obj))


def describe(value: Any) -> str:
    """``"float 16.0"``, ``"numpy.int64 3"``: a value's type and repr, for a ✗ message."""
    if isinstance(value, Opaque):
        return f"{value.type_name} {value.text}"
    if isinstance(value, numbers.Number) or isinstance(value, (str, type(None))):
        return f"{type(value).__name__} {value!r}"
    return f"{type(value).__name__} {value!r}"[:200]


def type_name(value: Any, *, short: bool = False) -> str:
    """The name of the type the learner's code made, on either side of the wall: an
    :class:`Opaque`'s ``type_name`` (``"numpy.int64"``; ``short``: the last part, ``"int64"``),
    anything else's ``type(value).__name__``."""
    if isinstance(value, Opaque):
        return value.type_name.rsplit(".", 1)[-1] if short else value.type_name
    return type(value).__name__


# --------------------------------------------------------------------------- a learner's values
#: how many levels of containers :func:`learner_value` reads by default
LEARNER_DEPTH = 8


def learner_number(value: Any, *, builtin_only: bool = False) -> Any:
    """A learner's number as the plain ``int`` or ``float`` it equals (what the learner's side of
    a check hands back); anything else (``bool`` and ``None`` included) as it is.

    By default a number of any numeric type counts: numpy's ``int64`` becomes an ``int``,
    ``float32`` a ``float``. With ``builtin_only`` only subclasses of ``int`` and ``float`` do
    (numpy's ``float64`` is one); numpy's integers then stay as they are, cross as a description
    and fail a judge that asks for an ``int`` or a ``float``, as in the checks that took
    ``isinstance(x, (int, float))`` before they were split. A number type whose conversion
    raises stays as it is too."""
    if isinstance(value, bool) or type(value) in (int, float):
        return value
    integral, real = (int, float) if builtin_only else (numbers.Integral, numbers.Real)
    try:
        if isinstance(value, integral):
            return int(value)
        if isinstance(value, real):
            return float(value)
    except Exception:  # noqa: BLE001 - a learner's number type may refuse; it crosses as is
        return value
    return value


def learner_value(value: Any, depth: int = LEARNER_DEPTH, *, builtin_only: bool = False) -> Any:
    """A learner's output as plain data, read as the checks always read it: a number as
    :func:`learner_number` reads it; a tuple, list or dict (their subclasses too: a namedtuple
    becomes a tuple) item by item, down to ``depth`` levels of containers (deeper ones stay as
    they are), a dict's keys made plain (a number, a string or None; any other key becomes its
    repr); anything else as it is (what is not plain crosses as a description)."""
    if depth > 0 and isinstance(value, (tuple, list)):
        items = [learner_value(v, depth - 1, builtin_only=builtin_only) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if depth > 0 and isinstance(value, dict):
        return {
            _learner_key(k, builtin_only): learner_value(v, depth - 1, builtin_only=builtin_only)
            for k, v in value.items()
        }
    return learner_number(value, builtin_only=builtin_only)


def _learner_key(key: Any, builtin_only: bool) -> Any:
    plain = learner_number(key, builtin_only=builtin_only)
    if isinstance(plain, (type(None), bool, int, float, str)):
        return plain
    try:
        return repr(key)[:200]  # a key plain data cannot hold: the judge sees its repr
    except Exception:  # noqa: BLE001 - a learner's __repr__ may raise
        return f"<{type(key).__name__}>"


# --------------------------------------------------------------------------- find-the-bug tasks
def bug_data(bug: Any) -> dict[str, Any]:
    """The learner's diagnosis of a find-the-bug task as plain data: ``{"bug": the letter (a
    str; None when it is not one), "bug_repr": how it reads (its repr, 200 characters)}``."""
    try:
        shown = repr(bug)[:200]
    except Exception:  # noqa: BLE001 - a learner's __repr__ may raise
        shown = f"<{type(bug).__name__}>"
    return {"bug": str(bug) if isinstance(bug, str) else None, "bug_repr": shown}


def judge_bug(task: int, data: Any, choices: dict[str, str], right: str, wrong: str) -> None:
    """The judge's reading of :func:`bug_data` in ``data``: nothing when the letter (stripped,
    any case) is ``right``; otherwise the ✗ verdict "bug must be one of [...], got <repr>" when
    it is not one of ``choices``, or "bug <repr> (<what that choice says>): <wrong>" (the judge
    trusts nothing it is handed)."""
    from course_lib.grading.verdicts import fail

    bug = data.get("bug") if isinstance(data, dict) else None
    shown = data.get("bug_repr") if isinstance(data, dict) else None
    shown = repr(bug) if isinstance(bug, str) else str(shown)[:200]
    key = bug.strip().lower() if isinstance(bug, str) else None
    if key is None or key not in choices:
        fail(task, f"bug must be one of {sorted(choices)}, got {shown}")
    if key != right:
        fail(task, f"bug {shown} ({choices[key]}): {wrong}")
