"""ZeroDataParallel (course_lib/parallel/zero.py): parity with one process at every stage on 3
ranks (uneven shards: padding), exact model-state bytes, bytes on the wire, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.measure import estimate
from course_lib.parallel import harness as H
from course_lib.parallel.zero import ZeroDataParallel, full_tensors, shard_numel
from course_lib.runtime.launch import launch


def model_fn(seed=0):
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)  # 8 -> 12 -> 5 -> 2: units of 108, 65, 12 elements (65 % 3 != 0)
    return MLP(MLPConfig(in_features=8, hidden=(12, 5), out_features=2)).double()


def batch_fn(step):
    from course_lib.data import regression_task

    x, y = regression_task(12, 8, 2, seed=step)
    return x.double(), y.double()


CONFIGS = [
    (0, {}),
    (1, {}),
    (2, {}),
    (3, {}),
    (3, {"prefetch": True}),
    (3, {"reshard_after_forward": False}),
    (3, {"prefetch": True, "reshard_after_forward": False}),
]


def _worker(rank, world_size):
    from course_lib.measure.comm import CommMeter
    from course_lib.measure.memory import MemoryMeter

    records, state, wire = [], [], {}
    for stage, kw in CONFIGS:
        model = ZeroDataParallel(model_fn(seed=rank), stage=stage, lr=1e-2, **kw)
        records.append(
            H.parallel_run(
                model,
                batch_fn,
                steps=2,
                optimizer_fn=lambda m: m,
                gather_fn=full_tensors,
                shard=(rank, world_size),
            )
        )
        if kw:
            continue
        x, y = H.shard_batch(batch_fn(5), rank, world_size)
        with CommMeter(dispatch=False) as meter:
            H.mse_loss(model, (x, y)).backward()
            model.step()
        wire[stage] = meter.model_bytes_sent
        with MemoryMeter(model, model.optimizer) as mem:
            pass
        state.append(mem.start_breakdown)
    # why zero.py reduce-scatters with the course's ring on gloo: gloo's sends twice as much
    from course_lib.parallel.collectives import ring_reduce_scatter
    from course_lib.runtime.compat import reduce_scatter_single

    inp, out = torch.randn(world_size * 65536), torch.empty(65536)
    for name, fn in (("gloo", reduce_scatter_single), ("ring", ring_reduce_scatter)):
        fn(out, inp)  # warm-up
        with CommMeter(dispatch=False) as meter:
            fn(out, inp)
        sent = meter.wire_bytes_sent  # measured by the OS; None where it cannot see the wire
        wire[name] = None if sent is None else sent / (4 * inp.numel())
    return {"records": records, "state": state, "wire": wire}


@pytest.fixture(scope="module")
def three_ranks():
    return launch(_worker, 3)


@pytest.mark.slow
def test_every_stage_matches_one_process(three_ranks):
    # float64 AdamW, 2 steps, every rank starting from a different model (broadcast fixes it)
    ref = H.reference_run(
        model_fn,
        batch_fn,
        steps=2,
        optimizer_fn=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
    )
    for i, config in enumerate(CONFIGS):
        table = H.assert_parity(ref, [r["records"][i] for r in three_ranks])
        assert (table.max_abs_diff / table.tolerance).max() < 1e-3, config


def test_model_state_bytes_are_exact(three_ranks):
    units = [[96, 12], [60, 5], [10, 2]]
    assert estimate.zero_padding(units, 3) == 1  # 108 and 12 split evenly; 65 -> 66
    for stage, bd in enumerate(three_ranks[0]["state"]):
        want = estimate.zero_layout_bytes_per_rank(
            units, stage=stage, world_size=3, param_bytes=8, grad_bytes=8, state_bytes=16
        )
        got = {k: bd[k] for k in ("params", "grads", "optimizer")}
        assert got == {k: want[k] for k in got}, (stage, got, want)


def test_traffic_per_stage(three_ranks):
    psi, padded = 185, 186
    wire = three_ranks[0]["wire"]
    assert wire[0] == estimate.ring_allreduce_bytes_sent(8 * psi, 3)  # DDP
    for stage in (1, 2, 3):
        assert wire[stage] == estimate.zero_bytes_sent_per_step(8 * padded, 3, stage=stage)
    assert wire[3] / wire[1] == pytest.approx(1.5)
    if wire["gloo"] is not None:
        assert wire["ring"] == pytest.approx(2 / 3, rel=0.01)  # (N-1)/N of the input
        assert wire["gloo"] == pytest.approx(4 / 3, rel=0.01)  # 2(N-1)/N: an all-reduce's


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"stage = 4: expected one of 0, 1, 2, 3"):
        ZeroDataParallel(nn.Linear(2, 2), stage=4)
    with pytest.raises(TypeError, match=r"stage = True"):
        ZeroDataParallel(nn.Linear(2, 2), stage=True)
    with pytest.raises(TypeError, match=r"optimizer = .*torch.optim.Optimizer class"):
        ZeroDataParallel(nn.Linear(2, 2), stage=1, optimizer="adamw")
    with pytest.raises(ValueError, match=r"stage = 1: prefetch and reshard_after_forward"):
        ZeroDataParallel(nn.Linear(2, 2), stage=1, prefetch=True)
    with pytest.raises(TypeError, match=r"module = "):
        ZeroDataParallel("model", stage=1)
    with pytest.raises(RuntimeError, match="needs a process group"):
        ZeroDataParallel(nn.Linear(2, 2), stage=1)
    assert [shard_numel(n, 4) for n in (7, 8, 9)] == [2, 2, 3]


def test_estimates():
    grid = {
        s: [
            estimate.zero_bytes_per_rank(7e9, stage=s, world_size=n) / 1e9 for n in (1, 2, 4, 8, 16)
        ]
        for s in (1, 2, 3)
    }
    assert grid == {
        1: [112, 70, 49, 38.5, 33.25],
        2: [112, 63, 38.5, 26.25, 20.125],
        3: [112, 56, 28, 14, 7],
    }
    assert (
        estimate.zero_bytes_per_rank(7e9, stage=2, world_size=8, k=8, param_bytes=4, grad_bytes=4)
        == 28e9 + 3.5e9 + 7e9
    )
    assert estimate.zero_bytes_sent_per_step(800, 4, stage=3) == 1800
    assert estimate.zero_bytes_sent_per_step(800, 4, stage=3, reshard_after_forward=False) == 1200
    # K micro-batches: DDP (no_sync) and stage 1 send once per step, stage 2 reduce-scatters every
    # micro-batch, stage 3 gathers and scatters every micro-batch
    k4 = {
        st: estimate.zero_bytes_sent_per_step(800, 4, stage=st, micro_batches=4) for st in range(4)
    }
    assert k4 == {0: 1200, 1: 1200, 2: 3000, 3: 7200}
    assert estimate.zero_bytes_sent_per_step(800, 4, stage=2, micro_batches=1) == 1200
    assert (
        estimate.zero_bytes_sent_per_step(
            800, 4, stage=3, reshard_after_forward=False, micro_batches=2
        )
        == 2400
    )
    with pytest.raises(ValueError, match="micro_batches = 0"):
        estimate.zero_bytes_sent_per_step(800, 4, stage=2, micro_batches=0)
    with pytest.raises(ValueError, match="stage = 5: expected one of 0, 1, 2, 3"):
        estimate.zero_layout_bytes_per_rank([[3]], stage=5, world_size=2)
    with pytest.raises(TypeError, match="units = 7"):
        estimate.zero_padding(7, 2)
