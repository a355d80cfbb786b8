"""python -m course_tools.gpu_check: no GPU, bad options, a whole --device cpu run, isolation.

The CUDA parts cannot run here; ``--device cpu`` runs the same code with them skipped, so the
checks' CPU paths, the process isolation and the report writer are what these tests cover.
"""

from __future__ import annotations

import datetime as dt
import os
import time

import pytest
import torch

import course_lib
from course_tools import gpu_check
from course_tools.gpu_check import device_checks
from course_tools.gpu_check.core import Check, CheckResult, Outcome, Settings, run_checks
from course_tools.gpu_check.report import Environment, render


def test_without_a_gpu_it_says_so_exits_0_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "docs")]) == 0
    assert "No GPU here" in capsys.readouterr().out
    assert not (tmp_path / "docs").exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--device", "tpu"], "--device = 'tpu': expected one of cuda, cpu"),
        (["--device", "cpu", "--timeout", "soon"], "--timeout = 'soon': expected a number > 0"),
        (["--device", "cpu", "--timeout", "0"], "--timeout = 0.0: expected a number > 0"),
    ],
)
def test_a_bad_option_exits_2_with_one_line_naming_it(tmp_path, capsys, argv, expected):
    assert gpu_check.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"python -m course_tools.gpu_check: error: {expected}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # every check once, on the CPU (14 s); the fast lane keeps the isolation test
def test_a_cpu_run_writes_a_report_naming_every_check_none_failed(tmp_path, capsys):
    start = time.perf_counter()
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    elapsed = time.perf_counter() - start
    [path] = tmp_path.iterdir()
    assert path.name == f"gpu-check-{dt.datetime.now(dt.timezone.utc).date()}-cpu.md"
    text = path.read_text()
    assert "it is not a GPU report" in text
    for check in gpu_check.CHECKS:
        expected = "skipped" if check.needs_cuda or check.group == "b" else "passed"
        assert f"| {check.group} | {check.name} | {expected} |" in text, check.name
        assert f"### {check.name}: {expected}" in text
    assert "| failed |" not in text and "Traceback" not in text
    assert "| meter peak (MiB) |" in text  # part b ran its meter on the CPU
    assert elapsed < 120, f"{elapsed:.0f} s"


def _raises(settings: Settings) -> Outcome:
    raise RuntimeError("broken on purpose")


def _dies(settings: Settings) -> Outcome:
    os._exit(3)


def _hangs(settings: Settings) -> Outcome:
    time.sleep(60)
    return Outcome()


def _passes(settings: Settings) -> Outcome:
    return Outcome({"answer": 42})


def test_each_check_is_isolated_and_bounded_in_time():
    checks = (
        Check("raises", "a", _raises),
        Check("dies", "a", _dies),
        Check("hangs", "a", _hangs),
        Check("cuda only", "c", _passes, needs_cuda=True),
        Check("passes", "a", _passes),
    )
    results = run_checks(checks, Settings(device="cpu", timeout_s=2.0))
    by_name = {r.name: r for r in results}
    assert by_name["hangs"].seconds < 30  # stopped after its 2 s, not after its 60 s sleep
    assert [r.status for r in results] == ["failed", "failed", "failed", "skipped", "passed"]
    assert by_name["raises"].outcome.note == "RuntimeError: broken on purpose"
    assert "Traceback" in by_name["raises"].outcome.error
    assert by_name["dies"].outcome.note.startswith("LaunchError")
    assert by_name["hangs"].outcome.note.startswith("LaunchError")
    assert by_name["passes"].outcome.figures == {"answer": 42}


def test_the_all_reduce_rank_checks_parity_on_gloo():
    """Part d's rank function, on 2 CPU ranks (the report runs it only with NCCL)."""
    ranks = course_lib.launch(device_checks.all_reduce_rank, 2, 2**20, backend="gloo")
    outcome = device_checks.all_reduce_outcome(ranks, 2, 2**20, backend="gloo")
    assert outcome.status == "passed", outcome
    assert outcome.figures["ranks"] == 2
    assert outcome.figures["parity: max |all-reduced - expected|"] <= 1e-4
    bad = [{**r, "max_abs_error": 1.0} for r in ranks]
    assert device_checks.all_reduce_outcome(bad, 2, 2**20, backend="gloo").status == "failed"


def test_the_report_escapes_tables_and_shows_errors():
    env = Environment(
        device="cuda",
        gpus=("0: Card, 80 GiB, sm 9.0",),
        driver="550.1",
        cuda="12.8",
        torch="2.13.0",
        cudnn="91000",
        nccl="2.21.5",
        cpu="cpu",
        platform="Linux",
        commit="abc",
    )
    results = [
        CheckResult("x", "a", Outcome({"a|b (MiB)": 1.5, "n": 12345, "big": 2.5e4}), 1.0),
        CheckResult("y", "d", Outcome(status="failed", note="bad", error="Traceback: boom"), 2.0),
    ]
    text = render(env, results, dt.datetime(2030, 1, 2, 3, 4))
    assert text.startswith("# GPU check, 2030-01-02")
    assert "not a GPU report" not in text
    assert (
        "| a\\|b (MiB) | 1.5 |" in text and "| n | 12,345 |" in text and "| big | 25,000 |" in text
    )
    assert "2 checks, 1 passed, 1 failed, 0 skipped" in text
    assert "```text\nTraceback: boom\n```" in text
    assert "| GPUs | 1: 0: Card, 80 GiB, sm 9.0 |" in text


def test_the_fp8_and_step_checks_time_with_the_one_cuda_timer():
    from course_tools.gpu_check import cuda_time, fp8_checks, step_checks

    for module in (fp8_checks, step_checks):
        assert module.median_ms is cuda_time.median_ms
        assert not hasattr(module, "_median_ms")


def test_the_cuda_timer_warms_up_then_takes_the_median_of_event_pairs(monkeypatch):
    """CUDA events stood in for on the CPU: each pair reports the next of the given times."""
    from course_tools.gpu_check.cuda_time import median_ms

    elapsed = iter([5.0, 1.0, 9.0, 3.0, 7.0, 2.0])
    calls, synced = [], []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            assert synced, "read before the device is synchronized"
            return next(elapsed)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(1))
    assert median_ms(lambda: calls.append(1), repeat=5) == 5.0  # 1, 3, 5, 7, 9
    assert len(calls) == 6 and len(synced) == 5  # one warm-up call, untimed
    assert median_ms(lambda: None, repeat=1) == 2.0
    with pytest.raises(ValueError, match="repeat = 0: expected"):
        median_ms(lambda: None, repeat=0)
