"""An interrupt during the first launch (or a cold ``%ranks start``) of a fresh kernel (issue 47,
item 3): the first 1-3 s of either is the kernel's own deferred ``import torch``. An interrupt that
landed there left torch half-imported, and every later launch failed ("partially initialized
module 'torch'", "Only a single TORCH_LIBRARY can be used") until the kernel was restarted.

Each case starts a fresh kernel (torch not imported yet), runs the first launch, presses
"interrupt kernel" ``delay`` s later, and checks that the cell ended with a one-line
KeyboardInterrupt and that the next launch works.
"""

from __future__ import annotations

import time

import pytest
from _kernel import Kernel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DELAYS = (0.1, 0.3, 0.5, 1.0, 1.5)

LAUNCH_SETUP = """\
import sys
import course_lib

def ok(rank, world_size):
    return rank

print("torch imported:", "torch" in sys.modules)
"""

RANKS_SETUP = """\
import sys
%load_ext course_lib.ranks
print("torch imported:", "torch" in sys.modules)
"""


def _interrupt_first(tmp_path, setup: str, first: str, then: str, delay: float):
    """(the interrupted cell, what it printed late, the next cell) in a fresh kernel."""
    kernel = Kernel(tmp_path, {"TMPDIR": str(tmp_path)})
    try:
        ready = kernel.run(setup, timeout=60)
        assert "torch imported: False" in ready.stdout, ready.text  # the import is still to come
        kernel.start(first)
        time.sleep(delay)
        kernel.interrupt()
        interrupted = kernel.collect(timeout=60)
        late = kernel.drain(0.5)  # what a dying helper process printed after the cell ended
        return interrupted, late, kernel.run(then, timeout=120)
    finally:
        kernel.close()


def _assert_one_line_interrupt(cell, late: str, starts: str) -> None:
    assert cell.finished, cell.text
    assert cell.error is not None and cell.error[0] == "KeyboardInterrupt", cell.text
    lines = cell.traceback.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), cell.traceback
    shown = cell.stdout + cell.stderr + late
    assert "Traceback" not in shown, shown


@pytest.mark.parametrize("delay", DELAYS)
def test_an_interrupted_first_launch_leaves_a_kernel_whose_next_launch_works(tmp_path, delay):
    interrupted, late, after = _interrupt_first(
        tmp_path,
        LAUNCH_SETUP,
        "course_lib.launch(ok, 2)",
        "print('after', course_lib.launch(ok, 2))",
        delay,
    )
    _assert_one_line_interrupt(interrupted, late, "KeyboardInterrupt: ")
    assert after.error is None and "after [0, 1]" in after.stdout, after.text


@pytest.mark.parametrize("delay", DELAYS)
def test_an_interrupted_cold_ranks_start_leaves_a_kernel_whose_next_start_works(tmp_path, delay):
    interrupted, late, after = _interrupt_first(
        tmp_path,
        RANKS_SETUP,
        "%ranks start 2",
        "%ranks start 2\n%ranks stop",
        delay,
    )
    _assert_one_line_interrupt(
        interrupted, late, "KeyboardInterrupt: %ranks start 2 was interrupted"
    )
    assert after.error is None and after.stdout.startswith("2 ranks running"), after.text
