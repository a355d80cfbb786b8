"""parallel.context: ring attention, all-gather K/V and Ulysses against
F.scaled_dot_product_attention on the full sequence (forward and the gradients of q, k, v),
contiguous and zigzag, causal and not, world sizes 1-4; bytes sent equal to
estimate.cp_comm_bytes_per_layer; the GPT trains as one process; bad input refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import course_lib
from course_lib.measure import estimate
from course_lib.measure.comm import collective_family
from course_lib.parallel import context as C

B, H, HKV, S, D = 2, 4, 2, 16, 8
#: float32 parity: blockwise softmax sums in another order than one kernel does
TOL = dict(rtol=1e-5, atol=1e-5)


def _cases(world_size, hkv):
    """Every method, layout and mask; Ulysses contiguous only, where the heads divide."""
    return [
        (m, lay, causal)
        for m in C.METHODS
        for lay in C.LAYOUTS
        for causal in (True, False)
        if m != "ulysses" or (lay == "contiguous" and H % world_size == 0 == hkv % world_size)
    ]


def _full(hkv=HKV, s=S):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, s, D, generator=g)
    k, v = (torch.randn(B, hkv, s, D, generator=g) for _ in range(2))
    return q, k, v, torch.randn(B, H, s, D, generator=g)


def _worker(rank, world_size, hkv, s):
    from course_lib.measure.comm import CommMeter

    q, k, v, dout = _full(hkv, s)
    out = {}
    for method, layout, causal in _cases(world_size, hkv):
        shard = [
            C.shard_sequence(t, rank=rank, world_size=world_size, dim=2, layout=layout)
            .clone()
            .requires_grad_()
            for t in (q, k, v)
        ]
        with CommMeter(dispatch=False) as fwd:
            y = C.context_attention(
                *shard, method=method, layout=layout, causal=causal, check_shapes=False
            )
        with CommMeter(dispatch=False) as bwd:
            y.backward(
                C.shard_sequence(dout, rank=rank, world_size=world_size, dim=2, layout=layout)
            )
        out[method, layout, causal] = {
            "tensors": [y.detach(), *(t.grad for t in shard)],
            "calls": (fwd.calls, bwd.calls),
            "sent": (fwd.model_bytes_sent, bwd.model_bytes_sent),
            "wire": (fwd.wire_bytes_sent, bwd.wire_bytes_sent),
        }
    return out


def _check_world(world_size, hkv=HKV, s=S):
    q, k, v, dout = _full(hkv, s)
    results = course_lib.launch(_worker, world_size, hkv, s)
    assert len(results[0]) == len(_cases(world_size, hkv)) >= 8
    for method, layout, causal in _cases(world_size, hkv):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=hkv != H)
        ref.backward(dout)
        want = [ref.detach(), *(t.grad for t in leaves)]
        for i, name in enumerate(("out", "dq", "dk", "dv")):
            got = C.unshard_sequence(
                [res[method, layout, causal]["tensors"][i] for res in results],
                dim=2,
                layout=layout,
            )
            torch.testing.assert_close(
                got, want[i], **TOL, msg=f"{method} {layout} {causal} {name}"
            )
        pred = estimate.cp_comm_bytes_per_layer(
            s, B, H * D, H, world_size, kv_heads=hkv, method=method, dtype_bytes=4
        )
        for res in results:
            r = res[method, layout, causal]
            assert r["sent"] == (pred["sent_forward"], pred["sent_backward"]), (method, layout)
            assert r["calls"] == (pred["calls"]["forward"], pred["calls"]["backward"]) or (
                {collective_family(op): n for op, n in r["calls"][0].items()},
                {collective_family(op): n for op, n in r["calls"][1].items()},
            ) == (pred["calls"]["forward"], pred["calls"]["backward"]), (method, r["calls"])
    return results


@pytest.mark.parametrize("world_size", [1, 2])
def test_parity_and_bytes(world_size):
    _check_world(world_size)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [3, 4])
def test_parity_and_bytes_more_ranks(world_size):
    # 3 ranks: 24 tokens (6 zig-zag chunks), and Ulysses cannot split 4 heads (not run)
    _check_world(world_size, s=24 if world_size == 3 else S)


def test_single_process_parity_and_layouts():
    """Outside a process group the three methods are ordinary attention (one rank)."""
    q, k, v, _ = _full()
    for causal in (True, False):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        for m in C.METHODS:
            got = C.context_attention(q, k, v, method=m, causal=causal, layout="contiguous")
            torch.testing.assert_close(got, ref, **TOL)
    x = torch.arange(16)
    shards = [C.shard_sequence(x, rank=r, world_size=4, dim=0, layout="zigzag") for r in range(4)]
    assert shards[0].tolist() == [0, 1, 14, 15] and shards[3].tolist() == [6, 7, 8, 9]
    assert torch.equal(C.unshard_sequence(shards, dim=0, layout="zigzag"), x)


def test_merge_is_exact():
    """Attention over two halves of the keys, merged by log-sum-exp, equals attention over all."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 7, 4, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse = C.merge_attention(*C.attention_block(q, k, v), *C.attention_block(q, k2, v2))
    ref = F.scaled_dot_product_attention(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2))
    torch.testing.assert_close(out, ref)


def test_bad_input_refused():
    q, k, v, _ = _full()
    with pytest.raises(ValueError, match="seq = 12: expected a multiple of 8"):
        C.shard_sequence(torch.zeros(12), rank=0, world_size=4, dim=0, layout="zigzag")
    with pytest.raises(ValueError, match="layout = 'striped'"):
        C.ring_attention(q, k, v, layout="striped")
    with pytest.raises(ValueError, match=r"q.shape\[2\] = 15: expected an even local sequence"):
        C.ring_attention(q[:, :, :15], k[:, :, :15], v[:, :, :15])
    with pytest.raises(ValueError, match=r"k.shape\[1\] = 3: expected a divisor of q's heads"):
        C.ring_attention(q, q[:, :3], q[:, :3])
    with pytest.raises(ValueError, match="expected 'contiguous' for Ulysses"):
        C.context_attention(q, k, v, method="ulysses", layout="zigzag")
    with pytest.raises(ValueError, match="method = 'tree'"):
        C.context_attention(q, k, v, method="tree")
    with pytest.raises(ValueError, match="cp = 4: expected a divisor of the heads"):
        estimate.cp_comm_bytes_per_layer(64, 1, 32, 4, 4, kv_heads=2, method="ulysses")


def _bad_worker(rank, world_size):
    q, k, v, _ = _full()
    errors = []
    n = 4 if rank == 0 else 8  # rank 0 passes a shorter shard: every rank must refuse
    for method in ("ring", "allgather"):
        try:
            C.context_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], method=method)
        except ValueError as e:
            errors.append(str(e))
    try:  # 4 heads, 2 key/value heads over 4 ranks: Ulysses refuses before any traffic
        C.ulysses_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4])
    except ValueError as e:
        errors.append(str(e))
    return errors


@pytest.mark.slow
def test_bad_input_refused_on_every_rank():
    for errors in course_lib.launch(_bad_worker, 4):
        assert len(errors) == 3
        assert errors[0].startswith("q, k, v shapes on rank 1 = (2, 4, 8, 8, 2, 2, 8, 8)")
        assert "k.shape[1] = 2: expected a multiple of the ranks, 4" in errors[2]
