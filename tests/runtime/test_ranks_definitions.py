"""Which kernel definitions follow into persistent ranks (runtime/_definitions.py), and the
benchmark table of ``python -m course_tools.bench ranks`` (pure: no process is started)."""

from __future__ import annotations

import pytest

from course_lib.runtime._definitions import definitions
from course_tools.bench import main
from course_tools.bench_ranks import Result, format_table

CELL = """\
import torch
from math import pi as PI
N = 4
SIZES: tuple = (1, 2)
t = torch.randn(3)
get_ipython().run_line_magic("time", "1")

@staticmethod
def f(x):
    return x + N

class Model:
    pass

if True:
    def hidden():
        pass
a, b = 1, 2
"""


def test_imports_functions_classes_and_literals_follow_and_nothing_else():
    found = definitions(CELL, "<kernel cell 1>")
    assert [label for label, _, _ in found] == [
        "import torch",
        "from math import pi as PI",
        "N = 4",
        "SIZES: tuple = (1, 2)",
        "def f",
        "class Model",
    ]
    label, source, filename = found[4]
    assert filename == "<kernel cell 1>"
    assert source.lstrip("\n").startswith("@staticmethod\ndef f(x):")  # decorators come along
    assert source.count("\n") == 10  # padded so that line numbers match the cell's
    namespace: dict = {}
    for _, src, name in found:
        exec(compile(src, name, "exec"), namespace)
    assert namespace["N"] == 4 and namespace["PI"] > 3 and "t" not in namespace


def test_a_cell_that_does_not_parse_carries_nothing():
    assert definitions("def broken(:\n", "<kernel cell 2>") == []


def test_ranks_table_says_why_a_peer_was_not_measured():
    ours = Result(
        "course_lib %%ranks",
        start_cell_s=1.5,
        start_s=1.5,
        restart_s=0.4,
        trivial_median_s=0.021,
        trivial_runs=20,
        interrupt_s=0.05,
        interrupt_after="cell stopped; ranks answer, state kept",
        raise_behaviour="cell fails; names rank 1",
        leftover_processes=0,
    )
    peer = Result("peer 0.1", note="kernel did not start: no module")
    lines = format_table([ours, peer]).splitlines()
    assert lines[2] == (
        "| course_lib %%ranks | 1.50 s / 1.50 s / 0.40 s | 21 ms (20 runs) | 0.05 s | "
        "cell stopped; ranks answer, state kept | cell fails; names rank 1 | 0 |"
    )
    assert lines[3].startswith("| peer 0.1 | not measured: kernel did not start: no module")


def test_bad_ranks_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["ranks", "--runs", "0"])
    assert "--runs" in capsys.readouterr().err
