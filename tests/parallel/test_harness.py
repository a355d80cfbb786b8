"""course_lib.parallel.harness: parity of a parallel run with one process, and what it catches.

The wrappers under test are written here, small on purpose (the real ones belong to units 09-12):
a data-parallel wrapper that all-reduces and averages gradients after backward, two broken
variants of it, torch's own DistributedDataParallel, on 2 ranks a two-stage pipeline and
torch's tensor parallelism (``parallelize_module``), and on 4 ranks a dp 2 × tp 2 Mesh (tensor
parallel pairs whose gradient shards are averaged over the DP group). Each world size is launched
once; the rank function trains every case and returns the records; the comparisons happen here.
"""

from __future__ import annotations

import functools
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import course_lib
from course_lib.data import random_token_batches, regression_task
from course_lib.models import GPT, MLP, GPTConfig, MLPConfig
from course_lib.parallel import harness as H
from course_lib.parallel.mesh import Mesh

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.timeout(120)

STEPS = 3
ROWS = 16  # full batch: 16, 8 or 4 rows per rank on 1, 2 or 4 ranks
OPTIMIZERS = {
    "sgd": H.make_optimizer_fn("sgd", lr=0.1),
    "adamw": H.make_optimizer_fn("adamw", lr=1e-2, weight_decay=0.1),
}
DP_CASES = [(w, o) for w in ("manual", "torch ddp") for o in OPTIMIZERS]
BUGS = ("sum", "drop on rank 1")


def model_fn(seed):
    torch.manual_seed(seed)
    return MLP(MLPConfig(in_features=8, hidden=(16, 16), out_features=2, activation="tanh"))


def batch_fn(step):
    return regression_task(ROWS, 8, 2, seed=100 + step)


def gpt_fn(seed):
    # float64: with AdamW, float32 rounding noise in the near-zero gradient of the attention's
    # key bias becomes parameter steps above the tolerance (see the harness docstring)
    torch.manual_seed(seed)
    return GPT(GPTConfig.tiny(n_layer=1, block_size=16)).double()


def token_batch_fn(step):
    return random_token_batches(65, 4, 16, seed=step)  # (4, 16) tokens and next tokens


# ---- the wrappers ----------------------------------------------------------------------------
class ManualDDP(nn.Module):
    """Data parallelism by hand: after backward, average every gradient over the ranks."""

    def __init__(self, module, bug=None):
        super().__init__()
        self.module, self.bug = module, bug

    def forward(self, x):
        return self.module(x)

    def sync_grads(self):
        for p in self.module.parameters():
            if self.bug == "drop on rank 1" and dist.get_rank() == 1:
                dist.all_reduce(p.grad.clone())  # takes part, then keeps its local gradient
                continue
            dist.all_reduce(p.grad)  # sum over ranks
            if self.bug != "sum":
                p.grad /= dist.get_world_size()


def manual_step(model, batch):
    loss = H.mse_loss(model, batch)
    loss.backward()
    model.sync_grads()
    return loss


class Stage(nn.Module):
    """Stage `rank` of a two-stage pipeline over the MLP: layers 0 | layers 1, 2 (names kept)."""

    def __init__(self, mlp, rank):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): mlp.layers[i] for i in ([0] if rank == 0 else [1, 2])})
        self.act, self.rank = mlp.act, rank


def pipeline_step(stage, batch):
    x, y = batch
    if stage.rank == 0:
        h = stage.act(stage.layers["0"](x))  # (B, 16)
        dist.send(h.detach(), 1)
        grad_h = torch.empty_like(h)
        dist.recv(grad_h, 1)
        h.backward(grad_h)
        return None  # the loss lives on the last stage
    h = torch.empty(x.shape[0], 16)
    dist.recv(h, 0)
    h.requires_grad_()
    loss = F.mse_loss(stage.layers["2"](stage.act(stage.layers["1"](h))), y)
    loss.backward()
    dist.send(h.grad, 0)
    return loss


def pipeline_gather(stage, which):
    return H.merge_across(H.full_tensors(stage, which))


def tp_dp_step(model, batch, mesh):
    """2-D parallelism: torch's tensor parallelism inside each TP pair, then this step averages
    every gradient shard over the DP replicas of the mesh."""
    loss = H.mse_loss(model, batch)
    loss.backward()
    for p in model.parameters():
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad  # my shard
        dist.all_reduce(local, group=mesh.group("dp"))
        local /= mesh.dp
    return loss


def tensor_parallel(model, mesh):
    import torch.distributed.tensor.parallel as tp  # heavy: imported in the ranks only

    return tp.parallelize_module(
        model, mesh["tp"], {"layers.0": tp.ColwiseParallel(), "layers.1": tp.RowwiseParallel()}
    )


# ---- one launch per world size ---------------------------------------------------------------
def _train_every_case(rank, world_size):
    from torch.nn.parallel import DistributedDataParallel

    run = functools.partial(H.parallel_run, batch_fn=batch_fn, steps=STEPS)
    out = {}
    for wrapper, opt in DP_CASES:
        if wrapper == "manual":
            out[wrapper, opt] = run(
                ManualDDP(model_fn(0)),
                optimizer_fn=OPTIMIZERS[opt],
                step_fn=manual_step,
                shard=(rank, world_size),
            )
        else:
            out[wrapper, opt] = run(
                DistributedDataParallel(model_fn(0)),
                optimizer_fn=OPTIMIZERS[opt],
                shard=(rank, world_size),
            )
    if world_size > 1:
        for bug in BUGS:
            out[bug, "sgd"] = run(
                ManualDDP(model_fn(0), bug=bug), step_fn=manual_step, shard=(rank, world_size)
            )
    if world_size == 2:
        out["pipeline", "adamw"] = run(
            Stage(model_fn(0), rank),
            optimizer_fn=OPTIMIZERS["adamw"],
            step_fn=pipeline_step,
            gather_fn=pipeline_gather,
        )
        out["tensor", "sgd"] = run(tensor_parallel(model_fn(0), Mesh(tp=2)))
        out["gpt", "adamw"] = run(
            DistributedDataParallel(gpt_fn(0)),
            batch_fn=token_batch_fn,
            optimizer_fn=OPTIMIZERS["adamw"],
            loss_fn=H.cross_entropy_loss,
            shard=(rank, world_size),
        )
    if world_size == 4:
        mesh = Mesh(dp=2, tp=2)
        out["tp x dp", "adamw"] = run(
            tensor_parallel(model_fn(0), mesh),
            optimizer_fn=OPTIMIZERS["adamw"],
            step_fn=functools.partial(tp_dp_step, mesh=mesh),
            shard=(mesh.dp_rank, mesh.dp),
        )
    return out


@functools.cache
def launched(world_size):
    return course_lib.launch(_train_every_case, world_size, timeout=90)


@functools.cache
def reference(opt):
    return H.reference_run(model_fn, batch_fn, steps=STEPS, optimizer_fn=OPTIMIZERS[opt])


def records(world_size, case):
    return [per_rank[case] for per_rank in launched(world_size)]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("wrapper, opt", DP_CASES)
def test_data_parallel_matches_one_process(world_size, wrapper, opt):
    table = H.assert_parity(reference(opt), records(world_size, (wrapper, opt)))
    # per rank: the 6 parameters at step 0, then per step a loss, 6 gradients and 6 parameters
    assert len(table) == world_size * (6 + STEPS * (1 + 6 + 6))
    assert table.ok.all() and (table.max_abs_diff <= table.tolerance).all()


@pytest.mark.parametrize("world_size", [2, 4])
def test_summed_instead_of_averaged_gradients_fail_at_the_first_gradient(world_size):
    with pytest.raises(
        AssertionError,
        match=r"^parity fails at rank 0, step 1, grad "
        r"'layers\.0\.weight': max abs diff \S+ > tolerance",
    ):
        H.assert_parity(reference("sgd"), records(world_size, ("sum", "sgd")))
    table = H.compare(reference("sgd"), records(world_size, ("sum", "sgd")))
    first = table[(table.step == 1) & (table.quantity == "grad")]
    assert not first.ok.any()  # every gradient of every rank is world_size times too large
    assert table[table.step == 0].ok.all()  # same model everywhere
    assert table[(table.step == 1) & (table.quantity == "loss")].ok.all()  # same forward


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_rank_that_drops_the_all_reduce_is_named(world_size):
    recs = records(world_size, ("drop on rank 1", "sgd"))
    with pytest.raises(
        AssertionError,
        match=r"^parity fails at rank 1, step 1, grad "
        r"'layers\.0\.weight'",
    ):
        H.assert_parity(reference("sgd"), recs)
    rank0 = H.compare(reference("sgd"), recs[0])
    assert rank0[rank0.step <= 1].ok.all()  # rank 0 still got the right average at step 1...
    assert not rank0[rank0.step == 2].ok.all()  # ...then rank 1's drifted model spoils it


def test_pipeline_stages_and_torch_tensor_parallel_fit_the_same_harness():
    H.assert_parity(reference("adamw"), records(2, ("pipeline", "adamw")))
    H.assert_parity(reference("sgd"), records(2, ("tensor", "sgd")))


def test_a_mesh_of_two_tp_pairs_trained_data_parallel_matches_one_process():
    H.assert_parity(reference("adamw"), records(4, ("tp x dp", "adamw")))


def test_a_float64_gpt_with_adamw_under_torch_ddp_matches_one_process():
    ref = H.reference_run(
        gpt_fn,
        token_batch_fn,
        steps=STEPS,
        optimizer_fn=OPTIMIZERS["adamw"],
        loss_fn=H.cross_entropy_loss,
    )
    table = H.assert_parity(ref, records(2, ("gpt", "adamw")))
    assert "lm_head.weight" not in set(table.name)  # tied to the embedding: counted once
    assert {"wte.weight", "blocks.0.attn.c_attn.weight", "ln_f.weight"} <= set(table.name)


# ---- without ranks -------------------------------------------------------------------------
def test_alone_the_parallel_run_is_the_reference_bit_for_bit():
    ref = reference("adamw")
    alone = H.parallel_run(model_fn(0), batch_fn, steps=STEPS, optimizer_fn=OPTIMIZERS["adamw"])
    table = H.assert_parity(ref, alone, rtol=0, atol=0)
    assert (table.max_abs_diff == 0).all() and len(ref.losses) == STEPS
    assert len(ref.grads) == STEPS and len(ref.params) == STEPS + 1
    assert ref.losses[-1] < ref.losses[0]  # it trains


def test_a_model_fn_that_builds_different_models_is_caught_before_training():
    other = H.parallel_run(model_fn(1), batch_fn, steps=STEPS, optimizer_fn=OPTIMIZERS["adamw"])
    with pytest.raises(AssertionError, match=r"rank 0, step 0, param 'layers\.0\.weight'"):
        H.assert_parity(reference("adamw"), other)


def test_compare_reports_missing_extra_and_misshaped_tensors():
    ref = H.reference_run(model_fn, batch_fn)
    bad = H.Record(
        losses=list(ref.losses), grads=[dict(ref.grads[0])], params=[dict(p) for p in ref.params]
    )
    del bad.grads[0]["layers.1.bias"]
    bad.grads[0]["extra"] = torch.zeros(2)
    bad.params[1]["layers.2.bias"] = torch.zeros(3)
    problems = H.compare(ref, bad).query("not ok").set_index(["quantity", "name"]).problem
    assert problems.to_dict() == {
        ("grad", "layers.1.bias"): "missing from the parallel run",
        ("grad", "extra"): "not in the reference run",
        ("param", "layers.2.bias"): "shape (3,) != reference (2,)",
    }
    longer = H.reference_run(model_fn, batch_fn, steps=2)
    with pytest.raises(AssertionError, match="2 steps run, reference ran 1"):
        H.assert_parity(ref, longer)
    nan = H.Record(losses=[float("nan")], grads=ref.grads, params=ref.params)
    with pytest.raises(AssertionError, match=r"step 1, loss: max abs diff nan > tolerance"):
        H.assert_parity(ref, nan)


def test_shard_batch_takes_equal_row_slices():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    xs, ys = H.shard_batch((x, y), 1, 3)
    assert xs.tolist() == [[4.0, 5.0], [6.0, 7.0]] and ys.tolist() == [2, 3]
    assert H.shard_batch(x, 0, 1) is not None and H.shard_batch(x, 0, 1).shape == (6, 2)
    assert isinstance(H.shard_batch([x, y], 0, 2), list)
    with pytest.raises(ValueError, match="batch rows = 6: expected a multiple of the 4 shards"):
        H.shard_batch((x, y), 0, 4)
    with pytest.raises(ValueError, match="index = 3: expected an int in 0..2"):
        H.shard_batch(x, 3, 3)
    with pytest.raises(TypeError, match="expected a tensor or a tuple of tensors"):
        H.shard_batch((x, 3), 0, 1)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (
            lambda: H.reference_run(model_fn, batch_fn, steps=0),
            ValueError,
            "steps = 0: expected an int >= 1",
        ),
        (
            lambda: H.reference_run(model_fn, batch_fn, optimizer_fn=3),
            TypeError,
            "optimizer_fn = 3: expected a callable",
        ),
        (
            lambda: H.reference_run(model_fn, batch_fn, loss_fn="mse"),
            TypeError,
            "loss_fn = 'mse': expected a callable",
        ),
        (
            lambda: H.parallel_run(model_fn(0), batch_fn, shard=(2, 2)),
            ValueError,
            "shard index = 2: expected an int in 0..1",
        ),
        (
            lambda: H.parallel_run(model_fn(0), batch_fn, shard=2),
            TypeError,
            "shard = 2: expected (index, count)",
        ),
        (lambda: H.make_optimizer_fn("lion"), ValueError, "name = 'lion': expected one of"),
        (
            lambda: H.compare(reference("sgd"), reference("sgd"), rtol=-1),
            ValueError,
            "rtol = -1: expected a number >= 0",
        ),
        (
            lambda: H.full_tensors(model_fn(0), "grads"),
            ValueError,
            "which = 'grads': expected one of param, grad",
        ),
    ],
)
def test_bad_arguments_are_refused_naming_the_values(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)
