"""parallel.context on inputs it cannot take (issue 47): ring, all-gather K/V and Ulysses
refuse zero heads, tokens or head_dim, a wrong ndim, heads Ulysses cannot split and an odd
zigzag shard with one clear message on every rank before any collective (the ranks stay in
step: a normal call follows); an empty batch gives an empty output and gradients. The
context-parallel GPT refuses a batch that is not this rank's shard, and its attention a
hidden state of the wrong shape, before any collective."""

from __future__ import annotations

import torch

import course_lib
from course_lib.parallel import context as C


def _qkv(b=2, h=4, n=4, d=8, hk=None):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, n, d, generator=g)
    k, v = (torch.randn(b, h if hk is None else hk, n, d, generator=g) for _ in range(2))
    return q, k, v


#: name -> (q, k, v, layout, the start of the message)
BAD = {
    "no tokens": (*_qkv(n=0), "contiguous", "q.shape[2] = 0: expected local_seq"),
    "no head_dim": (*_qkv(d=0), "contiguous", "q.shape[3] = 0: expected head_dim >= 1"),
    "no heads": (*_qkv(h=0, hk=0), "contiguous", "q.shape[1] = 0: expected heads >= 1"),
    "no kv heads": (*_qkv(hk=0), "contiguous", "k.shape[1] = 0: expected heads >= 1"),
    "3-D": (*(t[0] for t in _qkv()), "contiguous", "q = tensor("),
    "odd zigzag shard": (*_qkv(n=3), "zigzag", "q.shape[2] = 3: expected an even local"),
    "3 heads": (*_qkv(h=3, hk=3), "contiguous", "q.shape[1] = 3: expected a multiple of the"),
}


def _worker(rank, world_size):
    from course_lib.measure.comm import CommMeter
    from course_lib.models import GPT, GPTConfig

    out: dict = {}
    for method in C.METHODS:
        for name, (q, k, v, layout, _) in BAD.items():
            if name == "3 heads" and method != "ulysses":
                continue
            if name == "odd zigzag shard" and method == "ulysses":
                continue
            with CommMeter(dispatch=False) as meter:
                try:
                    C.context_attention(q, k, v, method=method, layout=layout)
                    out[method, name] = ("no error", meter.calls)
                except (TypeError, ValueError) as e:
                    out[method, name] = (str(e), meter.calls)
        leaves = [t.requires_grad_() for t in _qkv(b=0)]  # an empty batch: empty results
        y = C.context_attention(*leaves, method=method, layout="contiguous")
        y.sum().backward()
        out[method, "empty batch"] = [tuple(t.shape) for t in (y, *(t.grad for t in leaves))]
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    model = C.parallelize_context(GPT(cfg), method="ring", layout="zigzag")
    for name, call in {
        "full sequence": lambda: model(torch.zeros(1, 8, dtype=torch.long)),
        "short shard": lambda: model(torch.zeros(1, 2, dtype=torch.long)),
        "attention 2-D": lambda: model.blocks[0].attn(torch.zeros(4, 8)),
        "attention width": lambda: model.blocks[0].attn(torch.zeros(1, 4, 6)),
    }.items():
        with CommMeter(dispatch=False) as meter:
            try:
                call()
                out["gpt", name] = ("no error", meter.calls)
            except ValueError as e:
                out["gpt", name] = (str(e), meter.calls)
    out["gpt", "shard"] = tuple(model(torch.zeros(1, 4, dtype=torch.long)).shape)  # in step
    return out


def test_bad_input_refused_before_any_collective():
    results = course_lib.launch(_worker, 2, timeout=60)
    assert results[0] == results[1]
    res = results[0]
    for (method, name), got in res.items():
        if method == "gpt" or name == "empty batch":
            continue
        msg, calls = got
        assert msg.startswith(BAD[name][4]) and calls == {}, (method, name, msg, calls)
    for method in C.METHODS:
        assert res[method, "empty batch"] == [(0, 4, 4, 8)] * 4
    full, short, flat, width = (res["gpt", n] for n in
                                ("full sequence", "short shard", "attention 2-D",
                                 "attention width"))  # fmt: skip
    assert full == (
        "idx.shape = (1, 8): expected (batch, 4), this rank's shard of the block_size = 8 "
        "token sequence (shard_sequence(idx, ..., dim=1, layout='zigzag'))",
        {},
    )
    assert short[0].startswith("idx.shape = (1, 2): expected (batch, 4)") and short[1] == {}
    assert flat == ("x.shape = (4, 8): expected (batch, local_seq, 8), this rank's tokens of "
                    "width n_embd = 8", {})  # fmt: skip
    assert width[0].startswith("x.shape = (1, 4, 6): expected (batch, local_seq, 8)")
    assert res["gpt", "shard"] == (1, 4, 16)
