"""The launch benchmark's table (the benchmark itself is run by hand: python -m course_tools.bench launch)."""

from __future__ import annotations

import pytest

from course_tools.bench import Timing, format_table, main, summary_line


def test_table_reports_median_p99_max_and_speedup():
    timings = [
        Timing("course_lib.launch (forkserver)", 2.0, [0.05, 0.07, 0.06]),
        Timing("torch.multiprocessing.spawn", 2.4, [2.2, 2.0]),
    ]
    lines = format_table(timings).splitlines()
    assert lines[0].split()[:7] == ["method", "cold", "s", "warm", "median", "s", "p99"]
    ours = lines[2].split()
    assert ours[-5:] == ["0.060", "0.070", "0.070", "3", "35.0x"]  # median, p99, max; 2.1 / 0.06
    assert lines[3].rstrip().endswith("1.0x")


def test_p99_is_the_nearest_rank_so_one_stall_in_a_hundred_shows():
    fast = [0.06] * 98
    assert Timing("m", 1.0, fast + [0.2, 5.1]).p99_s == 0.2  # 1 of 100 slow: p99 is the 99th
    assert Timing("m", 1.0, fast + [5.1, 5.1]).p99_s == 5.1  # 2 of 100 slow: p99 sees it
    assert Timing("m", 1.0, fast + [0.2, 5.1]).max_s == 5.1


def test_summary_line_checks_both_targets():
    ok = Timing("course_lib.launch (forkserver)", 2.0, [0.06] * 99 + [0.25])
    line = summary_line([ok, Timing("torch.multiprocessing.spawn", 2.4, [2.4])])
    assert "over 100 warm launches" in line and "median 0.060 s" in line
    assert "target <= 0.1 s met" in line and "p99 0.060 s (target <= 0.3 s met)" in line
    assert "max 0.250 s" in line and "40.0x faster than torch.multiprocessing.spawn" in line
    stalled = Timing("course_lib.launch (forkserver)", 2.0, [0.06] * 97 + [5.1] * 3)
    assert "p99 5.100 s (target <= 0.3 s NOT met)" in summary_line([stalled])


@pytest.mark.parametrize("flag", ["--warm", "--spawn", "--accelerate-runs", "--world-size"])
def test_bad_arguments_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        main(["launch", flag, "0"])
    assert flag in capsys.readouterr().err
