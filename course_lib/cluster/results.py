"""The results file an exported script writes and a notebook loads: JSON, exact round trip.

A unit's experiment returns what the notebook gets from it: a pandas DataFrame (with its
``attrs``), or dicts and lists of numbers, strings, tensors, DataFrames and the course's config
dataclasses. :func:`dumps` writes them as plain JSON with a few tagged objects, so the file can be
read by any tool, and :func:`loads` gives back values equal to the originals: float64 round-trips
exactly (Python writes the shortest repr that reads back to the same double), tensors keep their
dtype and shape, DataFrames their column dtypes, index and ``attrs``, tuples stay tuples.

Tags (an object with exactly one of these keys): ``__tuple__``, ``__tensor__``, ``__dataframe__``,
``__dataclass__`` (only classes defined in course_lib are rebuilt), ``__dtype__``, ``__dict__``
(a dict whose keys are not all strings).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

FORMAT = "course_lib.cluster/1"


def _encode(obj: Any) -> Any:
    import numpy as np
    import pandas as pd
    import torch

    if obj is None or isinstance(obj, (bool, str, int, float)):
        return obj
    if isinstance(obj, np.generic):
        return _encode(obj.item())
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return {
            "__tensor__": {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "data": t.reshape(-1).tolist(),
            }
        }
    if isinstance(obj, pd.DataFrame):
        return {"__dataframe__": _encode_frame(obj)}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (
            len(obj) == 1 and next(iter(obj)).startswith("__")
        ):
            return {k: _encode(v) for k, v in obj.items()}
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in obj.items()]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {
            "__dataclass__": {
                "class": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
            }
        }
    if isinstance(obj, pd.Series):
        raise TypeError("a pandas Series in a result: return series.to_frame() instead")
    raise TypeError(
        f"cannot store a {type(obj).__module__}.{type(obj).__qualname__} in a results "
        "file: return numbers, strings, lists, dicts, tensors or DataFrames"
    )


def _encode_frame(df: Any) -> dict[str, Any]:
    return {
        "columns": [_encode(c) for c in df.columns],
        "dtypes": [str(d) for d in df.dtypes],
        "index": [_encode(i) for i in df.index],
        "index_name": _encode(df.index.name),
        "data": [[_encode(v) for v in row] for row in df.itertuples(index=False, name=None)],
        "attrs": _encode(dict(df.attrs)),
    }


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((key, val),) = obj.items()
        if key == "__tuple__":
            return tuple(_decode(v) for v in val)
        if key == "__dict__":
            return {_freeze(_decode(k)): _decode(v) for k, v in val}
        if key == "__dtype__":
            import torch

            return getattr(torch, val)
        if key == "__tensor__":
            import torch

            dtype = getattr(torch, val["dtype"])
            return torch.tensor(val["data"], dtype=dtype).reshape(val["shape"])
        if key == "__dataframe__":
            return _decode_frame(val)
        if key == "__dataclass__":
            module, _, qualname = val["class"].partition(":")
            if module.split(".")[0] != "course_lib":
                raise ValueError(
                    f"results file names the class {val['class']}: only course_lib's "
                    "own dataclasses are rebuilt from a results file"
                )
            cls: Any = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            return cls(**{k: _decode(v) for k, v in val["fields"].items()})
    return {k: _decode(v) for k, v in obj.items()}


def _freeze(key: Any) -> Any:
    return tuple(_freeze(k) for k in key) if isinstance(key, list) else key


def _decode_frame(val: dict[str, Any]) -> pd.DataFrame:
    import pandas as pd

    columns = [_decode(c) for c in val["columns"]]
    rows = [[_decode(v) for v in row] for row in val["data"]]
    df = (
        pd.DataFrame.from_records(rows, columns=range(len(columns)))
        if rows
        else pd.DataFrame({i: [] for i in range(len(columns))})
    )
    df.columns = columns
    for i, dtype in enumerate(val["dtypes"]):
        if dtype != "object":
            df.isetitem(i, df.iloc[:, i].astype(dtype))
    index = [_decode(i) for i in val["index"]]
    if index != list(range(len(df))):
        df.index = pd.Index(index, name=_decode(val["index_name"]))
    else:
        df.index.name = _decode(val["index_name"])
    df.attrs.update(_decode(val["attrs"]))
    return df


def dumps(value: Any, meta: dict[str, Any] | None = None) -> str:
    """The JSON text of a results file: ``{"format", "meta", "value"}``."""
    return json.dumps(
        {"format": FORMAT, "meta": _encode(meta or {}), "value": _encode(value)},
        indent=1,
        allow_nan=True,
    )


def loads(text: str) -> tuple[Any, dict[str, Any]]:
    """``(value, meta)`` from the text :func:`dumps` wrote."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(
            f"format = {found!r}: expected {FORMAT!r} (a file written by an exported "
            "course_lib.cluster script)"
        )
    return _decode(doc["value"]), _decode(doc["meta"])


def write_atomic(path: str | os.PathLike[str], text: str) -> pathlib.Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename, so a
    reader never sees half a file (a job killed mid-write leaves the old file or none)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def differences(a: Any, b: Any, *, ignore: tuple[str, ...] = (), where: str = "value") -> list[str]:
    """Where ``a`` and ``b`` differ, as readable lines (empty: equal). Exact comparison: floats,
    tensors (dtype, shape and every element; NaN equals NaN), DataFrames (columns, dtypes,
    index, every cell, attrs). Columns and dict keys named in ``ignore`` (measured times, which
    differ from run to run) are skipped."""
    import pandas as pd
    import torch

    out: list[str] = []
    if isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame):
        return _frame_differences(a, b, ignore, where)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _tensor_differences(a, b, where)
    if isinstance(a, dict) and isinstance(b, dict):
        ka = [k for k in a if k not in ignore]
        kb = [k for k in b if k not in ignore]
        if ka != kb:
            return [f"{where}: keys {ka} != {kb}"]
        for k in ka:
            out += differences(a[k], b[k], ignore=ignore, where=f"{where}[{k!r}]")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [f"{where}: {type(a).__name__} of {len(a)} != {type(b).__name__} of {len(b)}"]
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, ignore=ignore, where=f"{where}[{i}]")
        return out
    if _is_instance_of_dataclass(a) and _is_instance_of_dataclass(b):
        if type(a) is not type(b):
            return [f"{where}: {type(a).__name__} != {type(b).__name__}"]
        return differences(dataclasses.asdict(a), dataclasses.asdict(b), ignore=ignore, where=where)
    both_nan = isinstance(a, float) and isinstance(b, float) and a != a and b != b
    if both_nan:
        return []
    if type(a) is not type(b) and not (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return [f"{where}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _is_instance_of_dataclass(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _frame_differences(a: Any, b: Any, ignore: tuple[str, ...], where: str) -> list[str]:
    ca = [c for c in a.columns if c not in ignore]
    cb = [c for c in b.columns if c not in ignore]
    if ca != cb:
        return [f"{where}: columns {ca} != {cb}"]
    if list(a.index) != list(b.index):
        return [f"{where}: index {list(a.index)[:8]}... != {list(b.index)[:8]}..."]
    out: list[str] = []
    for c in ca:
        if str(a[c].dtype) != str(b[c].dtype):
            out.append(f"{where}[{c!r}]: dtype {a[c].dtype} != {b[c].dtype}")
            continue
        for i, (x, y) in enumerate(zip(a[c].tolist(), b[c].tolist())):
            out += differences(x, y, ignore=ignore, where=f"{where}[{c!r}][row {i}]")
    out += differences(dict(a.attrs), dict(b.attrs), ignore=ignore, where=f"{where}.attrs")
    return out


def _tensor_differences(a: Any, b: Any, where: str) -> list[str]:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return [f"{where}: tensor {a.dtype} {tuple(a.shape)} != {b.dtype} {tuple(b.shape)}"]
    same = (
        torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())
        if a.is_floating_point()
        else torch.equal(a, b)
    )
    if same:
        return []
    return [
        f"{where}: tensors differ (max |diff| {(a.double() - b.double()).abs().max().item():.3g})"
    ]
