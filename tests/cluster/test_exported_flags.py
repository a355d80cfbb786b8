"""Bad settings on an exported script's command line and on ``python -m course_lib.cluster
export`` (issue 47, item 7): ``python ddp.py --bucket-cap-mb -5`` printed a 16-line traceback from
inside the unit, and ``export`` wrote the script. Both now apply the unit's own argument checks
(``Experiment.check_run``: the unit's function up to its first launch, which starts nothing) and
say what is wrong in one line on stderr, with exit status 2, before anything is written or run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from course_lib import cluster
from course_lib.runtime import dry_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=90
    )


MISTAKES = [
    (["--bucket-cap-mb", "-5"], "error: bucket_cap_mb = -5.0: expected a number > 0"),
    (["--bucket-cap-mb", "inf"], "error: bucket_cap_mb = inf: expected a finite number"),
    (["--width", "1"], "error: width = 1: expected an int >= 2"),
    (["--world-size", "abc"], "error: argument --world-size: invalid int value: 'abc'"),
]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_invalid_flag_is_one_line_and_status_2_in_the_script_and_in_export(tmp_path):
    made = _run(["-m", "course_lib.cluster", "export", "u09.bytes", "--world-size", "4",
                 "--script-name", "ddp.py"], tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    (tmp_path / "ddp.py").write_text(made.stdout)
    for flags, line in MISTAKES:
        ran = _run(["ddp.py", *flags], tmp_path)
        assert ran.returncode == 2 and ran.stdout == "", (flags, ran.stderr[-2000:])
        assert len(ran.stderr.splitlines()) == 1 and ran.stderr.startswith(line), ran.stderr
        exported = _run(["-m", "course_lib.cluster", "export", "u09.bytes", *flags], tmp_path)
        assert exported.returncode == 2 and exported.stdout == "", exported.stderr
        assert exported.stderr == ran.stderr, flags  # the same rules, the same line
    unknown = _run(["ddp.py", "--bucket-cap", "25"], tmp_path)
    assert unknown.returncode == 2 and len(unknown.stderr.splitlines()) == 1, unknown.stderr
    assert unknown.stderr.startswith("error: unrecognized arguments: --bucket-cap 25")
    assert sorted(os.listdir(tmp_path)) == ["ddp.py"]  # no rank ran, no results file


@pytest.mark.parametrize(
    "name, settings, world_size, message",
    [
        ("u09.bytes", {"bucket_cap_mb": "-5"}, None, "bucket_cap_mb = -5.0: expected a number > 0"),
        ("u09.parity", {"bucket_cap_mb": "0"}, 2, "bucket_cap_mb = 0.0: expected a number > 0"),
        ("u08.timing", {"sizes_bytes": "9"}, None, "sizes_bytes = [9]: expected multiples of 4"),
        ("u08.timing", {"algorithms": "bogus"}, None, "algorithms[i] = 'bogus': expected one of"),
        ("u10.memory", {"stages": "5"}, None, "stages[i] = 5: expected one of 0, 1, 2, 3"),
        ("u12.memory", {"microbatches": "-5"}, None, "microbatches = -5: expected an int >= 1"),
        ("u14.run_3d", {"microbatches": "0"}, None, "microbatches = 0: expected an int >= 1"),
        ("u17.allgather", {"steps": "1"}, None, "steps = 1: expected an int >= 2"),
        ("u18.elastic", {"kill_rank": "4"}, 4, "kill_rank = 4: expected an int in 0..3"),
        ("u18.elastic", {"slow_rank": "7"}, 2, "slow_rank = 7: expected an int in -1..1"),
        ("u18.elastic", {"slow_s": "inf"}, 2, "slow_s = inf: expected a finite number"),
        ("u15.parity", {"causal": ""}, None, "setting causal = '': expected true or false"),
        ("u10.comm", {"stages": ()}, None, "setting stages = (): expected a comma-separated list"),
    ],
)
def test_export_refuses_what_the_units_own_function_refuses(tmp_path, name, settings, world_size,
                                                            message):  # fmt: skip
    path = tmp_path / "x.py"
    with pytest.raises(ValueError) as info:
        cluster.export(name, path, world_size=world_size, **settings)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert not path.exists()


def test_check_arguments_runs_a_function_up_to_its_launch_and_starts_nothing():
    import course_lib

    calls = []

    def experiment(world_size, width):
        calls.append(width)
        if width < 2:
            raise ValueError(f"width = {width}: expected an int >= 2")
        course_lib.launch(_never, world_size)
        calls.append("after launch")

    dry_run.check_arguments(experiment, 2, 4)
    assert calls == [4]  # stopped at launch: no rank started, nothing after it ran
    with pytest.raises(ValueError, match="width = 1"):
        dry_run.check_arguments(experiment, 2, 1)
    with pytest.raises(ValueError, match="world_size = 0: expected an int >= 1"):
        dry_run.check_arguments(experiment, 0, 4)  # launch's own checks still run
    assert course_lib.launch(_rank, 1) == [0]  # outside check_arguments, launch runs as ever


def _never(rank, world_size):
    raise AssertionError("a rank started during check_arguments")


def _rank(rank, world_size):
    return rank
