"""course_lib.parallel.ddp: parity with one process (harness), buckets equal torch's DDP's,
bytes on the wire, no_sync, bad input. One launch per world size, many assertions each."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from torch import nn

import course_lib
from course_lib.measure import estimate
from course_lib.measure.bucket_sweep import torch_ddp_buckets
from course_lib.measure.wire import GLOO_SOURCE
from course_lib.parallel import harness as H
from course_lib.parallel.ddp import DataParallel, assign_buckets

CAPS_MB = (0.0002, 0.001, 25.0)  # 209 B, 1,048 B: 4 and 2 buckets for a 6,800 B model; 25: 1


def model_fn(seed: int = 0) -> nn.Module:
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)
    # float64: Adam magnifies rounding noise of near-zero gradients (harness docstring)
    return MLP(MLPConfig(in_features=8, hidden=(32, 16), out_features=2)).double()


def batch_fn(step: int):
    from course_lib.data import regression_task

    x, y = regression_task(24, 8, 2, seed=step)  # 24 rows: divisible by 1, 2, 3 and 4
    return x.double(), y.double()


def _worker(rank: int, world_size: int) -> dict:
    from course_lib.measure.comm import CommMeter

    out = {}
    torch.manual_seed(100 + rank)
    # every rank builds a different model: the broadcast in DataParallel must make them equal
    ddp = DataParallel(model_fn(seed=rank), bucket_cap_mb=CAPS_MB[0])
    out["record"] = H.parallel_run(
        ddp,
        batch_fn,
        steps=3,
        shard=(rank, world_size),
        optimizer_fn=H.make_optimizer_fn("adamw", lr=1e-2),
    )
    out["buckets"] = {cap: DataParallel(model_fn(), bucket_cap_mb=cap).buckets for cap in CAPS_MB}
    example = torch.randn(2, 8, dtype=torch.float64)
    out["torch_buckets"] = {cap: torch_ddp_buckets(model_fn(), cap, example) for cap in CAPS_MB}

    # bytes of one step: one all-reduce per bucket, all launched during backward, async
    ddp = DataParallel(model_fn(), bucket_cap_mb=CAPS_MB[0])  # fresh: gradients at step 0
    x, y = H.shard_batch(batch_fn(0), rank, world_size)
    loss = nn.functional.mse_loss(ddp(x), y)
    with CommMeter(dispatch=False) as meter:
        loss.backward()
    out["step"] = {
        "calls": meter.calls,
        "model_bytes_sent": meter.model_bytes_sent,
        "wire_bytes_sent": meter.wire_bytes_sent,
        "wire_source": meter.wire_source,
        "async": [r["async"] for r in meter.records],
    }

    # no_sync: 2 micro-steps (equal halves of each shard), one all-reduce per bucket in
    # total, and the gradients of the full batch
    ddp.zero_grad()
    with CommMeter(dispatch=False) as meter:
        for k, (xm, ym) in enumerate(zip(x.chunk(2), y.chunk(2))):
            with ddp.no_sync() if k < 1 else contextlib.nullcontext():  # sync on the last
                (nn.functional.mse_loss(ddp(xm), ym) / 2).backward()
    out["accumulated"] = {"calls": meter.calls, "grads": H.full_tensors(ddp, "grad")}
    return out


def _unused_parameter_worker(rank: int, world_size: int) -> str:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    ddp = DataParallel(model, bucket_cap_mb=1e-5)
    try:
        ddp.module[0](torch.randn(2, 4)).sum().backward()  # the second layer gets no gradient
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@pytest.fixture(scope="module")
def reference():
    return H.reference_run(
        model_fn, batch_fn, steps=3, optimizer_fn=H.make_optimizer_fn("adamw", lr=1e-2)
    )


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_parity_buckets_bytes_and_no_sync(world_size, reference):
    # gloo's wire bytes are measured below; "auto" would pick NCCL for 1 rank beside a GPU
    results = course_lib.launch(_worker, world_size, backend="gloo", timeout=120)
    # parity: loss, gradients and parameters of 3 AdamW steps equal one process on the full
    # batch within the harness tolerance (rtol 1e-5 x max|ref| + atol 1e-6; float64 here)
    H.assert_parity(reference, [r["record"] for r in results])

    model = model_fn()
    psi_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # 6,800 B
    ref_grads = H.reference_run(model_fn, batch_fn, steps=1).grads[0]
    for r in results:
        for cap in CAPS_MB:
            assert r["buckets"][cap] == r["torch_buckets"][cap], cap
        expected = assign_buckets(list(model.named_parameters()), int(CAPS_MB[0] * 2**20))
        assert r["buckets"][CAPS_MB[0]] == expected and len(expected) == 4
        n_buckets = len(r["buckets"][CAPS_MB[0]])
        assert r["step"]["calls"] == {"all_reduce": n_buckets}
        assert all(r["step"]["async"])
        model_bytes = estimate.ring_allreduce_bytes_sent(psi_bytes, world_size)
        assert r["step"]["model_bytes_sent"] == model_bytes
        if sys.platform == "linux":
            assert r["step"]["wire_source"] == GLOO_SOURCE
        if world_size in (2, 4) and r["step"]["wire_source"] == GLOO_SOURCE:
            # measured by the OS: the ring's 2(N-1)/N Psi plus gloo's message headers, which
            # measure 576 (N-1) B per all-reduce here; allow up to 1 KiB (N-1) per call
            residual = r["step"]["wire_bytes_sent"] - model_bytes
            assert 0 < residual <= n_buckets * 1024 * (world_size - 1), residual
        assert r["accumulated"]["calls"] == {"all_reduce": n_buckets}  # once per K micro-steps
        for name, g in ref_grads.items():
            torch.testing.assert_close(r["accumulated"]["grads"][name], g, rtol=1e-5, atol=1e-6)
    if world_size == 1:
        assert [len(results[0]["torch_buckets"][c]) for c in CAPS_MB] == [4, 2, 1]
        message = course_lib.launch(_unused_parameter_worker, 1)[0]
        assert "got no gradient" in message and "1.weight" in message


def test_assign_buckets_rule():
    params = [(f"p{i}", torch.zeros(n)) for i, n in enumerate([10, 1, 300, 5, 5])]  # fp32
    # reverse order: p4 (20 B), p3 (20 B), p2 (1,200 B), p1 (4 B), p0 (40 B)
    assert assign_buckets(params, 40) == [["p4", "p3"], ["p2"], ["p1", "p0"]]
    assert assign_buckets(params, 10**6) == [["p4", "p3", "p2", "p1", "p0"]]
    assert assign_buckets(params, 1) == [["p4"], ["p3"], ["p2"], ["p1"], ["p0"]]


def test_bad_input_is_refused():
    lin = nn.Linear(2, 2)
    for cap in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="bucket_cap_mb"):
            DataParallel(lin, bucket_cap_mb=cap)
    with pytest.raises(TypeError, match="bucket_cap_mb"):
        DataParallel(lin, bucket_cap_mb="25")
    with pytest.raises(TypeError, match="module"):
        DataParallel(lambda x: x)
    with pytest.raises(ValueError, match="no parameter"):
        DataParallel(nn.ReLU())
    with pytest.raises(ValueError, match="one"):
        DataParallel(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double()))
    with pytest.raises(TypeError, match="recorder"):
        DataParallel(lin, recorder=object())
    with pytest.raises(RuntimeError, match="course_lib.launch"):
        DataParallel(lin)  # no process group here
    with pytest.raises(ValueError, match="cap_bytes"):
        assign_buckets(list(lin.named_parameters()), 0)
