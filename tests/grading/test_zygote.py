"""The grader's zygote: a warm forkserver for units that launch ranks, and nothing left behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from course_lib.grading.isolate import CheckJob, CheckResult
from course_lib.grading.zygote import WarmZygote, Zygote
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


@pytest.mark.slow  # three notebooks, a killer among them (13 s); the fast lane keeps a cold zygote
def test_a_warm_zygote_serves_each_notebook_with_its_seed_and_folder_and_survives_a_killer(
    tmp_path,
):
    """A batch worker's zygote, kept between notebooks of one unit: each request's tasks see
    that notebook's seed and folder; an answer that kills the zygote costs only its own request
    (the grader then grades that notebook in a fresh zygote); a notebook of another unit is
    served by the same zygote, from a fresh fork for that unit."""
    from course_lib.grading.grader import _verdicts

    a, b = tmp_path / "alice", tmp_path / "bob"
    a.mkdir(), b.mkdir()
    before = set(descendants(psutil.Process().pid))
    zombies_before = set(_zombies())
    with no_process_left():
        warm = WarmZygote()
        first = warm.get("course_lib.units.u00_start_here", cwd=a, seed=3)
        assert first.ask([_probe(1), _probe(2)], timeout=60, seed=3, cwd=a) == [
            CheckResult(False, f"3|{a}"),
            CheckResult(False, f"3|{a}"),
        ]
        assert warm.get("course_lib.units.u00_start_here", cwd=b, seed=5) is first
        # the zygote's channel to the grader (its argv[1]) is closed before any learner code
        assert first.ask([_probe(1, FORGE)], timeout=60, seed=5, cwd=b) == [
            CheckResult(False, "closed")
        ]
        assert first.ask([_probe(1)], timeout=60, seed=5, cwd=b) == [CheckResult(False, f"5|{b}")]
        killer = _probe(1, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
        assert first.ask([killer], timeout=60, seed=5, cwd=b) is None and not first.alive()
        # the grader's fallback: the same request in a fresh zygote of its own (killed again
        # by this answer: no verdict for this notebook only)
        (lost,) = _verdicts(first, warm, [killer], 60, 5, b)
        assert not lost.passed and "without a verdict" in lost.message
        again = warm.get("course_lib.units.u00_start_here", cwd=a, seed=3)
        assert again is not first and again.ask([_probe(1)], timeout=60) == [
            CheckResult(False, f"3|{a}")
        ]
        # a notebook of another unit: the same zygote, its jobs in a fresh fork for that unit,
        # which never imported the previous unit's checks
        u02 = "course_lib.units.u02_batch_size_and_accumulation"
        assert warm.get(u02, cwd=a, seed=3) is again
        assert (
            again.ask([_probe(1, IMPORTED, u00), _probe(2, IMPORTED, u00)], timeout=60)
            == [CheckResult(False, "u00 True u02 False")] * 2
        )
        assert again.ask([_probe(1, IMPORTED, u02)], timeout=60) == [
            CheckResult(False, "u00 False u02 True")
        ]
        warm.close()
        assert not again.alive()
    # The two killers' own processes exited after their zygote died, as orphans: re-parented to
    # this test, a subreaper inside no_process_left (a batch worker is none: init reaps them).
    # They are task processes (each leads its own session) and are reaped here.
    stray = set(_zombies()) - zombies_before
    assert len(stray) <= 2 and all(os.getsid(p.pid) == p.pid for p in stray), stray
    for p in stray:
        os.waitpid(p.pid, 0)
    assert set(descendants(psutil.Process().pid)) <= before
