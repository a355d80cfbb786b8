"""A function defined in a notebook cell runs on 4 ranks, with rank output in the cell."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

CELL_DEFINE = """\
import time
import torch, torch.distributed as dist
import course_lib

def fn(rank, world_size):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print("all_reduce", t.item())
    return t.item()

print(course_lib.launch(fn, 4))
"""

CELL_WARM = """\
t0 = time.perf_counter()
out = course_lib.launch(fn, 2)
print("warm launch fast:", time.perf_counter() - t0 < 0.5, out)
"""

CELL_FAIL = """\
def bad(rank, world_size):
    raise ValueError(f"oops {rank}")
try:
    course_lib.launch(bad, 2)
except course_lib.LaunchError as err:
    print("failed ranks", sorted(err.failures))
print(course_lib.launch(fn, 2))
"""


def _text(cell, name="stdout"):
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == name)


@pytest.mark.timeout(180)
def test_notebook_defined_function(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (CELL_DEFINE, CELL_WARM, CELL_FAIL)]
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    first, warm, fail = nb.cells
    assert (
        _text(first)
        == "".join(f"[rank {r}] all_reduce 10.0\n" for r in range(4)) + "[10.0, 10.0, 10.0, 10.0]\n"
    )
    assert _text(warm).endswith("warm launch fast: True [3.0, 3.0]\n"), _text(warm)
    assert "failed ranks [0, 1]" in _text(fail)
    assert _text(fail).endswith("[3.0, 3.0]\n")  # the kernel is still usable after a failure
