"""Unit 13's graded checks and the recorded sweep they grade on."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py
from _rewritten import rewritten

from course_lib import kit
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


def _relative_polyfit(sizes, times):
    # numpy weights multiply the residuals: w = 1/T minimises the squared relative error
    t = np.asarray(times, float)
    beta, alpha = np.polyfit(np.asarray(sizes, float), t, 1, w=1 / t)
    return alpha, beta


def _smallest_time_as_alpha(s, t):
    return min(t), _relative_polyfit(s, t)[1]


def _beta_one_gbps(s, t):
    return _relative_polyfit(s, t)[0], 1 / 1e9


def _not_implemented(s, t):
    raise NotImplementedError()


def test_task1_accepts_the_relative_fit_and_rejects_plain_least_squares(seed):
    said = kit.check_table(
        G.check_alpha_beta_fit,
        [
            (_relative_polyfit, "✓ task 1: "),
            (_polyfit, "✗ task 1: .*plain least-squares fit"),
            (_smallest_time_as_alpha, "✗ task 1: .*your alpha = .* the relative-error fit's"),
            (_beta_one_gbps, "✗ task 1: .*your beta = "),
            (_not_implemented, "✗ task 1: not implemented yet"),
            (lambda s, t: 3.0, "✗ task 1: .*expected a pair"),
        ],
    )
    assert (
        said[0] == "✓ task 1: alpha and beta match the relative-error fit on all 6 recorded sweeps"
    )


def test_exposed_comm_time_follows_the_documented_pipeline():
    # 3 buckets of 100 B, backward 3 s (ready at 1, 2, 3 s), each all-reduce 0.5 + 100 * 0.005 s
    t = estimate.ddp_exposed_comm_time(100, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.005)
    assert t == pytest.approx(1.0)  # no queue: the last one starts at 3 s, ends at 4 s
    # slower links queue up: each takes 2.5 s -> ends at 1+2.5*3 = 8.5 s
    t = estimate.ddp_exposed_comm_time(100, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.02)
    assert t == pytest.approx(5.5)
    # one bucket: everything after backward
    assert estimate.ddp_exposed_comm_time(
        10**6, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.01
    ) == pytest.approx(3.5)
    # remainder bucket: 250 B in 100 B buckets -> 100, 100, 50
    assert estimate.ddp_exposed_comm_time(
        100, grad_bytes=250, backward_s=0.0, alpha=1.0, beta=0.0
    ) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="bucket_bytes"):
        estimate.ddp_exposed_comm_time(0, grad_bytes=1, backward_s=1, alpha=0, beta=0)


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


def test_task2_reference_rule_and_its_check(seed, capsys):
    from course_lib.units.u13_interconnects_and_backends._cases import bucket_scenarios

    answers = [G.reference_bucket_bytes(*s[1:]) for s in bucket_scenarios(2)]
    assert len(set(answers)) >= 2  # latency-bound and bandwidth-bound scenarios differ
    L = rewritten("course_lib.measure.estimate.links")  # the exposure model, as a learner wrote it

    def own_choice(alpha, beta, backward_s, grad_bytes, candidates):
        times = {
            c: L.ddp_exposed_comm_time(
                c, grad_bytes=grad_bytes, backward_s=backward_s, alpha=alpha, beta=beta
            )
            for c in candidates
        }
        best = min(times.values())
        return max(
            c for c, t in times.items() if math.isclose(t, best, rel_tol=1e-9, abs_tol=1e-15)
        )

    G.check_bucket_choice(own_choice)
    out = capsys.readouterr().out
    assert out == "✓ task 2: bucket sizes match the reference rule in 5 drawn scenarios\n"
    with pytest.raises(AssertionError, match="✗ task 2: scenario .*: you chose") as err:
        G.check_bucket_choice(lambda a, b, bw, g, c: min(c))
    with pytest.raises(AssertionError, match="✗ task 2: scenario .*: you chose") as err:
        G.check_bucket_choice(lambda a, b, bw, g, c: max(c))  # always the biggest bucket
    assert "KiB" not in str(err.value)  # the answer is never printed
    table = iter(answers * 2)  # seed 0's or 7's answers, in order
    G.check_bucket_choice(lambda *a: next(table))
    other = "7" if seed == "0" else "0"
    import os

    os.environ["COURSE_GRADE_SEED"] = other  # restored by the fixture's monkeypatch
    with pytest.raises(AssertionError, match="✗ task 2: scenario"):
        G.check_bucket_choice(lambda *a: next(table))
    # ties go to the larger bucket: with no latency and no backward every size is the same
    assert G.reference_bucket_bytes(0.0, 1e-9, 0.0, MiB, [KiB, MiB]) in (KiB, MiB)


def _ring(n_params, dtype, world_size, link):
    size = n_params * estimate.dtype_bytes(dtype)
    return (
        2
        * (world_size - 1)
        / world_size
        * size
        / (estimate.link_speed(link).per_direction_GBps * 1e9)
    )


def test_task3_find_the_bug_per_direction(seed, capsys):
    G.check_allreduce_prediction(_ring)
    assert capsys.readouterr().out == (
        "✓ task 3: all-reduce times match estimate on 5 drawn links and models, NVLink at its "
        "per-direction bandwidth\n"
    )
    with pytest.raises(AssertionError, match="✗ task 3: .*bidirectional headline"):
        G.check_allreduce_prediction(G.buggy_predict_allreduce_s)  # the bug left in
    with pytest.raises(AssertionError, match="✗ task 3: .*less than the ring"):  # no 2(n-1)/n
        G.check_allreduce_prediction(
            lambda n, d, w, link: (
                n * estimate.dtype_bytes(d) / (estimate.link_speed(link).per_direction_GBps * 1e9)
            )
        )
    with pytest.raises(
        AssertionError, match="✗ task 3: uses the course's own allreduce_time_on_link"
    ):
        G.check_allreduce_prediction(
            lambda n, d, w, link: estimate.allreduce_time_on_link(
                n * estimate.dtype_bytes(d), w, estimate.link_speed(link).per_direction_GBps
            )
        )


def _scale(n_params):
    size = 2 * n_params  # bf16
    nv, ib = 450e9, 50e9  # per direction
    node = 2 * 7 / 8 * size / nv
    intra = 7 * (size / 8) / nv  # ring reduce-scatter (and all-gather) in the node
    inter = 2 * 3 / 4 * (size / 8) / ib  # ring all-reduce of one shard across 4 nodes
    return {"node": node, "cluster": 2 * intra + inter}


def test_task4_scale_it_up(seed, capsys):
    G.check_scale_up(_scale)
    assert capsys.readouterr().out == (
        "✓ task 4: one node and 4 nodes: all-reduce times match estimate for two drawn model "
        "sizes\n"
    )
    with pytest.raises(AssertionError, match="✗ task 4: .*node"):  # headline NVLink figure
        G.check_scale_up(lambda n: {**_scale(n), "node": _scale(n)["node"] / 2})
    with pytest.raises(AssertionError, match="✗ task 4: .*cluster"):  # a flat ring on the NIC
        G.check_scale_up(lambda n: {**_scale(n), "cluster": 2 * 31 / 32 * 2 * n / 50e9})
    with pytest.raises(
        AssertionError, match="✗ task 4: uses the course's own hierarchical_allreduce_time"
    ):
        G.check_scale_up(
            lambda n: {
                "node": _scale(n)["node"],
                "cluster": estimate.hierarchical_allreduce_time(
                    2 * n, nodes=4, gpus_per_node=8, intra_GBps=450, inter_GBps=50
                ),
            }
        )
    with pytest.raises(AssertionError, match="expected a dict"):
        G.check_scale_up(lambda n: 1.0)


def _interpolate(sizes, times, size):
    t = np.asarray(times, float)
    beta, alpha = np.polyfit(np.asarray(sizes, float), t, 1, w=1 / t)
    return float(alpha + beta * size)


def test_task5_predict_then_measure(capsys):
    G.check_predict_heldout(_interpolate)  # a real measurement on 2 ranks
    assert capsys.readouterr().out == (
        "✓ task 5: the prediction for 4 MiB is within a factor of 3 of the all-reduce measured "
        "now on 2 gloo ranks\n"
    )


def test_task5_rejects_wrong_and_borrowed_predictions(monkeypatch):
    # the verdict logic on a fixed "measurement" (alpha 0.3 ms, 1 GB/s, 4 MiB 20 % slow)
    fake = {s: 3e-4 + s / 1e9 * (1.2 if s == G.HELD_OUT else 1.0) for s in G.PREDICT_SIZES}
    monkeypatch.setattr(G, "_measure_all_reduce", lambda sizes: dict(fake))
    G.check_predict_heldout(_interpolate)
    with pytest.raises(
        AssertionError, match="✗ task 5: for 4 MiB, in 3 runs: predicted .*within a factor of 3"
    ):
        G.check_predict_heldout(lambda s, t, size: _interpolate(s, t, size) * 1e3)  # in ms, not s
    with pytest.raises(AssertionError, match="✗ task 5: for 4 MiB"):
        G.check_predict_heldout(lambda s, t, size: t[0])  # alpha only: 0.3 ms for 4.5 ms
    with pytest.raises(AssertionError, match="✗ task 5: uses the course's own fit_alpha_beta"):
        G.check_predict_heldout(
            lambda s, t, size: sum(
                c * x for c, x in zip(estimate.fit_alpha_beta(s, t, relative=True), (1, size))
            )
        )
    with pytest.raises(AssertionError, match="✗ task 5: expected a positive number"):
        G.check_predict_heldout(lambda s, t, size: "soon")


def test_no_absolute_paths_in_the_recorded_sweep():
    path = os.path.join(os.path.dirname(G.__file__), "data", "sweep.json")
    with open(path) as f:
        text = f.read()
    assert "/tmp/" not in text and "/work/" not in text and "/home/" not in text


def test_tasks_3_and_4_fail_a_copied_table_or_the_lecture_models(monkeypatch):
    from course_lib.units.u13_interconnects_and_backends import _cases as K

    times = {c: _ring(*c) for c in K.link_cases(3)}  # seed 0's, built here
    lecture = {7_000_000_000: _scale(7_000_000_000), 70_000_000_000: _scale(70_000_000_000)}
    G.check_allreduce_prediction(lambda *c: times.get(c, 1.0))
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 3: "):
        G.check_allreduce_prediction(lambda *c: times.get(c, 1.0))
    with pytest.raises(AssertionError, match="✗ task 4: "):
        G.check_scale_up(lambda n: lecture.get(n, {"node": 0.05, "cluster": 0.1}))


def test_task1_a_fit_copied_from_the_full_sweep_fails(monkeypatch):
    full = {(len(s), round(sum(s))): _relative_polyfit(s, t) for _c, _w, s, t in G._groups()}
    # the fits of the whole recorded sweep (what the lecture prints), looked up by group
    by_group = iter(list(full.values()) * 2)
    with pytest.raises(AssertionError, match="✗ task 1: "):
        G.check_alpha_beta_fit(lambda s, t: next(by_group))
