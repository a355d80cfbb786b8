"""Timing on the GPU, one way for every check that times a kernel: CUDA events around each call.

The FP8 check (unit 17) and the inside-the-step check (unit 19) both time with
:func:`median_ms`, so their milliseconds are measured alike and can be read side by side.
"""

from __future__ import annotations

from collections.abc import Callable

from course_lib import validate


def median_ms(fn: Callable[[], object], repeat: int = 10) -> float:
    """Median milliseconds of ``repeat`` calls of ``fn`` on the current CUDA device, after one
    untimed warm-up call (kernels chosen or compiled, workspace allocated). Each call is timed
    by a pair of CUDA events recorded on the stream around it, read once the device is
    synchronized; with an even ``repeat`` the upper of the two middle times."""
    import torch

    n = validate.count("repeat", repeat, minimum=1)
    fn()
    times: list[float] = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(float(start.elapsed_time(end)))
    return sorted(times)[len(times) // 2]
