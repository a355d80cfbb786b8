"""ZeRO-3 with bf16 / FP8 all-gathers (course_lib.parallel.zero.fp8): refusals before any
collective. The bytes and the loss on real ranks are checked in
tests/units/u17_fp8_training/test_u17_run.py (one launch, slow lane)."""

from __future__ import annotations

import pytest
from torch import nn

from course_lib.parallel.zero.fp8 import GATHERS, LowPrecisionGatherSharded


def test_bad_options_are_refused_before_any_collective():
    with pytest.raises(ValueError, match=r"^gather = 'int8': expected one of fp32, bf16, fp8"):
        LowPrecisionGatherSharded(nn.Linear(4, 4), gather="int8")
    with pytest.raises(ValueError, match=r"^prefetch = True: expected False"):
        LowPrecisionGatherSharded(nn.Linear(4, 4), gather="fp8", prefetch=True)
    assert GATHERS == ("fp32", "bf16", "fp8")


def _gathered_weights_rank(rank, world_size):
    import torch

    from course_lib.parallel.zero.fp8 import LowPrecisionGatherSharded
    from course_lib.techniques.fp8 import to_float8

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 24, bias=False), nn.LayerNorm(24), nn.Linear(24, 8, bias=False)
    )
    full = {k: v.clone() for k, v in model.state_dict().items()}
    seen = {}
    for name in ("0", "1", "2"):
        model.get_submodule(name).register_forward_hook(
            lambda m, args, out, name=name: seen.update({name: m.weight.detach().clone()})
        )
    fsdp = LowPrecisionGatherSharded(model, gather="fp8", lr=0.0)
    fsdp(torch.randn(4, 16)).sum().backward()
    return {
        "linear 0 is its tensorwise E4M3 cast": torch.equal(
            seen["0"], to_float8(full["0.weight"]).dequantize()
        ),
        "linear 2 is its tensorwise E4M3 cast": torch.equal(
            seen["2"], to_float8(full["2.weight"]).dequantize()
        ),
        "layernorm travels in bf16": torch.equal(seen["1"], full["1.weight"].bfloat16().float()),
        "every rank has a gradient shard": all(u.shard.grad is not None for u in fsdp.units),
    }


def test_fp8_gather_gives_every_rank_the_tensorwise_cast_of_the_full_weight():
    from course_lib import launch

    for result in launch(_gathered_weights_rank, 2):
        assert all(result.values()), result
