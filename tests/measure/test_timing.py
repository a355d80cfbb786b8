"""time_fn reports median and spread of a known sleep; EventLog spans line up across processes."""

import pickle
import subprocess
import sys
import time

import pytest

from course_lib.measure.timing import EventLog, TimingResult, merge_event_logs, time_fn


def test_time_fn_on_a_known_sleep():
    calls = []
    r = time_fn(lambda: (calls.append(1), time.sleep(0.02)), warmup=2, repeat=5)
    assert len(calls) == 7 and r.n == 5 and len(r.times) == 5
    assert 0.02 <= r.median_s < 0.06  # sleep never returns early; a loaded machine adds a little
    assert r.min_s <= r.p10_s <= r.median_s <= r.p90_s <= r.max_s
    assert "ms median" in str(r)


def test_timing_result_statistics():
    r = TimingResult.from_times([5, 1, 3, 2, 4])
    assert (r.median_s, r.min_s, r.max_s, r.mean_s) == (3, 1, 5, 3)
    assert r.p10_s == pytest.approx(1.4) and r.p90_s == pytest.approx(4.6)
    with pytest.raises(ValueError, match="times is empty"):
        TimingResult.from_times([])


def test_time_fn_sync_options_and_errors():
    synced = []
    time_fn(lambda: None, warmup=0, repeat=3, sync=lambda: synced.append(1))
    assert len(synced) == 6  # before and after each timed call
    time_fn(lambda: None, repeat=1, sync=False)
    with pytest.raises(ValueError, match="repeat = 0: expected an int >= 1"):
        time_fn(lambda: None, repeat=0)
    with pytest.raises(TypeError, match="fn = 3: expected a callable"):
        time_fn(3)
    with pytest.raises(TypeError, match="sync = 'yes': expected"):
        time_fn(lambda: None, sync="yes")


def test_event_log_spans_records_and_merge():
    logs = [EventLog(rank) for rank in range(2)]
    for log in logs:
        with log.span("fwd", mb=0):
            time.sleep(0.005)
        with pytest.raises(RuntimeError):
            with log.span("bwd", mb=0):
                raise RuntimeError("recorded anyway")
    recs = logs[1].to_records()
    assert [r["name"] for r in recs] == ["fwd", "bwd"] and recs[0]["rank"] == 1
    assert recs[0]["end_ns"] - recs[0]["start_ns"] >= 5_000_000
    df = merge_event_logs([logs[0], pickle.loads(pickle.dumps(logs[1])).to_records()])
    assert list(df.columns[:6]) == ["rank", "name", "start", "end", "duration", "meta"]
    assert len(df) == 4 and df.start.min() == 0 and (df.mb == 0).all()
    assert (df.duration >= 0).all() and df.start.is_monotonic_increasing
    with pytest.raises(ValueError, match="clock = 'tsc': expected one of"):
        EventLog(0, clock="tsc")
    with pytest.raises(ValueError, match="rank = -1: expected an int >= 0"):
        EventLog(-1)


def test_monotonic_clock_is_shared_between_processes():
    before = time.monotonic_ns()
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.monotonic_ns())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    after = time.monotonic_ns()
    assert before <= int(out.stdout) <= after
