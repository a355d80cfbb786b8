"""The grader's zygote: a warm forkserver for units that launch ranks, and nothing left behind."""

from __future__ import annotations

import time

import psutil
import pytest

from course_lib.grading.isolate import CheckJob
from course_lib.grading.zygote import Zygote
from course_lib.runtime.reap import descendants, no_process_left

pytestmark = pytest.mark.timeout(120)


def _zombies() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() == "zombie"]


@pytest.mark.parametrize("used", [False, True], ids=["closed unused", "ran no job"])
def test_a_zygote_leaves_no_process_and_no_zombie_here(tmp_path, used):
    """Closed while it waits (the learner's kernel died, or timed out) or after an empty run: its
    warm forkserver and resource tracker die with it. Inside no_process_left this process is a
    subreaper, so they are re-parented here: they must be reaped, not left as zombies that later
    tests would count as leaked ranks."""
    before = set(descendants(psutil.Process().pid))
    zombies_before = set(_zombies())  # an earlier test's, if any, are that test's failure
    with no_process_left():
        zygote = Zygote("course_lib.units.u09_data_parallelism", cwd=tmp_path, seed=0)
        deadline = time.monotonic() + 60
        while len(descendants(zygote.proc.pid)) < 2:  # the forkserver and the resource tracker
            assert time.monotonic() < deadline, "the zygote started no forkserver"
            time.sleep(0.05)
        if used:
            assert zygote.run([], timeout=30) == []
        zygote.close()
    assert set(_zombies()) - zombies_before == set()
    assert set(descendants(psutil.Process().pid)) <= before


def _probe(task: int, extra: str = "", unit: str = "course_lib.units.u00_start_here") -> CheckJob:
    """A job whose verdict names the seed and folder its clean process saw."""
    check = extra + (
        "import os\nraise AssertionError(f\"{os.environ['COURSE_GRADE_SEED']}|{os.getcwd()}\")\n"
    )
    return CheckJob(task, unit, [], [], [], check)


u00 = "course_lib.units.u00_start_here"
# which units' checks its clean process found imported
IMPORTED = """import sys
raise AssertionError(" ".join(
    f"{u} {f'course_lib.units.{u}_' in ' '.join(m for m in sys.modules if m.endswith('.checks'))}"
    for u in ("u00", "u02")))
"""


FORGE = """import os
fd = int(open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")[3])
try:
    os.write(fd, b'[{"passed": true, "message": "forged"}]\\n')
except OSError:
    raise AssertionError("closed")
raise AssertionError("open")
"""
