"""Checks for the exercises of unit 13 (solutions/13_interconnects_and_backends.ipynb).

Three tasks, each graded on hardware-independent data so the verdict is the same everywhere:

1. fit alpha and beta to a *recorded* sweep (``data/sweep.json``, shipped with the course:
   a real gloo sweep, with where and how it was recorded stored in the file);
2. choose a DDP bucket size for a given alpha, beta and backward time, against the reference rule
   :func:`reference_bucket_bytes` documented below;
3. predict a gradient all-reduce time on a published link, against
   ``estimate.allreduce_time_on_link``.

Each check prints one deterministic line or raises AssertionError.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Sequence

from course_lib.grading.core import expect_int, fail, passed, run_learner

__all__ = [
    "load_sweep",
    "sweep_provenance",
    "exposed_comm_time",
    "reference_bucket_bytes",
    "BUCKET_SCENARIOS",
    "check_alpha_beta_fit",
    "check_bucket_choice",
    "check_allreduce_prediction",
]

MiB = 2**20


# --------------------------------------------------------------------------------------------
# the recorded sweep
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _sweep_document() -> dict:
    with resources.files(__package__).joinpath("data/sweep.json").open() as f:
        return json.load(f)


def load_sweep():
    """The recorded gloo sweep as a tidy DataFrame (same columns as
    ``run.collective_sweep``; see :func:`sweep_provenance`)."""
    import pandas as pd

    doc = _sweep_document()
    return pd.DataFrame(doc["records"], columns=doc["columns"])


def sweep_provenance() -> dict:
    """Where, when and how the recorded sweep was measured (machine, torch version, date...)."""
    return dict(_sweep_document()["provenance"])


# --------------------------------------------------------------------------------------------
# the reference rule for task 2
# --------------------------------------------------------------------------------------------
#: Seconds of communication left after backward for one bucket size: the model is
def exposed_comm_time(*args, **kwargs):
    """``estimate.ddp_exposed_comm_time`` (documented there), under its old name."""
    from course_lib.measure import estimate

    return estimate.ddp_exposed_comm_time(*args, **kwargs)


def reference_bucket_bytes(alpha: float, beta: float, backward_s: float, grad_bytes: int,
                           candidates: Sequence[int]) -> int:
    """The candidate bucket size with the least exposed communication
    (``estimate.ddp_exposed_comm_time``); on a tie (within a relative 1e-9) the larger bucket,
    which makes fewer calls."""
    if not candidates:
        raise ValueError("candidates must not be empty")
    from course_lib.measure import estimate

    best, best_t = None, math.inf
    for b in sorted(int(c) for c in candidates):
        t = estimate.ddp_exposed_comm_time(b, grad_bytes=grad_bytes, backward_s=backward_s,
                                           alpha=alpha, beta=beta)
        if best is None or t < best_t or math.isclose(t, best_t, rel_tol=1e-9, abs_tol=1e-15):
            best, best_t = b, min(t, best_t)
    return best


_CANDIDATES = (MiB // 4, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)

#: (name, alpha s, beta s/byte, backward s, gradient bytes, candidate bucket sizes): the cases
#: task 2 grades, from latency-bound to bandwidth-bound.
BUCKET_SCENARIOS = (
    ("gloo on a laptop: high latency", 2e-3, 1 / 1e9, 0.5, 400 * MiB, _CANDIDATES),
    ("NVLink node, short backward", 50e-6, 1 / 300e9, 0.01, 2000 * MiB, _CANDIDATES),
    ("InfiniBand, long backward", 30e-6, 1 / 25e9, 0.3, 2000 * MiB, _CANDIDATES),
    ("slow Ethernet, short backward", 100e-6, 1 / 1.25e9, 0.05, 100 * MiB, _CANDIDATES),
    ("low latency, backward hides everything", 10e-6, 1 / 300e9, 0.2, 2000 * MiB, _CANDIDATES),
)


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
#: the course's own answers, out of reach while the learner's function runs
_FIT_REFERENCES = ("course_lib.measure.estimate.links:fit_alpha_beta",)
_BUCKET_REFERENCES = ("course_lib.measure.estimate.links:ddp_exposed_comm_time",
                      "course_lib.units.u13_interconnects_and_backends.checks:reference_bucket_bytes")
_LINK_REFERENCES = ("course_lib.measure.estimate.links:allreduce_time_on_link", "course_lib.measure.estimate.links:allreduce_time",
                    "course_lib.measure.estimate.links:alpha_beta_time")


def _groups():
    df = load_sweep()
    for (coll, ws), g in df.groupby(["collective", "world_size"], sort=True):
        yield coll, int(ws), g["size_bytes"].tolist(), g["time_s"].tolist()


def check_alpha_beta_fit(fit_alpha_beta, task: int = 1) -> None:
    """Task: least-squares T = alpha + beta S on every (collective, world size) of the recorded
    sweep, compared with estimate.fit_alpha_beta (rtol 1e-6; alpha also within 1e-9 s)."""
    from course_lib.measure import estimate

    n = 0
    for coll, ws, sizes, times in _groups():
        expected = estimate.fit_alpha_beta(sizes, times)
        got = run_learner(task, fit_alpha_beta, list(sizes), list(times), forbid=_FIT_REFERENCES)
        try:
            alpha, beta = (float(v) for v in got)
        except (TypeError, ValueError):
            fail(task, f"{coll}, {ws} ranks: expected a pair (alpha_s, beta_s_per_byte), got {got!r}")
        for name, g, e, atol in (("alpha", alpha, expected[0], 1e-9), ("beta", beta, expected[1], 0.0)):
            if not math.isclose(g, e, rel_tol=1e-6, abs_tol=atol):
                fail(task, f"{coll}, {ws} ranks: expected {name} = {e:.6g}, got {g:.6g} "
                           "(least squares of time_s on size_bytes, both in base units)")
        n += 1
    passed(task, f"alpha and beta match the least-squares reference on all {n} recorded sweeps")


def check_bucket_choice(choose_bucket_bytes, task: int = 2) -> None:
    """Task: pick the bucket size with the least exposed communication (reference rule:
    :func:`reference_bucket_bytes`) in every scenario of :data:`BUCKET_SCENARIOS`."""
    from course_lib.measure import estimate

    chosen = []
    for name, alpha, beta, bwd, grad, cands in BUCKET_SCENARIOS:
        expected = reference_bucket_bytes(alpha, beta, bwd, grad, cands)
        got = run_learner(task, choose_bucket_bytes, alpha, beta, bwd, grad, list(cands),
                          forbid=_BUCKET_REFERENCES)
        expect_int(task, f"the bucket size (bytes) in scenario '{name}'", got)
        if got != expected:
            t_exp = estimate.ddp_exposed_comm_time(expected, grad_bytes=grad, backward_s=bwd,
                                                   alpha=alpha, beta=beta)
            detail = ""
            if isinstance(got, int) and not isinstance(got, bool) and got > 0:
                t_got = estimate.ddp_exposed_comm_time(got, grad_bytes=grad, backward_s=bwd,
                                                       alpha=alpha, beta=beta)
                detail = f" (exposed {t_got * 1e3:.3f} ms vs {t_exp * 1e3:.3f} ms)"
            fail(task, f"scenario '{name}': expected {expected // 1024} KiB, got {got!r}{detail}")
        chosen.append(f"{expected // MiB if expected >= MiB else expected / MiB:g} MiB")
    passed(task, f"bucket sizes match the reference rule in {len(chosen)} scenarios "
                 f"({', '.join(chosen)})")


_LINK_CASES = (  # (n_params, dtype, world_size, link name)
    (1_000_000_000, "bf16", 8, "NVLink H100"),
    (1_000_000_000, "bf16", 8, "InfiniBand NDR"),
    (7_000_000_000, "bf16", 8, "NVLink A100"),
    (7_000_000_000, "fp32", 16, "PCIe 4.0 x16"),
    (7_000_000_000, "bf16", 64, "100 GbE"),
)


def check_allreduce_prediction(predict_allreduce_s, task: int = 3) -> None:
    """Task: ring all-reduce time of a model's gradients on a published link (headline GB/s),
    compared with estimate.allreduce_time_on_link (rtol 1e-6)."""
    from course_lib.measure import estimate

    for n_params, dtype, ws, link in _LINK_CASES:
        size = n_params * estimate.dtype_bytes(dtype)
        expected = estimate.allreduce_time_on_link(size, ws, estimate.link_speed(link).GBps)
        got = run_learner(task, predict_allreduce_s, n_params, dtype, ws, link,
                          forbid=_LINK_REFERENCES)
        try:
            ok = math.isclose(float(got), expected, rel_tol=1e-6)
        except (TypeError, ValueError):
            fail(task, f"{n_params:.0e} params ({dtype}), {ws} ranks, {link}: expected seconds "
                       f"(a float), got {got!r}")
        if not ok:
            fail(task, f"{n_params:.0e} params ({dtype}), {ws} ranks, {link}: expected "
                       f"{expected * 1e3:.4g} ms, got {float(got) * 1e3:.4g} ms")
    first = estimate.allreduce_time_on_link(2 * 10**9, 8, estimate.link_speed("NVLink H100").GBps)
    passed(task, f"all-reduce times match estimate on {len(_LINK_CASES)} links and models "
                 f"(1B bf16 over 8 ranks on NVLink H100: {first * 1e3:.1f} ms)")
