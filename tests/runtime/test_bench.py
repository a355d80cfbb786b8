"""The launch benchmark's table (the benchmark itself is run by hand: python -m course_lib.bench launch)."""
from __future__ import annotations

import pytest

from course_lib.bench import Timing, format_table, main


def test_table_reports_median_spread_and_speedup():
    timings = [Timing("course_lib.launch (forkserver)", 2.0, [0.05, 0.07, 0.06]),
               Timing("torch.multiprocessing.spawn", 2.4, [2.2, 2.0])]
    lines = format_table(timings).splitlines()
    assert lines[0].split()[:4] == ["method", "cold", "s", "warm"]
    ours = lines[2]
    assert "0.060" in ours and "0.050-0.070" in ours and "35.0x" in ours  # 2.1 / 0.06
    assert lines[3].rstrip().endswith("1.0x")


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        main(["launch", "--warm", "0"])
