"""Narayanan et al. 2021 (arXiv:2104.04473) Table 1, the weak-scaling GPTs on A100s, priced at
the planner's best micro-batch (the table does not give it) with full recomputation: flat (one
60 % for every product), by shape, and as run (by shape without sequence parallelism, which
Korthikanti et al. 2022, arXiv:2205.05198, introduced a year later: every rank of a TP group
runs the whole LayerNorm, dropout and residual kernels). By shape the A100's GEMM ceiling is
the H100's measured 76 % (``estimate.GEMM_CALIBRATIONS["A100 bf16"]``, an assumption). The
table's figures are recalled (not checked against the paper text here): params, heads, hidden,
layers, TP, PP, GPUs, batch, TFLOP/s per GPU counting the recomputation. Formulas only."""

from __future__ import annotations

import dataclasses
import math

import pytest

from course_lib import plan as P
from course_lib.plan.specs import ModelSpec

A100 = "8xA100-80GB + 200G IB"
_GPT = dict(
    gated_mlp=False, bias=True, norm="layernorm", tied_embeddings=True, learned_positions=True
)
TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]  # fmt: skip


def _as_run(row: tuple, nvlink_GBps: float | None = None) -> float:
    """The residual by shape without sequence parallelism, at the best micro-batch, v and
    ZeRO 0/1 (``plan()`` always splits those kernels, so each layout is evaluated here);
    ``nvlink_GBps`` replaces the preset's NVLink rate."""
    n, a, h, L, tp, pp, gpus, batch, tflops = row
    m = ModelSpec(f"GPT-{n}B", L, h, a, a, 4 * h, 51200, 2048, dropout=True, **_GPT)
    how, cl = P.DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape"), P.cluster(A100, gpus=gpus)
    if nvlink_GBps is not None:
        cl = dataclasses.replace(cl, intra_GBps=nvlink_GBps)
    dp = gpus // (tp * pp)
    best = math.inf
    for mb in [d for d in range(1, 9) if (batch // dp) % d == 0]:
        for v in (1, 2, 4, 8) if pp > 1 else (1,):
            for zero in (0, 1):
                lay = P.Layout(dp, tp, pp, zero, "full", mb, v, sequence_parallel=False)
                try:
                    row = P.evaluate(m, cl, lay, global_batch_tokens=batch * 2048, assumptions=how)
                except ValueError:  # v not dividing a stage, or fewer micro-batches than stages
                    continue
                best = min(best, row["step_s"]) if row["fits"] else best
    return batch * 2048 * m.flops_per_token("full")[1] / best / gpus / (tflops * 1e12) - 1


def _residual(row: tuple, matmul_model: str) -> float:
    n, a, h, L, tp, pp, gpus, batch, tflops = row
    m = ModelSpec(f"GPT-{n}B", L, h, a, a, 4 * h, 51200, 2048, dropout=True, **_GPT)
    how = P.DEFAULT_ASSUMPTIONS.replace(matmul_model=matmul_model)
    only = {"tp": [tp], "pp": [pp], "recompute": ["full"], "zero": [0, 1]}
    res = P.plan(m, P.cluster(A100, gpus=gpus), global_batch_tokens=batch * 2048,
                 assumptions=how, only=only)  # fmt: skip
    predicted = batch * 2048 * m.flops_per_token("full")[1] / res.iloc[0].step_s / gpus
    return predicted / (tflops * 1e12) - 1


def test_table_1_flat_and_by_shape():
    assert all(round(ModelSpec("x", r[3], r[2], r[1], r[1], 4 * r[2], 51200, 2048, **_GPT).n_params / 1e9, 1)
               == pytest.approx(r[0], abs=0.15) for r in TABLE_1)  # fmt: skip
    flat = [_residual(r, "flat") for r in TABLE_1]
    shaped = [_residual(r, "by shape") for r in TABLE_1]
    # flat: the smallest two 30-37 % optimistic (one 60 % for every product)
    assert flat[0] > 0.3 and flat[1] > 0.25
    # by shape: they come to +15-16 %, every row optimistic by at most 30 %
    assert shaped[0] < 0.2 and shaped[1] < 0.2 and max(map(abs, shaped)) < 0.3


def test_table_1_as_run():
    as_run = [_as_run(r) for r in TABLE_1]
    # the 1.7B-18.4B rows inside +/-15 % (+14.9, +12.9, +14.8, +12.0 %), every row inside
    # +/-20 %, all optimistic: the +15 % every row shares is the A100 GEMM ceiling, assumed
    assert max(map(abs, as_run[:4])) < 0.15 and max(map(abs, as_run)) < 0.2, as_run
    assert min(as_run) > 0, as_run
    assert as_run[0] > 0.145 and as_run[2] > 0.145, as_run  # by a hair: the margin is stated
    # the term that moved the 7.5B (TP 4) and 18.4B (TP 8) rows inside: the TP all-reduces (6
    # per layer with full recomputation, none hidden) on NVLink at 0.8 of its line rate, what
    # NCCL reaches (plan.NVLINK_NCCL_FRACTION). At the data sheet's 300 GB/s per direction they
    # were +17 % and +16 %; at NCCL's 370-of-450 reading (0.82) the 7.5B row is +15.1 %
    nvlink = P.cluster(A100).intra_GBps
    assert nvlink == pytest.approx(240.0) and P.NVLINK_NCCL_FRACTION == 0.8
    line_rate = [_as_run(r, 300.0) for r in TABLE_1[2:4]]
    assert 0.17 < line_rate[0] < 0.18 and 0.155 < line_rate[1] < 0.165, line_rate
    assert _as_run(TABLE_1[2], 300.0 * 370 / 450) > 0.15
    # the TP 1 row hardly moves with NVLink's rate (by 0.01 point): it sends only its
    # data-parallel gradients, whose NVLink level is a small part of a two-level all-reduce
    assert abs(_as_run(TABLE_1[0], 300.0) - as_run[0]) < 0.001
