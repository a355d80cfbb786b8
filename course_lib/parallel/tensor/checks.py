"""Tensor parallelism's argument checks: refuse a split before any rank starts."""

from __future__ import annotations

from typing import Any

from course_lib import validate
from course_lib.shape import ModelShape

__all__ = ["valid_tp", "check_tp", "check_split"]


def valid_tp(n: int) -> list[int]:
    """The tensor-parallel sizes that divide ``n`` (heads, hidden width) evenly."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_split(name: str, n: int, tp: int) -> None:
    """Refuse ``n`` (``name``) that ``tp`` ranks cannot share evenly, naming the valid tp."""
    validate.divisible(name, n, "tp", tp, note=f"valid tp: {', '.join(map(str, valid_tp(n)))}")


def _check_world(tp: int, world_size: int) -> None:
    world_size = validate.count("world_size", world_size, minimum=1)
    if tp > world_size:
        raise ValueError(
            f"tp = {tp}: expected at most world_size = {world_size} "
            "(a tensor-parallel group is made of ranks that exist)"
        )
    validate.divisible(
        "world_size",
        world_size,
        "tp",
        tp,
        note=f"valid tp: {', '.join(map(str, valid_tp(world_size)))}",
    )


def check_tp(
    config: Any,
    tp: int,
    *,
    world_size: int | None = None,
    sequence_parallel: bool = False,
    seq: int | None = None,
) -> int:
    """Refuse a split of ``config`` (a GPTConfig, a LlamaConfig or a ModelShape) over ``tp`` ranks
    before any rank starts: heads (key/value heads too), width and MLP width must divide by
    ``tp``, each named as ``config`` names it; ``tp`` may not exceed the ``world_size``; with
    sequence parallelism the sequence must divide too. Returns ``tp``."""
    tp = validate.count("tp", tp, minimum=1)
    if world_size is not None:
        _check_world(tp, world_size)
    default_seq: int | None
    if isinstance(config, ModelShape):
        sizes = [(n, getattr(config, n)) for n in ("heads", "hidden", "ffn", "kv_heads")]
        default_seq = config.seq
    else:
        ffn = getattr(config, "ffn_hidden", 4 * config.n_embd)
        sizes = [("n_head", config.n_head), ("n_embd", config.n_embd), ("ffn_hidden", ffn)]
        if hasattr(config, "n_kv_head"):  # grouped-query attention: the key/value heads split too
            sizes.append(("n_kv_head", config.n_kv_head))
        default_seq = getattr(config, "block_size", None)
    if sequence_parallel:
        sizes.append(("seq", default_seq if seq is None else seq))
    for name, n in sizes:
        check_split(name, n, tp)
    if getattr(config, "dropout", 0.0):
        raise ValueError(
            f"dropout = {config.dropout}: expected 0.0 (tensor parallelism here "
            "does not fork the dropout RNG per rank, as Megatron does)"
        )
    return tp
