"""Pipeline schedules: the split of layers into stages, each rank's order of forward and
backward actions (naive, GPipe, 1F1B, interleaved), the checks, and the stage stack."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from course_lib import validate
from course_lib.parallel.pipeline.rank import Action

__all__ = [
    "SCHEDULES",
    "split_layers",
    "naive_order",
    "gpipe_order",
    "one_f_one_b_order",
    "interleaved_order",
    "schedule_order",
    "check_pipeline",
    "make_stack",
]

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved")


# ---- the split -----------------------------------------------------------------------------
def split_layers(n_layers: int, stages: int, *, sizes: Sequence[int] | None = None) -> list[range]:
    """The layers of each stage: ``stages`` equal ranges, or ``sizes[k]`` layers for stage k
    (an explicit split must cover every layer once, each stage at least one)."""
    n_layers = validate.count("n_layers", n_layers, minimum=1)
    stages = validate.count("stages", stages, minimum=1)
    if sizes is None:
        if n_layers % stages:
            raise ValueError(
                f"n_layers = {n_layers}: expected a multiple of stages = {stages} "
                "(or an explicit split: sizes=[layers of stage 0, ...])"
            )
        sizes = [n_layers // stages] * stages
    sizes = validate.counts("sizes", sizes, minimum=1)
    if len(sizes) != stages or sum(sizes) != n_layers:
        raise ValueError(
            f"sizes = {sizes}: expected {stages} stage sizes adding up to "
            f"n_layers = {n_layers} (they add up to {sum(sizes)})"
        )
    bounds = [sum(sizes[:k]) for k in range(stages + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(stages)]


# ---- the schedules: each rank's list of actions, in order ----------------------------------
def naive_order(rank: int, ranks: int, microbatches: int) -> list[Action]:
    """F0 B0 F1 B1 ...: the data dependencies make the whole pipeline work on one micro-batch."""
    return [a for i in range(microbatches) for a in (Action("F", i, rank), Action("B", i, rank))]


def gpipe_order(rank: int, ranks: int, microbatches: int) -> list[Action]:
    """All forwards, then all backwards (in micro-batch order, as torch's ScheduleGPipe)."""
    return [Action("F", i, rank) for i in range(microbatches)] + [
        Action("B", i, rank) for i in range(microbatches)
    ]


def one_f_one_b_order(rank: int, ranks: int, microbatches: int) -> list[Action]:
    """PipeDream-Flush: p-rank-1 warm-up forwards, then one forward and one backward in turn,
    then the remaining backwards."""
    warmup = min(ranks - rank - 1, microbatches)
    order = [Action("F", i, rank) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [Action("F", warmup + i, rank), Action("B", i, rank)]
    return order + [Action("B", i, rank) for i in range(microbatches - warmup, microbatches)]


def interleaved_order(rank: int, ranks: int, microbatches: int, virtual: int) -> list[Action]:
    """Megatron's interleaved 1F1B for ``virtual`` stages per rank (stages rank, rank+p, ...).
    Forwards go in groups of p micro-batches through chunk 0, then chunk 1, ...; backwards
    the same through the chunks in reverse. Needs m a multiple of p."""
    p, v, m = ranks, virtual, microbatches
    total = m * v

    def action(kind: str, k: int) -> Action:  # the k-th forward (or backward) of this rank
        group, within = divmod(k, p * v)
        chunk = within // p
        if kind == "B":
            chunk = v - 1 - chunk
        return Action(kind, group * p + within % p, chunk * p + rank)

    warmup = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    order = [action("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [action("F", warmup + k), action("B", k)]
    return order + [action("B", k) for k in range(total - warmup, total)]


def schedule_order(
    name: str, rank: int, ranks: int, microbatches: int, virtual: int = 1
) -> list[Action]:
    """The actions of ``rank`` under schedule ``name`` (one of :data:`SCHEDULES`)."""
    name = validate.choice("schedule", name, SCHEDULES)
    if name == "interleaved":
        return interleaved_order(rank, ranks, microbatches, virtual)
    return {"naive": naive_order, "gpipe": gpipe_order, "1f1b": one_f_one_b_order}[name](
        rank, ranks, microbatches
    )


def check_pipeline(
    schedule: str,
    *,
    n_layers: int,
    ranks: int,
    microbatches: int,
    batch_rows: int,
    virtual: int = 1,
    sizes: Sequence[int] | None = None,
) -> list[range]:
    """Refuse a bad configuration before any rank starts; returns the split (one range per
    stage, v·p stages). Every error names the parameter, the value and what would work."""
    schedule = validate.choice("schedule", schedule, SCHEDULES)
    ranks = validate.count("ranks", ranks, minimum=1)
    m = validate.count("microbatches", microbatches, minimum=1)
    virtual = validate.count("virtual", virtual, minimum=1)
    rows = validate.count("batch_rows", batch_rows, minimum=1)
    if virtual > 1 and schedule != "interleaved":
        raise ValueError(
            f"virtual = {virtual}: only the interleaved schedule has several "
            f"stages per rank; expected 1 for schedule = {schedule!r}"
        )
    if rows % m:
        raise ValueError(
            f"batch_rows = {rows}: expected a multiple of microbatches = {m} "
            "(equal micro-batches keep the mean of their losses the batch loss)"
        )
    if schedule in ("1f1b", "interleaved") and m < ranks:
        raise ValueError(
            f"microbatches = {m}: expected at least ranks = {ranks} for "
            f"{schedule} (with fewer the pipeline never fills: use gpipe, or "
            f"m >= {ranks})"
        )
    if schedule == "interleaved" and m % ranks:
        raise ValueError(
            f"microbatches = {m}: expected a multiple of ranks = {ranks} for the "
            "interleaved schedule (its forwards go in groups of p micro-batches)"
        )
    return split_layers(n_layers, ranks * virtual, sizes=sizes)


# ---- the model and one rank's share of it --------------------------------------------------
def make_stack(
    n_layers: int,
    *,
    width: int = 64,
    seq: int = 16,
    heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> nn.Sequential:
    """``n_layers`` transformer blocks of the tiny GPT (course_lib.models.Block), input and
    output (b, seq, width). The GPT's embedding and head are left out: they would sit on the
    first and last stage (with tied weights their gradients are all-reduced between the two)."""
    from course_lib.models import Block, GPTConfig

    config = GPTConfig(n_layer=n_layers, n_embd=width, n_head=heads, block_size=seq)
    torch.manual_seed(seed)
    return nn.Sequential(*[Block(config) for _ in range(n_layers)]).to(dtype)
