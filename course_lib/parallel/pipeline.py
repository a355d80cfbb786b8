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

Sends are ``isend`` (waited at the end of the step): a blocking send in both directions between
two 1F1B stages could deadlock. Every message has its own tag (kind, stage, micro-batch), so a
receive can never take a message meant for another. The loss of micro-batch i is divided by m
before backward, so the accumulated gradients are those of the full-batch mean (equal
micro-batches). What we leave out (torch.distributed.pipelining has it): splitting a model
by tracing it, stages whose input and output shapes differ, zero-bubble schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.measure.timing import EventLog

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


class Action(NamedTuple):
    """One thing a rank does: ``kind`` "F" or "B", on ``microbatch``, for (global) ``stage``."""

    kind: str
    microbatch: int
    stage: int


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


def stage_owner(stage: int, ranks: int) -> int:
    """The rank that holds ``stage``: round robin, stage k on rank k mod p (with v = 1 stage
    per rank that is rank k itself)."""
    return stage % ranks


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


class PipelineRank(nn.Module):
    """The stages one rank holds, cut from the full model ``layers`` by ``split`` (one range
    of layers per stage): stages rank, rank+p, ... (round robin). ``stages[str(k)]`` is stage
    k; :meth:`tensors` names parameters as in ``layers`` ("3.attn.c_attn.weight").
    ``owner(stage, ranks) -> rank`` places the stages and routes the messages (default
    :func:`stage_owner`)."""

    def __init__(
        self,
        layers: nn.Sequential,
        split: Sequence[range],
        rank: int,
        ranks: int,
        *,
        owner: Callable[[int, int], int] = stage_owner,
    ):
        super().__init__()
        self.split, self.rank, self.ranks, self.owner = list(split), rank, ranks, owner
        self.stage_ids = [k for k in range(len(split)) if owner(k, ranks) == rank]
        self.stages = nn.ModuleDict(
            {str(k): nn.Sequential(*[layers[i] for i in split[k]]) for k in self.stage_ids}
        )

    def tensors(self, which: str = "param") -> dict[str, torch.Tensor]:
        """This rank's parameters or gradients named as in the full model (CPU copies)."""
        which = validate.choice("which", which, ("param", "grad"))
        out = {}
        for k in self.stage_ids:
            for name, p in self.stages[str(k)].named_parameters():
                t = p if which == "param" else p.grad
                if t is not None:
                    j, rest = name.split(".", 1)
                    out[f"{self.split[k].start + int(j)}.{rest}"] = t.detach().to("cpu", copy=True)
        return out


# ---- running one step ----------------------------------------------------------------------
def _tag(kind: str, stage: int, microbatch: int, microbatches: int) -> int:
    # one tag per message: activations into stage k ("F") or gradients out of stage k ("B")
    return (2 * stage + (kind == "B")) * microbatches + microbatch


def run_schedule(
    model: PipelineRank,
    actions: Sequence[Action],
    x: torch.Tensor | None,
    y: torch.Tensor | None,
    *,
    microbatches: int,
    loss_fn: Callable,
    log: EventLog | None = None,
    message_shape: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Run this rank's ``actions`` for one batch and leave the gradients in ``.grad``.

    ``x`` (b, ...) is the batch, read by the rank of stage 0; ``y`` the targets, read by the
    rank of the last stage; both are cut into ``microbatches`` equal micro-batches. Every
    stage maps (b/m, ...) to the same shape; a rank that holds neither end passes one of them
    anyway (it gives the shape of the messages it receives). Returns the batch loss (the mean of the
    micro-batch losses) on the rank of the last stage, None elsewhere. ``log``: each F/B is
    recorded as a span (lane "compute"; meta stage, microbatch, kind) and each wait for a
    message as a span (lane "wait"), on the EventLog's shared clock. ``message_shape``: the
    shape of one received message (activation or its gradient) when it is not that of a
    micro-batch of ``x``, e.g. a first stage that embeds (b, s) token ids into (b, s, h).
    """
    m, p = microbatches, model.ranks
    last = len(model.split) - 1
    if x is None and y is None:
        raise ValueError(
            "x = None and y = None: expected the batch or the targets (they give "
            "the shape of the micro-batches this rank receives)"
        )
    xs = x.chunk(m) if x is not None else None  # m x (b/m, ...)
    ys = y.chunk(m) if y is not None else None
    ref = xs[0] if xs is not None else ys[0]
    shape, dtype = ref.shape, next(model.parameters()).dtype
    if message_shape is not None:
        shape = torch.Size(message_shape)
    saved: dict[tuple[int, int], tuple] = {}  # (stage, mb) -> (input, output or loss)
    mailbox: dict[int, torch.Tensor] = {}  # messages to a stage on this same rank
    sends, total, in_flight = [], None, {}
    model.max_in_flight = {k: 0 for k in model.stage_ids}

    def receive(kind, stage, mb, src):
        tag = _tag(kind, stage, mb, m)
        if src == model.rank:
            return mailbox.pop(tag)
        buf = torch.empty(shape, dtype=dtype)  # (b/m, ...)
        t0 = log.now_ns() if log is not None else 0
        dist.recv(buf, src=src, tag=tag)
        if log is not None:
            log.add(f"wait {kind}{mb}", t0, log.now_ns(), lane="wait", stage=stage, mb=mb)
        return buf

    def send(t, kind, stage, mb, dst):
        tag = _tag(kind, stage, mb, m)
        if dst == model.rank:
            mailbox[tag] = t
        else:
            sends.append((dist.isend(t, dst=dst, tag=tag), t))  # keep t alive until waited

    for kind, mb, k in actions:
        if str(k) not in model.stages:
            raise ValueError(
                f"rank {model.rank} was given {kind}{mb} of stage {k}, which it does "
                f"not hold (it holds stages {model.stage_ids})"
            )
        module = model.stages[str(k)]
        pending = []
        for work, t in sends:  # release the tensors already sent
            if work.is_completed():
                work.wait()
            else:
                pending.append((work, t))
        sends = pending
        if kind == "F":
            inp = xs[mb] if k == 0 else receive("F", k, mb, model.owner(k - 1, p))
            t0 = log.now_ns() if log is not None else 0
            inp = inp.detach().requires_grad_(k > 0)
            out = module(inp)  # (b/m, ...)
            if k == last:
                out = loss_fn(out, ys[mb]) / m  # the batch mean, one micro-batch at a time
                total = out.detach() if total is None else total + out.detach()
            saved[(k, mb)] = (inp, out)
            in_flight[k] = in_flight.get(k, 0) + 1
            model.max_in_flight[k] = max(model.max_in_flight[k], in_flight[k])
            if log is not None:
                log.add(f"F{mb}", t0, log.now_ns(), lane="compute", stage=k, mb=mb, kind="F")
            if k < last:
                send(out.detach(), "F", k + 1, mb, model.owner(k + 1, p))
        else:
            inp, out = saved.pop((k, mb))
            grad = None if k == last else receive("B", k, mb, model.owner(k + 1, p))
            t0 = log.now_ns() if log is not None else 0
            out.backward(grad)  # accumulates into the stage's .grad
            in_flight[k] -= 1
            if log is not None:
                log.add(f"B{mb}", t0, log.now_ns(), lane="compute", stage=k, mb=mb, kind="B")
            if k > 0:
                send(inp.grad, "B", k - 1, mb, model.owner(k - 1, p))
    for work, _ in sends:
        work.wait()
    if saved:
        raise RuntimeError(
            f"schedule left micro-batches {sorted(saved)} without a backward "
            "(stage, micro-batch): every F needs its B"
        )
    return total  # the batch loss (last stage only)


# ---- reading a timeline --------------------------------------------------------------------
def bubble_from_events(events) -> dict[int, float]:
    """Idle fraction of each rank over the step: 1 - (its F/B time) / (first start to last
    end, over all ranks). ``events``: a DataFrame with rank, lane, start, end (``merge_event_logs``)."""
    compute = events[events["lane"] == "compute"]
    span = compute["end"].max() - compute["start"].min()
    busy = (compute["end"] - compute["start"]).groupby(compute["rank"]).sum()
    return {int(r): float(1 - b / span) for r, b in busy.items()}


def replay(
    orders: Sequence[Sequence[Action]], split: Sequence[range], *, backward_cost: float = 2.0
) -> list[dict]:
    """The same actions on ideal hardware: each F costs its stage's layer count, each B
    ``backward_cost`` times that, messages are free, and an action starts when its rank is free
    and its input has arrived. ``orders[r]`` is rank r's list of actions (e.g. the order a run
    recorded). Returns spans {rank, stage, mb, kind, start, end} in cost units; raises if the
    orders deadlock."""
    n, p = len(split), len(orders)
    done: dict[tuple[str, int, int], float] = {}
    pos, free, spans = [0] * p, [0.0] * p, []
    while any(pos[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, mb, k = orders[r][pos[r]]
                dep = (
                    (("F", k - 1, mb) if k > 0 else None)
                    if kind == "F"
                    else (("B", k + 1, mb) if k < n - 1 else ("F", k, mb))
                )
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                cost = len(split[k]) * (1.0 if kind == "F" else backward_cost)
                free[r] = done[(kind, k, mb)] = start + cost
                spans.append(dict(rank=r, stage=k, mb=mb, kind=kind, start=start, end=start + cost))
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError(
                "these orders deadlock: every rank waits for a message that no "
                f"rank will send (positions {pos})"
            )
    return spans
