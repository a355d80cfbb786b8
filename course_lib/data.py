"""Synthetic tasks generated in code: no downloads, deterministic for a given seed.

Every function takes a ``seed`` and draws from its own ``torch.Generator``, so the same call gives
the same tensors on every machine and in every rank (global RNG state is left untouched).

* ``regression_task``: noisy outputs of a random linear teacher (for the MLP).
* ``random_token_batches``: uniform random tokens and their next-token targets (memory and
  speed measurements of the GPT, where what is learned does not matter).
* ``copy_or_sort_task``: sequence-to-sequence toy tasks (copy, reverse, sort).
* ``pattern_task``: sequences that repeat a random motif; a GPT learns to predict every token
  after the first period, so the loss falls from ln(vocab) towards ``pattern_task_loss_floor``:
  a loss curve in a few seconds on a CPU.
* ``modular_addition_task``: ``a + b mod p`` as token triples (a classic small learnable task).
* ``permutation_batch``: sequences that follow a fixed random permutation of the vocabulary (a
  bigram task a tiny GPT learns in a few dozen steps; units 03 and 04 train on it).
* ``iterate_minibatches``: shuffled mini-batches of any of the above.

Introduced in notebooks/00_start_here.ipynb.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from course_lib import validate

__all__ = [
    "regression_task",
    "random_token_batches",
    "copy_or_sort_task",
    "pattern_task",
    "pattern_task_loss_floor",
    "modular_addition_task",
    "iterate_minibatches",
    "PERMUTATION_SEED",
    "permutation_batch",
]


def _gen(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed = {seed!r}: expected an int")
    return torch.Generator().manual_seed(seed)


def regression_task(
    n: int, in_features: int, out_features: int = 1, *, noise: float = 0.1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: x ~ N(0, 1) of shape (n, in_features); y = x W^T + b + noise * N(0, 1),
    shape (n, out_features), for a teacher W, b drawn from the same seed. float32."""
    n, fi, fo = (
        validate.count("n", n, minimum=1),
        validate.count("in_features", in_features, minimum=1),
        validate.count("out_features", out_features, minimum=1),
    )
    validate.number("noise", noise, minimum=0)
    g = _gen(seed)
    w = torch.randn(fo, fi, generator=g) / math.sqrt(fi)
    b = torch.randn(fo, generator=g) * 0.1
    x = torch.randn(n, fi, generator=g)
    y = x @ w.T + b + noise * torch.randn(n, fo, generator=g)  # (n, out_features)
    return x, y


def random_token_batches(
    vocab: int, batch: int, seq: int, *, seed: int = 0, n_batches: int | None = None
):
    """Uniform random token ids: ``(idx, targets)``, each (batch, seq) int64, targets = idx
    shifted by one (next token). With ``n_batches`` a list of that many such pairs."""
    vocab, batch, seq = (
        validate.count("vocab", vocab, minimum=1),
        validate.count("batch", batch, minimum=1),
        validate.count("seq", seq, minimum=1),
    )
    g = _gen(seed)

    def one():
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)  # (B, T+1)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    if n_batches is None:
        return one()
    return [one() for _ in range(validate.count("n_batches", n_batches, minimum=1))]


COPY_SORT_TASKS = ("copy", "reverse", "sort")


def copy_or_sort_task(
    n: int, seq: int, vocab: int, *, task: str = "copy", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, each (n, seq) int64: x random tokens, y = x (copy), x reversed, or x sorted."""
    n, seq, vocab = (
        validate.count("n", n, minimum=1),
        validate.count("seq", seq, minimum=1),
        validate.count("vocab", vocab, minimum=1),
    )
    validate.choice("task", task, COPY_SORT_TASKS)
    x = torch.randint(0, vocab, (n, seq), generator=_gen(seed))
    y = {
        "copy": lambda: x.clone(),
        "reverse": lambda: x.flip(1),
        "sort": lambda: x.sort(dim=1).values,
    }[task]()
    return x, y


def pattern_task(
    n: int, seq: int, vocab: int, *, period: int = 8, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token prediction on sequences that repeat a random motif of ``period`` tokens.

    Returns ``(idx, targets)``, each (n, seq) int64 (targets = the sequence shifted by one).
    The first ``period - 1`` targets of a sequence cannot be predicted; every later one can
    (copy the token ``period`` positions back), which a 2-layer attention model learns quickly.
    """
    n, seq, vocab = (
        validate.count("n", n, minimum=1),
        validate.count("seq", seq, minimum=1),
        validate.count("vocab", vocab, minimum=1),
    )
    period = validate.count("period", period, minimum=1, maximum=seq)
    motif = torch.randint(0, vocab, (n, period), generator=_gen(seed))  # (n, period)
    reps = math.ceil((seq + 1) / period)
    tokens = motif.repeat(1, reps)[:, : seq + 1]  # (n, seq + 1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def pattern_task_loss_floor(seq: int, vocab: int, period: int = 8) -> float:
    """Best achievable mean cross-entropy (nats) on ``pattern_task``: the first period - 1
    targets are uniform guesses (ln vocab each), the rest are determined (0)."""
    seq, vocab, period = (
        validate.count("seq", seq, minimum=1),
        validate.count("vocab", vocab, minimum=1),
        validate.count("period", period, minimum=1),
    )
    return (min(period - 1, seq) / seq) * math.log(vocab)


def modular_addition_task(p: int = 11, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """All p*p pairs (a, b) as tokens ``[a, b, p]`` (p is the "=" token) with target (a+b) mod p,
    shuffled with ``seed``. Returns x (p*p, 3) and y (p*p,), int64; vocabulary size p + 1."""
    p = validate.count("p", p, minimum=1)
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    a, b = a.flatten(), b.flatten()
    x = torch.stack([a, b, torch.full_like(a, p)], dim=1)  # (p*p, 3)
    y = (a + b) % p
    order = torch.randperm(p * p, generator=_gen(seed))
    return x[order], y[order]


#: seed of the fixed vocabulary permutation of :func:`permutation_batch`
PERMUTATION_SEED = 1234


def permutation_batch(
    vocab,
    batch: int,
    seq: int,
    *,
    generator: torch.Generator | int,
    device: torch.device | str = "cpu",
    perm_seed: int = PERMUTATION_SEED,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of a small learnable sequence task: each sequence starts at a random token and
    then follows a fixed random permutation of the vocabulary (``next = perm[token]``).

    ``vocab``: the vocabulary size, or a config with a ``vocab_size`` (a ``GPTConfig``).
    The permutation is drawn from ``perm_seed`` (the same for every batch, so there is one
    thing to learn), the start tokens from ``generator`` (a ``torch.Generator``, advanced by the
    call, so successive calls give new batches; or an int seed for a fresh one). A model that
    learns the permutation reaches loss 0; unlike :func:`pattern_task` it needs no induction
    head, so a tiny GPT learns it in a few dozen steps (a CPU budget).

    Returns ``(idx, targets)``, each (batch, seq) int64 on ``device`` (targets = the sequence
    shifted by one).
    """
    vocab = validate.count("vocab", getattr(vocab, "vocab_size", vocab), minimum=1)
    batch, seq = validate.count("batch", batch, minimum=1), validate.count("seq", seq, minimum=1)
    if isinstance(generator, int) and not isinstance(generator, bool):
        generator = _gen(generator)
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or an int seed, got {generator!r}")
    perm = torch.randperm(vocab, generator=_gen(perm_seed))
    tokens = torch.empty(batch, seq + 1, dtype=torch.long)  # (B, T+1)
    tokens[:, 0] = torch.randint(0, vocab, (batch,), generator=generator)
    for t in range(seq):
        tokens[:, t + 1] = perm[tokens[:, t]]
    return tokens[:, :seq].to(device), tokens[:, 1:].to(device)


def iterate_minibatches(
    *tensors: torch.Tensor,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Yield tuples of mini-batches (slices along dim 0) of tensors of the same length."""
    if not tensors:
        raise ValueError("tensors = (): expected at least one tensor")
    n = len(tensors[0])
    for i, t in enumerate(tensors):
        if len(t) != n:
            raise ValueError(f"tensors[{i}] = {len(t)} rows: expected {n} rows, as tensors[0] has")
    bs = validate.count("batch_size", batch_size, minimum=1)
    order = torch.randperm(n, generator=_gen(seed)) if shuffle else torch.arange(n)
    for start in range(0, n, bs):
        idx = order[start : start + bs]
        if drop_last and len(idx) < bs:
            return
        yield tuple(t[idx] for t in tensors)
