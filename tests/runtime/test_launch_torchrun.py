"""Under torchrun, launch() runs fn on this rank and all-gathers the results."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, torch, torch.distributed as dist, course_lib

def fn(rank, world_size, base):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return base + t.item() + rank

def bad(rank, world_size):
    if rank == 1:
        raise ValueError("only rank 1")
    return rank

if __name__ == "__main__":
    lines = []
    out = course_lib.launch(fn, 2, 10.0)
    lines.append(f"RESULT {dist.is_initialized()} {out}")
    try:
        course_lib.launch(bad, 2)
    except course_lib.LaunchError as err:
        lines.append(f"FAILED {sorted(err.failures)} {'only rank 1' in err.failures[1]}")
    try:
        course_lib.launch(fn, 3, 0.0)
    except ValueError as err:
        lines.append(f"WRONG_WORLD {'WORLD_SIZE=2' in str(err)}")
    lines.append(f"AGAIN {course_lib.launch(fn, 2, 0.0)}")  # the group is reused, not re-created
    with open(f"rank{os.environ['RANK']}.txt", "w") as f:  # one file per rank: no interleaving
        f.write("\\n".join(lines) + "\\n")
"""


@pytest.mark.timeout(120)
def test_launch_under_torchrun(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each of the two processes gets the full, rank-ordered result list
    expected = "RESULT True [11.0, 12.0]\nFAILED [1] True\nWRONG_WORLD True\nAGAIN [1.0, 2.0]\n"
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == expected
