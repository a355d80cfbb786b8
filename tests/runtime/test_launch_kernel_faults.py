"""course_lib.launch driven through a real IPython kernel, the way a notebook user drives it.

One kernel serves the whole module (starting it and importing torch costs seconds); each test
leaves it as it found it. The kernel's temporary directory is a private one, so the tests can
see every launch work directory (``course_lib_launch_*``) that is left behind.
"""

from __future__ import annotations

import os
import socket
import textwrap
import time

import psutil
import pytest
from _kernel import Kernel, wait_for

pytestmark = pytest.mark.timeout(120)

SETUP = """\
import os, signal, time
import torch, torch.distributed as dist
import course_lib
from course_lib.runtime import launch as launch_module

def ok(rank, world_size):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return t.item()

def stubborn(rank, world_size):
    # ignores SIGINT and SIGTERM, as code stuck in C++ or a loop that catches interrupts does
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(f"rank{rank}.pid", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)

print("warm", course_lib.launch(ok, 2))
"""


class NotebookSession:
    def __init__(self, root):
        self.cwd = root / "nb"
        self.tmp = root / "tmp"
        self.cwd.mkdir()
        self.tmp.mkdir()
        self.kernel = Kernel(self.cwd, {"TMPDIR": str(self.tmp)})
        self.setup()

    def setup(self):
        result = self.kernel.run(SETUP, timeout=90)
        assert "warm [3.0, 3.0]" in result.stdout, result.text

    def workdirs(self) -> list[str]:
        return sorted(n for n in os.listdir(self.tmp) if n.startswith("course_lib_launch_"))

    def rank_pids(self, world_size: int) -> list[int]:
        files = [self.cwd / f"rank{r}.pid" for r in range(world_size)]
        assert wait_for(lambda: all(f.exists() and f.read_text() for f in files), 30), (
            "the ranks did not start"
        )
        pids = [int(f.read_text()) for f in files]
        for f in files:
            f.unlink()
        return pids


def _running(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="module")
def nb(tmp_path_factory):
    session = NotebookSession(tmp_path_factory.mktemp("kernel"))
    try:
        yield session
    finally:
        session.kernel.close()


def test_dataloader_workers_in_a_rank_with_a_notebook_defined_dataset(nb):
    result = nb.kernel.run(
        textwrap.dedent("""\
        from torch.utils.data import Dataset, DataLoader

        class DS(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return torch.tensor([float(i)])

        def load(rank, world_size):
            loader = DataLoader(DS(), batch_size=2, num_workers=2)
            return sum(batch.sum().item() for batch in loader)

        print("loaded", course_lib.launch(load, 2))
    """)
    )
    assert "loaded [28.0, 28.0]" in result.stdout, result.text
    assert result.error is None


def test_variables_from_a_ddp_tutorial_do_not_switch_to_torchrun_mode(nb):
    # a tutorial's variables, with a port that is free now (nothing binds it: launch ignores them)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = nb.kernel.run(
        textwrap.dedent(f"""\
        os.environ.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="localhost", MASTER_PORT="{port}")
        try:
            t0 = time.monotonic()
            print("two", course_lib.launch(ok, 2, timeout=10), time.monotonic() - t0 < 5)
            print("initialized", dist.is_initialized())
            os.environ["WORLD_SIZE"] = "1"
            print("four", course_lib.launch(ok, 4, timeout=10))
            print("initialized", dist.is_initialized())
        finally:
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                os.environ.pop(name, None)
    """),
        timeout=60,
    )
    assert result.error is None, result.text
    assert "two [3.0, 3.0] True" in result.stdout
    assert "four [10.0, 10.0, 10.0, 10.0]" in result.stdout
    assert "initialized True" not in result.stdout  # the kernel never joins a process group
    assert "runs under torchrun" not in result.text
    for variable in ("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=localhost", f"MASTER_PORT={port}"):
        assert variable in result.stderr, result.stderr  # the warning names what it ignored
    assert "ignored" in result.stderr and "torchrun" in result.stderr


def test_ranks_import_from_the_directory_the_notebook_is_in_now(nb):
    sub = nb.cwd / "sub"
    sub.mkdir()
    (sub / "course_lib_cd_helper.py").write_text("VALUE = 40\n")
    result = nb.kernel.run(
        textwrap.dedent("""\
        %cd sub
        try:
            import course_lib_cd_helper
            def uses_helper(rank, world_size):
                import course_lib_cd_helper as helper
                return helper.VALUE + rank
            print("in notebook", course_lib_cd_helper.VALUE)
            print("in ranks", course_lib.launch(uses_helper, 2))
        finally:
            %cd ..
    """)
    )
    assert "in notebook 40" in result.stdout, result.text
    assert "in ranks [40, 41]" in result.stdout, result.text


def test_a_second_interrupt_during_cleanup_still_stops_every_rank(nb):
    nb.kernel.start("course_lib.launch(stubborn, 2, timeout=60)")
    pids = nb.rank_pids(2)
    assert nb.workdirs()
    nb.kernel.interrupt()
    time.sleep(0.4)  # the launcher is now in its SIGTERM grace period; the ranks ignore SIGTERM
    nb.kernel.interrupt()
    result = nb.kernel.collect(timeout=30)
    assert result.error is not None and result.error[0] == "KeyboardInterrupt", result.text
    assert _running(pids) == [], "ranks outlived an interrupted launch"
    assert nb.workdirs() == []  # the work directory went with them
    assert "again [3.0, 3.0]" in nb.kernel.run('print("again", course_lib.launch(ok, 2))').stdout


def test_interrupting_the_first_launch_prints_no_forkserver_traceback(nb):
    nb.kernel.run("launch_module.shutdown_forkserver()")
    nb.kernel.start("course_lib.launch(ok, 2)")  # cold: the forkserver now imports torch

    def forkserver_started():
        return any(
            "forkserver" in " ".join(p.cmdline()) for p in nb.kernel.descendants() if p.is_running()
        )

    assert wait_for(forkserver_started, 30)
    time.sleep(0.5)
    nb.kernel.interrupt()
    interrupted = nb.kernel.collect(timeout=60)
    late = nb.kernel.drain(1.0)  # what the dying server printed may come after the cell ended
    after = nb.kernel.run('print("after", course_lib.launch(ok, 2))', timeout=90)
    assert interrupted.error is not None and interrupted.error[0] == "KeyboardInterrupt"
    assert "after [3.0, 3.0]" in after.stdout, after.text  # a new server starts
    shown = interrupted.stdout + interrupted.stderr + late + after.stdout + after.stderr
    assert "forkserver.py" not in shown and "Traceback" not in shown, shown
    assert nb.workdirs() == []


def test_a_kernel_restart_during_a_launch_leaves_no_rank_and_no_work_directory(nb):
    nb.kernel.start("course_lib.launch(stubborn, 2, timeout=60)")
    pids = nb.rank_pids(2)
    assert len(nb.workdirs()) == 1
    nb.kernel.restart()
    assert wait_for(lambda: _running(pids) == [], 10), "ranks outlived the kernel"
    nb.setup()  # the first launch after the restart reclaims what the old kernel left
    assert nb.workdirs() == []
