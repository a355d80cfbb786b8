"""A checkpoint save or load that fails names each failed rank and its cause in its first lines
(issue 47, item 5): a full disk said only ``CheckpointException ranks:dict_keys([1])``, with "No
space left on device" 25 lines into a 205-line message. Real 2-rank launches; the failures are
injected (an OSError where DCP opens a rank's file, a refused mkdir on rank 0 when the tests run
as root, whom a read-only folder does not stop), a missing shard is a file really removed."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil

import pytest
import torch

import course_lib
from course_lib import resilience
from course_lib.runtime.errors import LaunchError

pytestmark = pytest.mark.timeout(120)


def _refuse(mode: str, error: int) -> None:
    """From now on this rank's DCP cannot open files in ``mode`` ("wb" or "rb")."""
    import torch.distributed.checkpoint.filesystem as fs

    opened = fs.FileSystem.create_stream

    def create_stream(self, path, m):
        if m != mode or not str(path).endswith(".distcp"):  # the index stays readable
            return opened(self, path, m)
        if error == errno.ENOSPC:  # as a write() fails: no file name on the error
            raise OSError(error, os.strerror(error))
        raise OSError(error, os.strerror(error), str(path))

    fs.FileSystem.create_stream = create_stream


def _state(rank, value):
    return {"w": torch.full((4,), float(value + rank)), "step": value}


def _full_disk(rank, world_size, *, root):
    path = pathlib.Path(root) / "ckpt"
    resilience.save(_state(rank, 1), path)
    if rank == 1:
        _refuse("wb", errno.ENOSPC)
    resilience.save(_state(rank, 2), path)  # raises on every rank


def test_a_full_disk_names_the_rank_and_the_cause_first_and_keeps_the_last_checkpoint(tmp_path):
    with pytest.raises(LaunchError) as info:
        course_lib.launch(_full_disk, 2, root=str(tmp_path), timeout=60)
    text = str(info.value)
    partial = str(tmp_path / "ckpt.partial")
    line = f"raised CheckpointIOError: rank 1: No space left on device (ENOSPC) writing {partial!r}"
    # the summary names each rank's cause first (a long path is cut there; the details keep it)
    cause = line.split(" writing ")[0]
    first = [row.split(" writing ")[0] for row in text.splitlines()[1:3]]
    assert first == [f"rank 0: {cause}", f"rank 1: {cause}"], text[:2000]
    assert f"--- rank 0 {line}" in text and f"--- rank 1 {line}" in text, text[:3000]
    assert f"path = {str(tmp_path / 'ckpt')!r}: not saved; a checkpoint already there" in text
    # DCP's own report is kept below, as the cause
    assert "CheckpointException ranks:dict_keys([1])" in text and "[Errno 28]" in text
    assert "direct cause of the following exception" in text
    # the previous checkpoint is untouched and still loads
    assert resilience.latest(tmp_path) == tmp_path / "ckpt"
    state = resilience.load({"w": torch.zeros(4), "step": 0}, tmp_path / "ckpt")
    assert state["step"] == 1 and torch.equal(state["w"], torch.full((4,), 1.0))


def _failures(rank, world_size, *, root):
    """Each failure caught on every rank: (first line, second line, DCP's report as cause)."""
    root = pathlib.Path(root)
    seen = {}

    def attempt(name, fn):
        try:
            fn()
            seen[name] = None
        except resilience.CheckpointIOError as exc:
            lines = str(exc).splitlines()
            seen[name] = (lines[0], lines[-1], type(exc.__cause__).__name__, exc.failures)
        except resilience.CheckpointError as exc:
            seen[name] = (str(exc).splitlines()[0], "", "", {})

    readonly = root / "readonly"
    os.chmod(readonly, 0o555)  # root writes there all the same: refuse rank 0's mkdir then
    if rank == 0 and os.geteuid() == 0:
        made = pathlib.Path.mkdir

        def mkdir(self, *args, **kwargs):
            if self.parent == readonly:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            return made(self, *args, **kwargs)

        pathlib.Path.mkdir = mkdir
    attempt("read-only folder", lambda: resilience.save(_state(rank, 1), readonly / "ckpt"))
    good = root / "good"
    resilience.save(_state(rank, 1), good)
    missing = root / "missing"
    if rank == 0:
        shutil.copytree(good, missing)
        os.remove(missing / "__1_0.distcp")
    torch.distributed.barrier()
    attempt("missing shard", lambda: resilience.load(_state(rank, 0), missing))
    if rank == 1:
        _refuse("rb", errno.ENOENT)  # the shard vanishes after the check, before DCP reads it
    attempt("unreadable shard", lambda: resilience.load(_state(rank, 0), good))
    if rank == 1:
        _refuse("wb", errno.EACCES)
    attempt("permission denied", lambda: resilience.save(_state(rank, 2), good))
    return seen


def test_permission_denied_and_missing_shards_name_the_rank_and_the_cause_first(tmp_path):
    (tmp_path / "readonly").mkdir()
    seen = course_lib.launch(_failures, 2, root=str(tmp_path), timeout=60)
    for name in seen[0]:  # every rank raises the same error
        assert seen[0][name][:2] == seen[1][name][:2], name
    ro, good = str(tmp_path / "readonly" / "ckpt"), str(tmp_path / "good")
    first, last, dcp, failures = seen[0]["read-only folder"]
    assert first == f"rank 0: Permission denied (EACCES) creating {ro + '.partial'!r}"
    assert last == f"path = {ro!r}: not saved; a checkpoint already there is untouched"
    assert failures == {0: first.removeprefix("rank 0: ")}
    first, _, _, _ = seen[0]["missing shard"]
    assert first == (
        f"ranks 0, 1: shard file = '__1_0.distcp': expected in {str(tmp_path / 'missing')!r}, "
        "it is missing (rank 1 wrote it when saving)"
    )
    first, last, dcp, _ = seen[0]["unreadable shard"]
    assert first == (
        f"rank 1: No such file or directory (ENOENT) reading {good + '/__1_0.distcp'!r}"
    )
    assert last.startswith(f"path = {good!r}: not loaded") and dcp == "CheckpointException"
    first, _, dcp, _ = seen[0]["permission denied"]
    assert first == (
        f"rank 1: Permission denied (EACCES) writing {good + '.partial/__1_0.distcp'!r}"
    )
    assert dcp == "CheckpointException"
