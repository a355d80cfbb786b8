"""Faults found driving %%ranks through a real kernel (issue 26, items 10-13): an interrupted
first start, notebook values named like the ranks' own, a rank killed mid-cell, values that
cannot be pickled. One kernel serves the module, with a private temporary directory so that a
work directory left behind shows; the tests run in file order (the first needs a cold start).
"""

from __future__ import annotations

import os
import textwrap
import time

import psutil
import pytest
from _kernel import Kernel, wait_for

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def nb(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks_faults")
    (root / "tmp").mkdir()
    k = Kernel(root, {"TMPDIR": str(root / "tmp")})
    k.tmp = root / "tmp"
    try:
        setup = k.run("%load_ext course_lib.ranks\nfrom course_lib import ranks", timeout=60)
        assert setup.error is None, setup.text
        yield k
    finally:
        k.close()


def _ranks_running(kernel) -> list[str]:
    """The kernel's live descendants other than multiprocessing's resource tracker."""
    alive = []
    for p in kernel.descendants():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in str(p.cmdline()):
                alive.append(" ".join(p.cmdline()))
        except psutil.Error:
            pass
    return alive


def _one_line(result) -> str:
    """The error a cell showed, which must be one line (no traceback)."""
    assert result.error is not None, result.text
    lines = result.traceback.strip().splitlines()
    assert len(lines) == 1, result.traceback
    return lines[0]


def test_interrupting_a_first_start_is_a_keyboard_interrupt_and_leaves_nothing(nb):
    nb.start("%ranks start 4")  # cold: the forkserver is importing torch

    def forkserver_started():
        return any("forkserver" in " ".join(p.cmdline()) for p in nb.descendants())

    assert wait_for(forkserver_started, 30)
    time.sleep(1.0)  # as a person would: the server is importing torch by now
    nb.interrupt()
    result = nb.collect(timeout=60)
    late = nb.drain(1.0)  # what a dying server printed may arrive after the cell ended
    assert result.finished, result.text
    assert result.error is not None and result.error[0] == "KeyboardInterrupt", result.text
    assert _one_line(result).startswith("KeyboardInterrupt: %ranks start 4 was interrupted")
    shown = result.stdout + result.stderr + late
    assert "EOFError" not in shown and "Traceback" not in shown, shown
    assert wait_for(lambda: _ranks_running(nb) == [], 5), _ranks_running(nb)
    assert not [n for n in os.listdir(nb.tmp) if n.startswith("course_lib_launch_")]
    assert nb.run("%ranks status").stdout.startswith("no ranks running")


def test_notebook_values_never_replace_the_ranks_own_names(nb):
    assert nb.run("%ranks start 2 --timeout 20", timeout=90).error is None
    defined = nb.run("rank = 0\nworld_size = 4\ndevice = 'cuda:3'\nLR = 0.5")
    assert defined.error is None, defined.text
    result = nb.run(
        textwrap.dedent("""\
        %%ranks
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        t.item(), world_size, str(device) != "cuda:3", LR
    """)
    )
    assert result.error is None, result.text
    assert result.stdout == "".join(f"[rank {r}] Out: (1.0, 2, True, 0.5)\n" for r in (0, 1))
    notes = result.stderr.strip().splitlines()
    assert len(notes) == 3, result.stderr  # one line for each refused value, shown once
    assert "rank = 0: refused, `rank` is its own rank number in each rank" in notes[0], notes
    assert "world_size = 4: refused" in notes[1] and "device = 'cuda:3': refused" in notes[2]
    again = nb.run("%%ranks 1\nrank")
    assert again.stdout == "[rank 1] Out: 1\n" and again.stderr == "", again.text
    # a rank's own cell may still change them; that stays the rank's choice
    mine = nb.run("%%ranks\nworld_size = 7\nimport torch\nworld_size")
    assert mine.stdout == "[rank 0] Out: 7\n[rank 1] Out: 7\n", mine.text
    nb.run("%%ranks\nworld_size = 2")
    refused = nb.run("ranks.push(rank=3)")
    assert _one_line(refused).startswith(
        "RanksUsageError: ranks.push: rank = 3: expected a name the ranks do not define"
    )
    # the modules the ranks bind: a notebook name `dist` or `torch` stays in the notebook
    modules = nb.run("dist = 'not torch.distributed'\ntorch = 7")
    assert modules.error is None, modules.text
    kept = nb.run("%%ranks\ndist.get_world_size(), torch.__name__")
    assert kept.stdout == "[rank 0] Out: (2, 'torch')\n[rank 1] Out: (2, 'torch')\n", kept.text
    notes = kept.stderr.strip().splitlines()
    assert len(notes) == 2 and "`dist` is torch.distributed in each rank" in notes[0], notes
    assert "torch = 7: refused, `torch` is the torch module" in notes[1], notes
    nb.run("import torch\nimport torch.distributed as dist")  # the module's later tests use them


def test_values_that_cannot_be_pickled_are_named_in_one_line(nb):
    nb.run("import threading\nlock = threading.Lock()")
    pushed = nb.run("ranks.push(lr=0.1, lock=lock)")
    line = _one_line(pushed)
    assert line.startswith("RanksUsageError: ranks.push: lock = <unlocked _thread.lock"), line
    assert "expected a value that can be pickled to send to the ranks" in line, line
    assert "cannot pickle '_thread.lock' object" in line, line
    assert nb.run("%%ranks 0\n'lr' in globals()").stdout == "[rank 0] Out: False\n"  # none sent
    made = nb.run("%%ranks\nimport threading\nheld = threading.Lock()")
    assert made.error is None, made.text
    gathered = nb.run("ranks.gather('held')")
    line = _one_line(gathered)
    assert line.startswith(
        "RanksUsageError: ranks.gather: expression = 'held': expected a value that can be "
        "pickled to send back to the kernel; its value, a lock, cannot be"
    ), line
    assert line.endswith("(on ranks [0, 1])"), line
    assert nb.run("print(ranks.gather('rank'))").stdout == "[0, 1]\n"  # the set is still usable


def test_a_rank_killed_mid_cell_is_reported_with_what_each_peer_did(nb):
    assert nb.run("%ranks stop\n%ranks start 3 --timeout 30", timeout=90).error is None
    t0 = time.monotonic()
    result = nb.run(
        textwrap.dedent("""\
        %%ranks
        import os, signal, time
        if rank == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        elif rank == 2:
            time.sleep(30)
        rank
    """),
        timeout=60,
    )
    assert time.monotonic() - t0 < 8, result.text
    assert result.error is not None and result.error[0] == "RanksError", result.text
    text = result.traceback
    assert "rank 1 died during the cell. What each rank did:" in text, text
    assert "rank 0: finished the cell" in text
    assert "rank 1: was killed by signal SIGKILL" in text
    assert "rank 2: was still running the cell when rank 1 died: interrupted" in text
    assert "time.sleep(30)" in text  # where it was when interrupted
    assert "did not stop within" not in text and "stuck in C++" not in text, text
    assert "%ranks restart" in text
    assert wait_for(lambda: [c for c in _ranks_running(nb) if "forkserver" not in c] == [], 5)
