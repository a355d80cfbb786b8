"""Unit 13's graded checks and the recorded sweep they grade on."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from course_lib.grading.references import rewritten
from course_lib.measure import estimate
from course_lib.units.u13_interconnects_and_backends import checks as G
from course_lib.units.u13_interconnects_and_backends import run as E

KiB, MiB = estimate.KiB, estimate.MiB




# ----------------------------------------------------------------------------- grading
def test_recorded_sweep_is_complete_and_documented():
    df = G.load_sweep()
    prov = G.sweep_provenance()
    for key in ("machine", "torch_version", "date", "recorded_with", "backend"):
        assert prov[key], key
    assert set(df["collective"]) == set(E.SWEEP_COLLECTIVES)
    assert set(df["world_size"]) == {2, 4}
    assert df["size_bytes"].min() == KiB
    assert (df["time_s"] > 0).all()
    np.testing.assert_allclose(df["algbw_GBps"], df["size_bytes"] / df["time_s"] / 1e9, rtol=1e-9)


def _polyfit(sizes, times):
    beta, alpha = np.polyfit(np.asarray(sizes, float), np.asarray(times, float), 1)
    return alpha, beta


def test_task1_accepts_least_squares_and_rejects_other_fits(capsys):
    G.check_alpha_beta_fit(_polyfit)
    assert capsys.readouterr().out == (
        "✓ task 1: alpha and beta match the least-squares reference on all 6 recorded sweeps\n")
    with pytest.raises(AssertionError, match="✗ task 1: .*expected alpha"):
        G.check_alpha_beta_fit(lambda s, t: (min(t), _polyfit(s, t)[1]))  # smallest time as alpha
    with pytest.raises(AssertionError, match="✗ task 1: .*expected beta"):
        G.check_alpha_beta_fit(lambda s, t: (_polyfit(s, t)[0], 1 / 1e9))
    with pytest.raises(AssertionError, match="✗ task 1: not implemented yet"):
        G.check_alpha_beta_fit(lambda s, t: (_ for _ in ()).throw(NotImplementedError()))
    with pytest.raises(AssertionError, match="expected a pair"):
        G.check_alpha_beta_fit(lambda s, t: 3.0)


def test_exposed_comm_time_follows_the_documented_pipeline():
    # 3 buckets of 100 B, backward 3 s (ready at 1, 2, 3 s), each all-reduce 0.5 + 100 * 0.005 s
    t = G.exposed_comm_time(100, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.005)
    assert t == pytest.approx(1.0)  # no queue: the last one starts at 3 s, ends at 4 s
    # slower links queue up: each takes 2.5 s -> ends at 1+2.5*3 = 8.5 s
    t = G.exposed_comm_time(100, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.02)
    assert t == pytest.approx(5.5)
    # one bucket: everything after backward
    assert G.exposed_comm_time(10**6, grad_bytes=300, backward_s=3.0, alpha=0.5,
                               beta=0.01) == pytest.approx(3.5)
    # remainder bucket: 250 B in 100 B buckets -> 100, 100, 50
    assert G.exposed_comm_time(100, grad_bytes=250, backward_s=0.0, alpha=1.0,
                               beta=0.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="bucket_bytes"):
        G.exposed_comm_time(0, grad_bytes=1, backward_s=1, alpha=0, beta=0)


def test_task2_reference_rule_and_its_check(capsys):
    answers = [G.reference_bucket_bytes(*s[1:]) for s in G.BUCKET_SCENARIOS]
    assert len(set(answers)) == len(answers)  # every scenario needs a different answer
    L = rewritten("course_lib.measure.estimate.links")  # the exposure model, as a learner wrote it

    def own_choice(alpha, beta, backward_s, grad_bytes, candidates):
        times = {c: L.ddp_exposed_comm_time(c, grad_bytes=grad_bytes, backward_s=backward_s,
                                            alpha=alpha, beta=beta) for c in candidates}
        best = min(times.values())
        return max(c for c, t in times.items() if math.isclose(t, best, rel_tol=1e-9, abs_tol=1e-15))

    G.check_bucket_choice(own_choice)
    out = capsys.readouterr().out
    assert out.startswith("✓ task 2: bucket sizes match the reference rule in 5 scenarios")
    with pytest.raises(AssertionError, match="✗ task 2: scenario"):
        G.check_bucket_choice(lambda a, b, bw, g, c: max(c))  # always the biggest bucket
    with pytest.raises(AssertionError, match="✗ task 2: scenario"):
        G.check_bucket_choice(lambda a, b, bw, g, c: min(c))
    # ties go to the larger bucket: with no latency and no backward every size is the same
    assert G.reference_bucket_bytes(0.0, 1e-9, 0.0, MiB, [KiB, MiB]) in (KiB, MiB)


def test_task3_against_estimate(capsys):
    def ring(n_params, dtype, world_size, link):
        size = n_params * estimate.dtype_bytes(dtype)
        return 2 * (world_size - 1) / world_size * size / (estimate.link_speed(link).GBps * 1e9)

    G.check_allreduce_prediction(ring)
    assert capsys.readouterr().out == (
        "✓ task 3: all-reduce times match estimate on 5 links and models "
        "(1B bf16 over 8 ranks on NVLink H100: 3.9 ms)\n")
    with pytest.raises(AssertionError, match="✗ task 3: .*expected"):  # forgot the 2(n-1)/n
        G.check_allreduce_prediction(
            lambda n, d, w, link: n * estimate.dtype_bytes(d) / (estimate.link_speed(link).GBps * 1e9))
    with pytest.raises(AssertionError, match="✗ task 3: .*expected"):  # per-direction figure
        G.check_allreduce_prediction(
            lambda n, d, w, link: 2 * (w - 1) / w * n * estimate.dtype_bytes(d)
            / (estimate.link_speed(link).per_direction_GBps * 1e9) if "NVLink" in link else
            ring(n, d, w, link))


def test_no_absolute_paths_in_the_recorded_sweep():
    path = os.path.join(os.path.dirname(G.__file__), "data", "sweep.json")
    with open(path) as f:
        text = f.read()
    assert "/tmp/" not in text and "/work/" not in text and "/home/" not in text
