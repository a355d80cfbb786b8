"""Synthetic tasks: deterministic per seed, the documented shapes, and learnable."""

import math

import pytest
import torch

from course_lib import data
from course_lib.models import GPT, GPTConfig


def test_regression_task_deterministic_and_learnable():
    x, y = data.regression_task(200, 5, 2, noise=0.01, seed=3)
    x2, y2 = data.regression_task(200, 5, 2, noise=0.01, seed=3)
    assert x.shape == (200, 5) and y.shape == (200, 2) and x.dtype == torch.float32
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, data.regression_task(200, 5, 2, seed=4)[0])
    # a linear model recovers the teacher: residual ~ the noise
    X = torch.cat([x, torch.ones(200, 1)], dim=1)
    sol = torch.linalg.lstsq(X, y).solution
    assert (X @ sol - y).pow(2).mean().sqrt() < 0.02


def test_token_tasks_shapes_and_targets():
    idx, tgt = data.random_token_batches(50, 4, 16, seed=1)
    assert idx.shape == tgt.shape == (4, 16) and idx.dtype == torch.int64
    assert torch.equal(idx[:, 1:], tgt[:, :-1])
    assert int(idx.max()) < 50
    batches = data.random_token_batches(50, 2, 8, seed=1, n_batches=3)
    assert len(batches) == 3 and not torch.equal(batches[0][0], batches[1][0])
    x, y = data.copy_or_sort_task(3, 6, 10, task="sort", seed=0)
    assert torch.equal(y, x.sort(dim=1).values)
    x, y = data.copy_or_sort_task(3, 6, 10, task="reverse", seed=0)
    assert torch.equal(y, x.flip(1))
    with pytest.raises(ValueError, match="task = 'shuffle': expected one of copy, reverse, sort"):
        data.copy_or_sort_task(3, 6, 10, task="shuffle")
    with pytest.raises(ValueError, match="seq = 0: expected an int >= 1"):
        data.random_token_batches(10, 2, 0)


def test_modular_addition_and_minibatches():
    x, y = data.modular_addition_task(7, seed=0)
    assert x.shape == (49, 3) and torch.equal(y, (x[:, 0] + x[:, 1]) % 7) and (x[:, 2] == 7).all()
    batches = list(data.iterate_minibatches(x, y, batch_size=10, seed=1))
    assert [len(b[0]) for b in batches] == [10, 10, 10, 10, 9]
    assert torch.equal(torch.cat([b[1] for b in batches]).sort().values, y.sort().values)
    assert len(list(data.iterate_minibatches(x, batch_size=10, drop_last=True))) == 4
    with pytest.raises(
        ValueError, match=r"tensors\[1\] = 3 rows: expected 49 rows, as tensors\[0\] has"
    ):
        next(data.iterate_minibatches(x, y[:3], batch_size=2))


@pytest.fixture
def one_thread():
    # 2 intra-op threads on a 2-core machine that is busy with other work are 10x slower
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_pattern_task_is_learned_by_the_tiny_gpt(one_thread):
    vocab, seq, period = 16, 32, 4
    idx, tgt = data.pattern_task(32, seq, vocab, period=period, seed=0)
    assert torch.equal(idx[:, period:], idx[:, :-period])  # it repeats
    floor = data.pattern_task_loss_floor(seq, vocab, period)
    assert floor == pytest.approx(3 / 32 * math.log(16))
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(vocab_size=vocab, block_size=seq))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss = model.loss(idx, tgt)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 0.9 * math.log(vocab)
    assert loss.item() < 0.5 * math.log(vocab)  # well on the way down to the floor


def test_permutation_batch_deterministic_one_successor_per_token():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = (
        data.permutation_batch(32, 4, 8, generator=g1),
        data.permutation_batch(32, 4, 8, generator=g2),
    )
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    idx, tgt = a
    assert idx.shape == tgt.shape == (4, 8) and idx.dtype == torch.int64
    assert torch.equal(idx[:, 1:], tgt[:, :-1])
    # next = perm[token] for the permutation of PERMUTATION_SEED, for every position
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(data.PERMUTATION_SEED))
    assert torch.equal(tgt, perm[idx])
    # the generator advances (a new batch), the permutation does not change; an int seed works too
    c = data.permutation_batch(32, 4, 8, generator=g1)
    assert not torch.equal(c[0], idx) and torch.equal(c[1], perm[c[0]])
    assert torch.equal(data.permutation_batch(32, 4, 8, generator=3)[0], idx)
    # a config with vocab_size gives the same batch as its vocabulary size
    cfg = GPTConfig.tiny(vocab_size=32)
    assert torch.equal(data.permutation_batch(cfg, 4, 8, generator=3)[0], idx)
    with pytest.raises(TypeError, match="generator must be a torch.Generator or an int seed"):
        data.permutation_batch(32, 4, 8, generator=None)
    with pytest.raises(ValueError, match="seq = 0: expected an int >= 1"):
        data.permutation_batch(32, 4, 0, generator=0)


def test_permutation_batch_is_learnable():
    cfg = GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(40):
        idx, tgt = data.permutation_batch(cfg, 8, 16, generator=gen)
        loss = model.loss(idx, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[0] > 0.8 * math.log(32) and losses[-1] < 0.25 * losses[0]
