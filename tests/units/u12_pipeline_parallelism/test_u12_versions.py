"""PipeDream-2BW's weight versions: the update is one-step-delayed SGD to the bit, a flushed
pipeline is plain SGD, the versions kept are counted from the tensors, and 2BW still converges."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.parallel.pipeline import split_layers
from course_lib.parallel.pipeline.two_bw import run_versions
from course_lib.units.u12_pipeline_parallelism import run as R
from course_lib.units.u12_pipeline_parallelism.run_versions import versions_batches, versions_model

LR, M = 0.05, 4


def _plain_sgd(batches, *, delayed: bool) -> dict[str, torch.Tensor]:
    """The whole model on one process. Each step's gradient is the sum over the M micro-batches
    of grad(loss / M), taken at W(t-1) (delayed) or W(t); then W(t+1) = W(t) - LR * gradient."""
    model = versions_model()
    w_now = {n: p.detach().clone() for n, p in model.named_parameters()}
    w_before = w_now  # W(-1) = W(0)
    for x, y in batches:
        at = w_before if delayed else w_now
        leaves = {n: t.clone().requires_grad_() for n, t in at.items()}
        grad = {}
        for xm, ym in zip(x.chunk(M), y.chunk(M)):
            out = torch.func.functional_call(model, leaves, (xm,))
            loss = nn.functional.mse_loss(out, ym) / M
            for n, g in zip(leaves, torch.autograd.grad(loss, list(leaves.values()))):
                grad[n] = g if n not in grad else grad[n] + g
        w_before, w_now = w_now, {n: w_now[n] - LR * grad[n] for n in w_now}
    return w_now


def _by_full_name(split, weights) -> dict[str, torch.Tensor]:
    out = {}
    for r, w in zip(split, weights):
        for name, t in w.items():
            j, rest = name.split(".", 1)
            out[f"{r.start + int(j)}.{rest}"] = t
    return out


@pytest.mark.parametrize("policy, delayed", [("2bw", True), ("flush", False)])
def test_update_is_the_plain_formula_to_the_bit(policy, delayed):
    batches = versions_batches(6, 16)
    split = split_layers(8, 4)
    run = run_versions(versions_model(), split, batches, microbatches=M, policy=policy, lr=LR)
    got = _by_full_name(split, run.weights)
    want = _plain_sgd(batches, delayed=delayed)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[n], want[n]) for n in want)
    other = _plain_sgd(batches, delayed=not delayed)  # the other formula is measurably different
    assert max(float((got[n] - other[n]).abs().max()) for n in want) > 1e-6


def test_versions_kept_and_convergence():
    mem, losses = R.weight_versions(stages=4, microbatches=M, steps=40, lr=LR)
    by = mem.set_index(["policy", "stage"])
    for s in range(4):
        one = by.one_version_bytes["GPipe / 1F1B (flush)", s]
        assert by.loc[("GPipe / 1F1B (flush)", s), ["versions", "bytes"]].tolist() == [1, one]
        assert by.loc[("PipeDream-2BW", s), ["versions", "bytes"]].tolist() == [2, 2 * one]
        assert by.loc[("PipeDream (per micro-batch)", s), ["versions", "bytes"]].tolist() == [
            4 - s,
            (4 - s) * one,
        ]  # one version per micro-batch in flight on stage s: p - s
    assert (mem.lag == 0).all()  # every backward used its forward's version
    assert by.steps_behind["PipeDream-2BW", 0] == [0, 1]  # W(t-1) for step t (W(0) twice)
    assert by.steps_behind["GPipe / 1F1B (flush)", 0] == [0]
    first, last = losses.iloc[:5].mean(), losses.iloc[-10:].mean()
    assert (last < first / 10).all(), (first, last)  # every policy converges
    assert last["PipeDream-2BW"] < 1.5 * last["GPipe / 1F1B (flush)"]


def test_bad_input():
    split, batches = split_layers(8, 4), versions_batches(2, 16)
    with pytest.raises(ValueError, match="microbatches = 2: expected at least 4"):
        run_versions(versions_model(), split, batches, microbatches=2, policy="2bw")
    with pytest.raises(ValueError, match="policy = 'async'"):
        run_versions(versions_model(), split, batches, microbatches=4, policy="async")
    with pytest.raises(ValueError, match="microbatches = 3"):
        run_versions(versions_model(), split, batches, microbatches=3, policy="flush")
