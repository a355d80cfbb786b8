"""Exported experiments under torchrun give what launch gives; a rank that fails on one of two
torchrun agents meeting at a c10d rendezvous (two "nodes" on this host) is named in torchrun's own
error report. (Two agents running an exported script to launch's result: lecture 14.)"""

from __future__ import annotations

import psutil
import pytest
from _agents import run_agents, torchrun, two_nodes

from course_lib import cluster

# Small settings: the same code paths as the lectures, a few seconds each.
SMALL = {
    "u08.timing": dict(sizes_bytes=(4096, 65536), repeats=1, warmup=0),
    "u08.bytes": dict(numel=1024),
    "u08.wire": dict(size_bytes=65536),
    "u09.bytes": dict(width=64),
    "u09.parity": dict(steps=2),
    "u09.accumulation": dict(micro_steps=2),
    "u10.parity": dict(steps=1),
    "u10.memory": dict(stages=(0, 3)),
    "u10.comm": dict(stages=(1, 3), with_torch=False),
    "u11.parity": dict(steps=1),
    "u11.memory": dict(sequence_parallel=(True,)),
    "u11.wire": dict(sequence_parallel=(False,)),
    "u12.timelines": dict(schedules=("gpipe", "1f1b"), microbatches=4),
    "u12.parity": dict(schedules=("gpipe", "1f1b"), steps=1),
    "u12.memory": dict(microbatches=4),
    "u12.wire": dict(schedules=("1f1b",), microbatches=4),
    "u14.run_3d": dict(dp=1, tp=1, pp=2, steps=1, batch=4),
    "u15.parity": dict(causal=(True,)),
    "u16.parity": dict(),
    "u17.allgather": dict(gathers=("bf16", "fp8")),
    "u18.elastic": dict(steps=4, every=2),
}

DRIVER = """
import sys
from course_lib import cluster
SMALL = {small!r}
if __name__ == "__main__":
    for name, settings in SMALL.items():
        cluster.main(name, settings, out=name + ".json", argv=[])
"""


def test_every_unit_with_ranks_exports_something():
    units = {e.unit for e in cluster.experiments().values()}
    assert {"u08", "u09", "u10", "u11", "u12", "u14", "u15", "u16", "u18"} <= units
    assert set(SMALL) == set(cluster.experiments()), "give every experiment small test settings"


@pytest.mark.timeout(300)
def test_every_experiment_gives_launchs_result_under_torchrun(tmp_path):
    (tmp_path / "driver.py").write_text(DRIVER.format(small=SMALL))
    [proc] = run_agents(
        [torchrun("--standalone", "--nproc-per-node", "2", "driver.py")], tmp_path, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, settings in SMALL.items():
        under_torchrun = cluster.load(tmp_path / f"{name}.json")
        here = cluster.run(name, 2, **settings)
        exp = cluster.get(name)
        assert exp.differences(here.value, under_torchrun.value) == [], name
        m, t = here.meta, under_torchrun.meta
        assert (t["launcher"], m["launcher"]) == ("torchrun", "launch")
        assert t["backend"] == m["backend"] == "gloo"  # the same device choice both ways
        assert t["world_size"] == m["world_size"] == 2 and t["settings"] == m["settings"]
        assert f"{name}: 2 ranks on 1 node under torchrun" in proc.stdout


# Two torchrun agents as two nodes running an exported u14.run_3d (tp 2 x pp 2 over 2 x 2 ranks) to
# launch's result: checked once per `make test`, by lecture 14's compared cell (nbval), not again here.


FAILING = """
import course_lib
from course_lib.cluster import Experiment, main

def _rank(rank, world_size):
    if rank == 3:
        raise MemoryError("rank 3 ran out of memory on purpose")
    return rank

def boom(world_size):
    return course_lib.launch(_rank, world_size)

if __name__ == "__main__":
    main(Experiment("test.boom", "one rank fails", boom, "tests"), {}, out="boom.json")
"""


@pytest.mark.timeout(150)
def test_a_failed_rank_is_named_in_torchruns_error_report(tmp_path):
    (tmp_path / "boom.py").write_text(FAILING)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    node0, node1 = two_nodes("boom.py", tmp_path, nproc_per_node=2, timeout=90)
    assert node0.returncode != 0 and node1.returncode != 0
    # node 1 holds ranks 2 and 3: the failed rank is its root cause, with its own traceback
    root1 = node1.stderr.split("Root Cause (first observed failure):")[-1]
    assert "rank      : 3" in root1 or "rank: 3" in root1.replace("  ", " "), node1.stderr[-3000:]
    assert "rank 3 ran out of memory on purpose" in root1
    assert "error_file" in root1 and "<N/A>" not in root1.split("traceback")[0]
    # node 0's ranks did not fail themselves: their report names the rank that did
    assert "test.boom: rank 3 of 4 failed" in node0.stderr, node0.stderr[-3000:]
    assert not (tmp_path / "boom.json").exists()
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"processes left behind: {left}"


def test_exported_script_reads_as_instructions(tmp_path):
    path = cluster.export("u09.bytes", tmp_path / "ddp.py", bucket_cap_mb=25)
    text = path.read_text()
    assert "torchrun --standalone --nproc-per-node 4 ddp.py" in text
    assert "--rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:29500" in text
    assert "'bucket_cap_mb': 25.0" in text and 'cluster.load("ddp_results.json")' in text
    assert "end_process=True)" in text.splitlines()[-1]  # a torchrun rank ends once it succeeded
    compile(text, str(path), "exec")
