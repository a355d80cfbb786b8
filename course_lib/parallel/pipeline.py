"""Pipeline parallelism from scratch: the layers are cut into stages, one rank per stage, and
micro-batches flow through them with point-to-point send/recv.
Introduced in notebooks/12_pipeline_parallelism.ipynb.

A stage computes its layers on a micro-batch and *sends the activation forward* to the next
stage; in backward it receives the gradient of that activation and *sends the gradient of its
own input back*. Nothing else crosses a stage boundary: one (b, s, h) tensor each way per
micro-batch. What a schedule decides is the order in which each rank runs its forwards (F) and
backwards (B); the order decides how long ranks wait (the bubble) and how many micro-batches'
activations a stage holds at once (its memory).

* ``naive``: one micro-batch goes all the way forward and back before the next starts; only one
  rank works at a time, (p-1)/p of the time is idle.
* ``gpipe`` (Huang et al. 2019, arXiv:1811.06965): all m forwards, then all m backwards. Idle
  fraction (p-1)/(m+p-1), but every stage holds m micro-batches of activations at its peak.
* ``1f1b``, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training", arXiv:2006.09503): stage s runs p-s-1 warm-up forwards, then alternates one forward
  and one backward, then drains. Same bubble as GPipe, but stage s holds at most p-s
  micro-batches. (Often credited to Megatron-LM; Megatron 2021 added the interleaving below.)
* ``interleaved`` (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", arXiv:2104.04473, Sec. 2.2.2): the model is cut into v·p smaller stages and rank r
  holds stages r, r+p, r+2p, ... (round robin), run in a 1F1B order. Each F/B is v times
  shorter, so the fill and drain shrink to (p-1)/(v·m) of the ideal time, at the price of v times
  more messages.

What one rank holds and does: ``pipeline_rank.py`` (:class:`PipelineRank`, :class:`Action`,
:func:`stage_owner`); running a step: ``pipeline_run.py`` (:func:`run_schedule`); recording
and reading its timeline: ``pipeline_trace.py`` (:func:`bubble_from_events`, :func:`replay`). Weight versions of a pipeline
that never flushes (PipeDream-2BW): ``pipeline_2bw.py``. What we leave out (torch.distributed.pipelining has it): splitting a model
by tracing it, stages whose input and output shapes differ, zero-bubble schedules.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from course_lib import validate
from course_lib.parallel.pipeline_rank import Action, PipelineRank, stage_owner
from course_lib.parallel.pipeline_run import run_schedule
from course_lib.parallel.pipeline_trace import bubble_from_events, replay

__all__ = [
    "SCHEDULES",
    "Action",
    "split_layers",
    "stage_owner",
    "naive_order",
    "gpipe_order",
    "one_f_one_b_order",
    "interleaved_order",
    "schedule_order",
    "check_pipeline",
    "make_stack",
    "PipelineRank",
    "run_schedule",
    "bubble_from_events",
    "replay",
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
