"""Unit 18's graded checks: a right answer passes, a wrong one fails, the course's own is refused."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist

from course_lib import kit
from course_lib.units.u18_failures_and_checkpoints import checks as C


class RightState:
    def __init__(self, model, optimizer, scheduler, data):
        self.model, self.optimizer, self.scheduler, self.data = model, optimizer, scheduler, data
        self.step = 0

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        m, o = get_state_dict(self.model, self.optimizer)
        return {
            "model": m,
            "optim": o,
            "step": self.step,
            "sched": self.scheduler.state_dict(),
            "data": self.data.state_dict(),
            "rng": [torch.get_rng_state(), random.getstate(), np.random.get_state()],
        }

    def load_state_dict(self, sd):
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        set_model_state_dict(self.model, sd["model"])
        set_optimizer_state_dict(self.model, self.optimizer, sd["optim"])
        self.step = sd["step"]
        self.scheduler.load_state_dict(sd["sched"])
        self.data.load_state_dict(sd["data"])
        torch.set_rng_state(sd["rng"][0])


class NoRngState(RightState):  # forgets the dropout generator
    def load_state_dict(self, sd):
        saved = torch.get_rng_state()
        super().load_state_dict(sd)
        torch.set_rng_state(saved)


class CourseState(RightState):
    def state_dict(self):
        from course_lib.resilience.state import rng_state

        sd = super().state_dict()
        sd["rng"] = rng_state()
        return sd


@pytest.mark.slow
def test_train_state():
    kit.check_table(
        C.check_train_state,
        [
            (RightState, "✓ task 1: a run killed after its checkpoint"),
            (NoRngState, r"✗ task 1: loss of step \d+: resumed"),
            (CourseState, "✗ task 1: uses the course's own"),
        ],
    )


def clip_right(shards, max_norm):
    sq = torch.zeros(1, dtype=torch.float64)
    for g in shards:
        sq += (g.double() ** 2).sum()
    dist.all_reduce(sq)
    norm = float(sq.sqrt())
    for g in shards:
        g.mul_(min(1.0, max_norm / (norm + 1e-6)))
    return norm


def clip_local(shards, max_norm):  # the bug
    return float(torch.nn.utils.clip_grad_norm_(shards, max_norm))


def clip_course(shards, max_norm):
    from course_lib.units.u18_failures_and_checkpoints.run_trouble import _norm_rank

    return _norm_rank(0, 2, max_norm=max_norm)


@pytest.mark.slow
def test_clip():
    kit.check_table(
        C.check_clip,
        [
            (clip_right, "✓ task 2: the norm of the whole gradient"),
            (clip_local, r"✗ task 2: rank 0, norm above max_norm: returned"),
            (clip_course, "✗ task 2: uses the course's own"),
        ],
    )


def _goodput(gpus, save_s, restart_s):
    m = 54 * 24 * 3600 / 419 * 16384 / gpus
    tau = (2 * save_s * m) ** 0.5
    return tau / (m * math.exp(restart_s / m) * (math.exp((tau + save_s) / m) - 1))


def cluster_right(save_s, restart_s):
    lo, hi = 1, 2
    while _goodput(hi, save_s, restart_s) >= 0.9:  # double (a huge cluster overflows exp)
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # goodput(lo) >= 0.9 > goodput(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _goodput(mid, save_s, restart_s) >= 0.9 else (lo, mid)
    return hi


def cluster_no_restart(save_s, restart_s):
    return cluster_right(save_s, 0.0)


def cluster_course(save_s, restart_s):
    from course_lib.measure import estimate

    return int(estimate.job_mtbf(save_s, 1))


def test_cluster(capsys, monkeypatch):
    # hand-checked: the lecture's 2.83 s save and 10-minute restart give 92.6 % at 16,384 GPUs
    # (its section 8) and fall below 90 % between there and 65,536 (77 %)
    assert 16384 < C._smallest_cluster(2.834, 600.0) < 65536
    want = C._smallest_cluster(2.834, 600.0)
    assert _goodput(want, 2.834, 600.0) < 0.9 <= _goodput(want - 1, 2.834, 600.0)
    C.check_cluster(cluster_right)
    assert capsys.readouterr().out.startswith("✓ task 3: the cluster size at which goodput falls")
    with pytest.raises(AssertionError, match=r"✗ task 3: smallest_cluster\(.*\) = [\d,]+: at that"):
        C.check_cluster(cluster_no_restart)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own"):
        C.check_cluster(cluster_course)
    monkeypatch.setenv("COURSE_GRADE_SEED", "5")  # another grading: other cases, the same ✓
    C.check_cluster(cluster_right)
    assert capsys.readouterr().out.startswith("✓ task 3: the cluster size")


def largest_dp_right(global_tokens, link_GBps):
    return math.floor(1 + global_tokens * link_GBps * 1e9 / 989e12)


def test_dp_overlap(capsys, monkeypatch):
    from course_lib.units.u18_failures_and_checkpoints.checks_overlap import largest_dp

    # hand-derived: 2^21 tokens over one 50 GB/s port: 2,097,152 / 19,780 = 106.02, so 107 GPUs
    assert largest_dp(2**21, 50.0) == 107
    C.check_dp_overlap(largest_dp_right)
    assert capsys.readouterr().out.startswith("✓ task 4: the largest data-parallel size")
    with pytest.raises(AssertionError, match=r"✗ task 4: largest_dp\("):
        C.check_dp_overlap(lambda g, b: largest_dp_right(g, b) + 1)
    with pytest.raises(AssertionError, match=r"✗ task 4: largest_dp\("):  # N/(N-1) dropped
        C.check_dp_overlap(lambda g, b: math.floor(g * b * 1e9 / 989e12))
    monkeypatch.setenv("COURSE_GRADE_SEED", "5")
    C.check_dp_overlap(largest_dp_right)


@pytest.mark.parametrize("junk", [None, {}, [], [None] * 3, [(float("nan"), float("nan"))] * 3])
def test_judges_refuse_malformed_data(junk):
    # the judge half trusts nothing the learner's side hands back: a ✗, never a ✓ or a crash
    # (task 1's judge refuses before it launches its reference run)
    for check in (C.check_train_state, C.check_clip, C.check_cluster, C.check_dp_overlap):
        with pytest.raises(AssertionError, match=rf"✗ task {check.task}: "):
            check.run_judge(junk)
