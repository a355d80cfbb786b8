"""course_lib.measure.bucket_sweep's refusals before any rank starts. The sweep itself runs on
real ranks in tests/units/u09_data_parallelism/test_u09_run.py (the course's DataParallel as
"course") and torch_ddp_buckets in tests/parallel/test_ddp.py."""

from __future__ import annotations

import pytest

from course_lib.measure import bucket_sweep as B


def test_course_needs_the_callers_data_parallel():
    with pytest.raises(TypeError, match=r"ours = None: implementations \('course',\)"):
        B.ddp_bucket_sweep((1,), implementations="course")
    with pytest.raises(TypeError, match="ours = 3"):
        B.ddp_bucket_sweep((1,), implementations=("torch", "course"), ours=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"implementations": ("mine",)}, "implementations"),
        ({"world_size": 1}, "world_size"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        B.ddp_bucket_sweep((1,), **kwargs)


def test_no_cap_is_refused():
    with pytest.raises(ValueError, match="bucket_caps_mb = \\(\\)"):
        B.ddp_bucket_sweep(())
