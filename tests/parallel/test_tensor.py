"""parallel.tensor: Megatron's column/row split against one process, torch's DTensor
parallelize_module, exact collective counts, and bad input refused before any rank starts."""

from __future__ import annotations

import pytest
import torch

import course_lib
from course_lib.measure.comm import collective_family
from course_lib.models import GPT, GPTConfig, LlamaConfig
from course_lib.parallel import harness as H
from course_lib.parallel import tensor as T

CFG = GPTConfig.tiny(n_layer=2, block_size=8)


def model_fn(seed=0):
    torch.manual_seed(seed)
    return GPT(CFG)


def batch_fn(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, CFG.vocab_size, (2, CFG.block_size), generator=g)
    return x, torch.roll(x, -1, 1)


def _step(model, batch):
    loss = H.cross_entropy_loss(model, batch)
    loss.backward()
    T.sync_sequence_parallel_grads(model)
    return loss


def _parity_worker(rank, world_size):
    from course_lib.measure.comm import CommMeter

    out = {}
    for sp in (False, True):
        model = T.parallelize_gpt(model_fn(), sequence_parallel=sp)
        out[sp] = H.parallel_run(model, batch_fn, steps=2, step_fn=_step, gather_fn=T.gather_full)
        with CommMeter(dispatch=False) as fwd:
            loss = H.cross_entropy_loss(model, batch_fn(0))
        with CommMeter(dispatch=False) as bwd:
            loss.backward()
        out[f"calls {sp}"] = (dict(fwd.calls), dict(bwd.calls))
    if world_size == 4:  # an uneven split is refused inside the ranks too, by name
        for make, name in (
            (lambda: T.ColumnParallelLinear(8, 6), "out_features = 6"),
            (lambda: T.RowParallelLinear(6, 8), "in_features = 6"),
        ):
            with pytest.raises(ValueError, match=f"{name}: expected a multiple of tp = 4"):
                make()
    # the two layers alone: column (gather_output) and row (input not parallel) = nn.Linear
    torch.manual_seed(1)
    full, x = torch.nn.Linear(8, 12), torch.randn(3, 8, requires_grad=True)
    ref = full(x)
    ref.pow(2).sum().backward()
    for layer in (
        T.ColumnParallelLinear.from_linear(full, gather_output=True),
        T.RowParallelLinear.from_linear(full, input_is_parallel=False),
    ):
        xl = x.detach().clone().requires_grad_(True)
        y = layer(xl)
        y.pow(2).sum().backward()
        assert torch.allclose(y, ref, atol=1e-6) and torch.allclose(xl.grad, x.grad, atol=1e-6)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_parity_with_one_process_and_exact_collective_counts(world_size):
    # tp = 1 runs in this process: parallelize_gpt outside a process group is the identity split
    records = (
        [_parity_worker(0, 1)] if world_size == 1 else course_lib.launch(_parity_worker, world_size)
    )
    reference = H.reference_run(model_fn, batch_fn, steps=2, loss_fn=H.cross_entropy_loss)
    for sp in (False, True):
        H.assert_parity(reference, [r[sp] for r in records])  # rtol 1e-5, atol 1e-6, float32
    if world_size > 1:
        L = CFG.n_layer
        # Shoeybi et al.: g after attention and MLP (forward), f before them (backward)
        assert records[0]["calls False"] == ({"all_reduce": 2 * L}, {"all_reduce": 2 * L})
        fwd, bwd = records[0]["calls True"]
        # sequence parallel: +1 gather before the replicated head, +1 after the embeddings
        assert {collective_family(k): v for k, v in fwd.items()} == {
            "all_gather": 2 * L + 1,
            "reduce_scatter": 2 * L,
        }
        assert {collective_family(k): v for k, v in bwd.items()} == {
            "all_gather": 4 * L + 1,
            "reduce_scatter": 2 * L,
        }


def test_a_group_outside_a_process_group_is_refused():
    with pytest.raises(RuntimeError, match="needs a process group"):
        T.ColumnParallelLinear(8, 8, group=object())


def test_bad_splits_are_refused_with_the_valid_choices():
    with pytest.raises(
        ValueError,
        match=r"n_head = 12: expected a multiple of tp = 8; "
        r"valid tp: 1, 2, 3, 4, 6, 12",
    ):
        T.check_tp(GPTConfig.gpt2_small(), 8)
    with pytest.raises(ValueError, match=r"tp = 8: expected at most world_size = 4"):
        T.check_tp(CFG, 8, world_size=4)
    with pytest.raises(ValueError, match=r"seq = 6: expected a multiple of tp = 4"):
        T.check_tp(CFG, 4, sequence_parallel=True, seq=6)
    from course_lib.units.u11_tensor_parallelism.run import LLAMA_70B  # a ModelShape

    with pytest.raises(ValueError, match=r"kv_heads = 8: expected a multiple of tp = 16"):
        T.check_tp(LLAMA_70B, 16)  # the 64 query heads would split; the 8 key/value heads not
    with pytest.raises(ValueError, match=r"seq = 6: expected a multiple of tp = 4"):
        T.check_tp(LLAMA_70B, 4, sequence_parallel=True, seq=6)
    assert T.check_tp(LLAMA_70B, 8, sequence_parallel=True) == 8  # seq 4096
    with pytest.raises(ValueError, match="dropout = 0.1"):
        T.check_tp(GPTConfig.tiny(dropout=0.1), 2)
    assert T.check_tp(LlamaConfig.llama_7b_like(), 8) == 8
    assert T.valid_tp(12) == [1, 2, 3, 4, 6, 12]


def _dtensor_worker(rank, world_size):
    from course_lib.units.u11_tensor_parallelism import run

    return run._dtensor_worker(rank, world_size)


@pytest.mark.slow
def test_dtensor_parallelize_module_gives_the_same_loss_and_counts():
    res = course_lib.launch(_dtensor_worker, 2)[0]
    reference = H.cross_entropy_loss(
        __import__("course_lib.units.u11_tensor_parallelism.run", fromlist=["x"]).model_fn(),
        __import__("course_lib.units.u11_tensor_parallelism.run", fromlist=["x"]).batch_fn(0),
    )
    for name in ("course", "dtensor"):
        assert res["losses"][name] == pytest.approx(reference.item(), rel=1e-6)
    L = 2
    assert res["counts"]["dtensor"] == {
        "forward": {"all_reduce": 2 * L},
        "backward": {"all_reduce": 2 * L},
    }
