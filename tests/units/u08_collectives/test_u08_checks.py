"""Unit 08's graded checks accept the reference and reject wrong answers."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_lib.grading.references import rewritten

# the course's rings as a learner would have written them: same code, compiled anew (the checks
# refuse the course's own functions)
C = rewritten("course_lib.parallel.collectives")

NUMELS = (1, 7, 1001)
DTYPES = (torch.float32, torch.float64)




# --------------------------------------------------------------------------------------------
# the graded checks of unit 08 accept the reference and reject wrong answers
# --------------------------------------------------------------------------------------------
def _stub_all_reduce(tensor):
    raise NotImplementedError("FILL ME IN (roughly 20 lines)")


def _library_all_reduce(tensor):
    dist.all_reduce(tensor)  # right values, but not built from send/recv
    return tensor


def _half_gather(output, input):
    C.ring_all_gather(output, input)
    if dist.get_rank() == 1:
        output.zero_()  # wrong on one rank only


def test_checks_pass_for_the_reference_implementations(capsys):
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_ring_all_reduce(C.ring_all_reduce)
    unit08.check_ring_all_gather(C.ring_all_gather, task=2)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("✓ task 1: ring all-reduce matches dist.all_reduce")
    assert lines[1].startswith("✓ task 2: ring all-gather equals")


def test_checks_reject_stub_library_call_naive_ring_and_wrong_rank():
    from course_lib.units.u08_collectives import checks as unit08

    with pytest.raises(AssertionError, match="✗ task 1: not implemented yet"):
        unit08.check_ring_all_reduce(_stub_all_reduce)
    with pytest.raises(AssertionError, match="only point-to-point"):
        unit08.check_ring_all_reduce(_library_all_reduce)
    with pytest.raises(AssertionError, match=r"2\(N-1\)/N \* S"):
        unit08.check_ring_all_reduce(C.naive_ring_all_reduce)  # right sums, (N-1) S bytes
    with pytest.raises(AssertionError, match="differs from torch.distributed on rank 1"):
        unit08.check_ring_all_gather(_half_gather, task=2)


def test_composite_bytes_check():
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_composite_bytes(lambda s, n: 2 * (n - 1) * s / n)
    with pytest.raises(AssertionError, match="✗ task 3: for S"):
        unit08.check_composite_bytes(lambda s, n: 2 * s)
    with pytest.raises(AssertionError, match="not implemented yet"):
        unit08.check_composite_bytes(lambda s, n: _stub_all_reduce(s))
