"""course_lib.resilience: a 2-rank DCP checkpoint read back, damaged copies refused with a message
naming what is wrong, and a write killed halfway that leaves the previous checkpoint loadable."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest
import torch

import course_lib
from course_lib import resilience
from course_lib.runtime.errors import LaunchError


def _save_twice(rank, world_size, *, root, kill_second):
    import signal

    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from course_lib import resilience

    mesh = init_device_mesh("cpu", (world_size,))
    path = pathlib.Path(root) / "ckpt"
    state = {
        "w": distribute_tensor(torch.arange(12.0).reshape(6, 2), mesh, [Shard(0)]),
        "step": 7,
        "meta": {"name": "first"},
    }
    resilience.save(state, path)
    if kill_second:
        state["w"] = distribute_tensor(-torch.ones(6, 2), mesh, [Shard(0)])
        state["step"] = 8

        def die(self, *args, **kwargs):  # rank 0 writes the index last: die before it
            os.kill(os.getpid(), signal.SIGKILL)

        dcp.FileSystemWriter.finish = die
        resilience.save(state, path)
    return sorted(p.name for p in path.iterdir())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    files = course_lib.launch(_save_twice, 2, root=str(root), kill_second=False)[0]
    return root / "ckpt", files


def _fresh():
    return {"w": torch.zeros(6, 2), "step": 0, "meta": {"name": ""}}


def test_two_ranks_write_one_file_each_and_it_loads_in_one_process(saved):
    path, files = saved
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    state = resilience.load(_fresh(), path)  # saved sharded on 2, loaded whole on 1
    assert torch.equal(state["w"], torch.arange(12.0).reshape(6, 2))
    assert state["step"] == 7 and state["meta"] == {"name": "first"}
    assert resilience.checkpoint_bytes(path) == sum((path / f).stat().st_size for f in files)


def test_damaged_checkpoints_name_what_is_wrong(saved, tmp_path):
    path, _ = saved
    with pytest.raises(
        resilience.CheckpointError,
        match=r"w = shape \(6, 2\) in the checkpoint: "
        r"expected \(4, 2\)",
    ):
        resilience.load({"w": torch.zeros(4, 2)}, path)
    with pytest.raises(resilience.CheckpointError, match=r"extra = missing from the checkpoint"):
        resilience.load({"w": torch.zeros(6, 2), "extra": torch.zeros(1)}, path)
    missing = shutil.copytree(path, tmp_path / "missing")
    os.remove(missing / "__1_0.distcp")
    with pytest.raises(resilience.CheckpointError, match=r"'__1_0.distcp'.* it is missing"):
        resilience.load(_fresh(), missing)
    cut = shutil.copytree(path, tmp_path / "cut")
    data = (cut / "__0_0.distcp").read_bytes()
    (cut / "__0_0.distcp").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        resilience.CheckpointError,
        match=r"'__0_0.distcp': expected at least "
        r"[\d,]+ bytes, it has [\d,]+ \(truncated\)",
    ):
        resilience.load(_fresh(), cut)
    with pytest.raises(resilience.CheckpointError, match=r"path = .*nowhere.*none there"):
        resilience.load(_fresh(), tmp_path / "nowhere")
    with pytest.raises(TypeError, match=r"state = 3: expected a dict"):
        resilience.load(3, path)


def test_a_write_killed_halfway_leaves_the_previous_checkpoint(tmp_path):
    with pytest.raises(LaunchError, match="rank 0"):
        course_lib.launch(_save_twice, 2, root=str(tmp_path), kill_second=True, timeout=30)
    path = tmp_path / "ckpt"
    partial = tmp_path / "ckpt.partial"
    assert {p.name for p in partial.iterdir()} >= {"__0_0.distcp", "__1_0.distcp"}
    assert not (partial / ".metadata").exists()  # killed before the index was written
    assert resilience.latest(tmp_path) == path
    state = resilience.load(_fresh(), path)
    assert torch.equal(state["w"], torch.arange(12.0).reshape(6, 2)) and state["step"] == 7
    with pytest.raises(resilience.CheckpointError, match=r"a partial write"):
        resilience.load(_fresh(), partial)


def test_latest_skips_partial_writes_and_falls_back_to_an_interrupted_overwrite(tmp_path):
    assert resilience.latest(tmp_path / "none") is None
    for name in ("step_000001", "step_000003.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".metadata").write_bytes(b"x")
    (tmp_path / "step_000002.partial").mkdir()
    (tmp_path / "step_000004.partial").mkdir()
    assert resilience.latest(tmp_path).name == "step_000003.old"  # its rename was cut short
    (tmp_path / "step_000003").mkdir()
    (tmp_path / "step_000003" / ".metadata").write_bytes(b"x")
    assert resilience.latest(tmp_path).name == "step_000003"
