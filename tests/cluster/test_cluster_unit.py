"""The pieces of course_lib.cluster without torchrun: results files, settings, world sizes,
commands, the command line, and an exported script run with plain python."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from course_lib import cluster
from course_lib.cluster import results
from course_lib.models import GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _frame():
    df = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "n": [1, 2, 3],
            "x": [0.1, math.nan, 1 / 3],
            "ok": [True, False, True],
            "cell": [[1, 2], (3, 4), None],
        }
    )
    df.attrs["ranks"] = 4
    df.attrs["inner"] = pd.DataFrame({"k": [1.5]})
    return df


def test_a_results_file_gives_back_equal_values():
    value = {
        "frame": _frame(),
        "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) / 7,
        "i64": torch.tensor([2**40, -1]),
        "pair": (1, 2.5),
        "list": [1, "two", None],
        "by_rank": {0: "a", 3: "b"},
        "config": GPTConfig(n_layer=2, n_embd=32),
        "dtype": torch.float16,
        "tag_like": {"__tuple__": [1]},
        "nan": math.nan,
    }
    back, meta = results.loads(results.dumps(value, {"world_size": 2}))
    assert meta == {"world_size": 2}
    assert results.differences(value, back) == []
    assert isinstance(back["pair"], tuple) and isinstance(back["config"], GPTConfig)
    assert back["t"].dtype == torch.bfloat16 and back["frame"].attrs["ranks"] == 4
    assert list(back["frame"].dtypes.astype(str)) == list(_frame().dtypes.astype(str))


def test_differences_finds_each_kind_of_change():
    a = {"frame": _frame(), "t": torch.ones(3), "k": 1.0}
    b = {"frame": _frame(), "t": torch.ones(3), "k": 1.0}
    assert results.differences(a, b) == []
    b["frame"].loc[2, "x"] = 0.3333333333333333 + 1e-16 * 3
    b["t"][1] = 1.0000001
    b["k"] = 1.0 + 2**-52
    found = results.differences(a, b)
    assert len(found) == 3 and "['x'][row 2]" in found[0] and "tensors differ" in found[1]
    assert results.differences(a, b, ignore=("x", "t", "k")) == []
    assert results.differences([1, 2], (1, 2)) and results.differences({"a": 1}, {"b": 1})


def test_a_file_not_written_by_an_export_is_refused(tmp_path):
    with pytest.raises(ValueError, match="format = None: expected 'course_lib.cluster/1'"):
        results.loads('{"value": 1}')
    bad = results.dumps(None).replace(
        '"value": null', '"value": {"__dataclass__": {"class": "os:stat_result", "fields": {}}}'
    )
    with pytest.raises(ValueError, match="only course_lib's own dataclasses"):
        results.loads(bad)
    with pytest.raises(FileNotFoundError, match="no results file there"):
        cluster.load(tmp_path / "missing.json")


def test_settings_are_typed_and_unknown_ones_named():
    exp = cluster.get("u09.bytes")
    assert exp.settings({"bucket_cap_mb": "25", "width": "64"}) == {
        "width": 64,
        "bucket_cap_mb": 25.0,
    }
    with pytest.raises(ValueError, match="valid settings: width, bucket_cap_mb"):
        exp.settings({"bucket_cap": 25})
    with pytest.raises(ValueError, match="setting width = 'wide': expected an int"):
        exp.settings({"width": "wide"})
    u11 = cluster.get("u11.parity")
    assert u11.settings({"sequence_parallel": "false,true"})["sequence_parallel"] == (False, True)
    with pytest.raises(ValueError, match="expected true or false"):
        u11.settings({"sequence_parallel": "maybe"})
    assert cluster.get("u12") is cluster.get("u12.timelines")  # a unit names its first one
    with pytest.raises(ValueError, match="expected one of u08.timing"):
        cluster.get("u99")


def test_a_world_size_an_experiment_cannot_use_is_refused_before_any_rank(tmp_path):
    with pytest.raises(
        ValueError, match="n_head = 4: expected a multiple of tp = 3; valid tp: 1, 2, 4"
    ):
        cluster.export("u11.parity", tmp_path / "never.py", world_size=3)
    with pytest.raises(ValueError, match="u14.run_3d runs on exactly 8 ranks"):
        cluster.get("u14.run_3d").resolve_world_size(4, cluster.get("u14.run_3d").settings())
    with pytest.raises(
        ValueError,
        match=r"world_size = 3: expected a power of two \(2, 4, 8, 16, \.\.\.\); recursive_doubling",
    ):
        cluster.run("u08.timing", 3)
    with pytest.raises(ValueError, match="world_size = 5: the global batch of 24 rows"):
        cluster.run("u09.parity", 5)
    with pytest.raises(ValueError, match=r"path = 'x.txt': expected a \.py file"):
        cluster.export("u09", "x.txt")


def test_launch_commands_for_one_node_several_and_slurm(tmp_path):
    assert (
        cluster.launch_command("ddp.py", nproc_per_node=4)
        == "torchrun --standalone --nproc-per-node 4 ddp.py"
    )
    two = cluster.launch_command("t.py", nproc_per_node=8, nnodes=2, args={"dp": 2, "pp": 8})
    assert two == (
        "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "
        "$HEAD_NODE:29500 --rdzv-id $JOB_ID t.py --dp 2 --pp 8"
    )
    job = cluster.slurm_script("t.py", nodes=4, gpus_per_node=8, partition="gpu")
    assert "#SBATCH --nodes=4" in job and "#SBATCH --partition=gpu" in job
    assert "srun torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d" in job
    assert "--rdzv-endpoint $HEAD_NODE:29500 --rdzv-id $SLURM_JOB_ID t.py" in job
    (tmp_path / "job.sbatch").write_text(job)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    with pytest.raises(ValueError, match="nproc_per_node = 0: expected"):
        cluster.launch_command("t.py", nproc_per_node=0)


def _cli(*args, stdout=None, cwd=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "course_lib.cluster", *args],
        cwd=cwd,
        env=env,
        stdout=stdout or subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )


def test_the_command_line_exports_a_script_named_after_its_file(tmp_path):
    with open(tmp_path / "ddp.py", "w") as f:
        proc = _cli("export", "u09", "--bucket-cap-mb", "25", stdout=f)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "ddp.py").read_text()
    assert "torchrun --standalone --nproc-per-node 4 ddp.py" in text
    assert "'bucket_cap_mb': 25.0" in text and "ddp_results.json" in text
    listed = _cli("list")
    assert (
        listed.returncode == 0 and "u14.run_3d" in listed.stdout and "u08.timing" in listed.stdout
    )
    bad = _cli("export", "u09", "--bucket-cap", "25")
    assert bad.returncode == 2 and "valid settings: width, bucket_cap_mb" in bad.stderr


@pytest.mark.timeout(120)
def test_an_exported_script_refuses_bad_input_in_the_export_commands_one_line(tmp_path):
    script = cluster.export("u08.timing", tmp_path / "timing.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    for mistake in (["--world-size", "0"], ["--world-size", "3"], ["--repeats", "many"]):
        exported = _cli("export", "u08.timing", *mistake)
        assert exported.returncode == 2, exported.stderr
        ran = subprocess.run(
            [sys.executable, str(script), *mistake],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 2 and ran.stdout == "", ran.stderr
        assert ran.stderr == exported.stderr, mistake  # the same line, and nothing else
        assert len(ran.stderr.splitlines()) == 1 and ran.stderr.startswith("error: "), ran.stderr
    assert os.listdir(tmp_path) == ["timing.py"]  # refused before any rank or results file


@pytest.mark.timeout(120)
def test_an_exported_script_runs_with_plain_python_through_launch(tmp_path):
    script = cluster.export("u10.memory", tmp_path / "zero.py", stages=(0, 3))
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, str(script), "--world-size", "2", "--stages", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = cluster.load(tmp_path / "zero_results.json")
    assert res.meta["launcher"] == "launch" and res.meta["settings"]["stages"] == (3,)
    here = cluster.run("u10.memory", 2, stages=(3,))
    assert cluster.get("u10.memory").differences(here.value, res.value) == []


# --- agents that fail or hang: a clear error at once, or at the deadline with their output -------


def test_a_first_agent_that_dies_before_listening_fails_at_once_with_its_output(tmp_path):
    from course_lib.cluster.local import free_port, run_agents

    dies = [sys.executable, "-c", "import sys; sys.exit('no store: port taken')"]
    waits = [sys.executable, "-c", "import time; time.sleep(60)"]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited with code 1 before listening(.|\n)*port taken"):
        run_agents([dies, waits], tmp_path, timeout=30, first_listens_on=free_port())
    assert time.monotonic() - start < 15  # not the 30 s deadline: the second never started


def test_once_an_agent_fails_the_others_are_killed_after_the_grace_not_at_the_deadline(tmp_path):
    """Seen 1 run in ~40-100 of unit 18's two-node cell: node 1's rank aborted as its process
    ended, and node 0's agent, its own rank done, waited at torchrun's exit barrier (300 s) for
    an agent that was gone; the lecture's cell waited out its 150 s deadline."""
    import psutil

    from course_lib.cluster.local import run_agents

    waits = [
        sys.executable,
        "-c",
        "import sys, time; print('rank 0 done; at the exit barrier', file=sys.stderr, "
        "flush=True); time.sleep(60)",
    ]
    fails = [sys.executable, "-c", "import sys; sys.exit('rank 1: SIGABRT')"]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    node0, node1 = run_agents([waits, fails], tmp_path, timeout=60, grace=1)
    assert time.monotonic() - start < 15  # the grace, not the 60 s deadline
    assert node0.returncode == -9 and node1.returncode == 1
    assert "at the exit barrier" in node0.stderr and "rank 1: SIGABRT" in node1.stderr
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - before
    with pytest.raises(ValueError, match="grace"):
        run_agents([waits], tmp_path, grace=-1)


def test_agents_past_the_deadline_are_killed_and_their_last_output_shown(tmp_path):
    from course_lib.cluster.local import run_agents

    hang = (
        "import sys, time; print('agent {} waits for the rendezvous', file=sys.stderr, "
        "flush=True); time.sleep(60)"
    )
    cmds = [[sys.executable, "-c", hang.format(i)] for i in range(2)]
    start = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        run_agents(cmds, tmp_path, timeout=3)
    assert time.monotonic() - start < 15
    msg = str(err.value)
    assert "agent 0 waits for the rendezvous" in msg and "agent 1 waits for the rendezvous" in msg
