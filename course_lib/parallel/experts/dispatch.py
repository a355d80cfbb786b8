"""Expert parallelism from scratch: experts split over ranks, tokens sent to them and back.

Each of W ranks keeps its own tokens (data parallel) and n_experts / W experts (rank r holds
experts r E/W .. (r+1) E/W - 1). One MoE layer's forward:

1. route the local tokens (``moe.route``: the same top-k, weights and capacity drops as the
   one-process layer on these tokens);
2. sort the kept assignments by expert; count them per expert (E,) and sum the counts per
   destination rank: the ``input_split_sizes``;
3. exchange the counts (``all_to_all_single`` of E int64 counts, E/W to each rank): now each
   rank knows how many rows every source sends to each of its experts;
4. dispatch: ``all_to_all_single`` of the token rows with those uneven splits;
5. run the local experts on the rows they received;
6. combine: ``all_to_all_single`` back (the splits swapped), weigh, add into the tokens.

Steps 4 and 6 are one autograd Function (:func:`all_to_all`) whose backward is the same
exchange with the splits swapped, so backward sends as many bytes as forward. gloo on CPU
runs ``all_to_all_single`` with uneven (and zero) split sizes. ``trace`` (a list) records
each phase's start and end per call, for a timeline.

Any routing, the same collectives. A rank whose experts receive no row, or that sends none
(all its tokens routed elsewhere, or no tokens at all), still runs every exchange of the step,
in the same order as its peers, in backward too: autograd runs a node's backward only if its
output was computed from something that requires a gradient, so every local expert runs, on
zero rows if need be (the combine's input always depends on the rows received and on the
experts' weights), and in grad mode each exchange's output requires a gradient even when its
input does not. (Skipping an empty expert, as the one-process layer may, left the combine of
such a rank outside the graph: its peers waited for it in the backward all-to-all.) Every wait
is bounded by a time-out (``ExpertParallel(..., timeout=)``, by default the process group's,
which ``course_lib.launch`` sets), and a failed or timed-out exchange raises an error naming
this rank and the exchange.

Gradients: the router and shared experts are replicated (every rank, like DDP); the local
experts saw the tokens of every rank of the expert group. :func:`sync_moe_grads` averages
the replicated ones over ``dense_group`` and sums the experts' over ``expert_dp_group`` (the
ranks that hold the same experts, if any), dividing both by the dense group's size.
Introduced in notebooks/16_mixture_of_experts.ipynb.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.parallel.experts.moe import MoE, Routing, check_tokens, route, shared_sum
from course_lib.parallel.tensor.comms import apply
from course_lib.runtime.groups import Group, group_info

__all__ = ["all_to_all", "dispatch_splits", "ExpertParallel", "sync_moe_grads"]


def _group_timeout(group: Group, device: torch.device) -> timedelta | None:
    """The process group's own time-out (what ``course_lib.launch`` set), None if unknown."""
    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        timeout = pg._get_backend(device).options._timeout
    except (AttributeError, RuntimeError, ValueError):
        return None
    return timeout if isinstance(timeout, timedelta) else None


def collective(
    what: str,
    op: Callable[..., Any],
    *args: Any,
    group: Group,
    timeout: float | None = None,
    **kwargs: Any,
) -> None:
    """``op(*args, group=group, async_op=True, **kwargs)`` (a ``torch.distributed``
    collective, looked up by the caller at call time so that ``CommMeter`` sees it), waited for
    at most ``timeout`` seconds (None: the process group's time-out); a failure raises a
    RuntimeError that names this rank and ``what`` was exchanged (the original error chained)."""
    device = args[0].device  # the output tensor's
    limit = _group_timeout(group, device) if timeout is None else timedelta(seconds=timeout)
    try:
        work = op(*args, group=group, async_op=True, **kwargs)
        if work is not None:
            work.wait() if limit is None else work.wait(limit)
    except RuntimeError as exc:
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        waited = "the process group's time-out" if limit is None else f"{limit.total_seconds():g} s"
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(
            f"expert parallelism: rank {rank} of {size} gave up on the {what} after at most "
            f"{waited} ({cause}). Every rank must run the same collectives in the same order; "
            "a rank that skipped or reordered one (or failed) leaves its peers waiting."
        ) from exc


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Group,
        name: str,
        timeout: float | None,
    ) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.name, ctx.timeout = (out_splits, in_splits), group, name, timeout
        out = x.new_empty((sum(out_splits), *x.shape[1:]))  # (rows received, d)
        what = f"{name} all_to_all_single (forward)"
        collective(what, dist.all_to_all_single, out, x.contiguous(), out_splits, in_splits,
                   group=group, timeout=timeout)  # fmt: skip
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits = ctx.splits
        gx = grad.new_empty((sum(in_splits), *grad.shape[1:]))  # (rows sent, d)
        what = f"{ctx.name} all_to_all_single (backward)"
        collective(what, dist.all_to_all_single, gx, grad.contiguous(), in_splits, out_splits,
                   group=ctx.group, timeout=ctx.timeout)  # fmt: skip
        return gx, None, None, None, None, None


def all_to_all(
    x: torch.Tensor,
    out_splits: list[int],
    in_splits: list[int],
    group: Group = None,
    *,
    name: str = "exchange",
    timeout: float | None = None,
) -> torch.Tensor:
    """Differentiable ``all_to_all_single``: send rows ``x`` (n, ...) split ``in_splits`` per
    rank, receive ``out_splits`` rows from each; backward swaps the splits. In grad mode the
    result always requires a gradient (an ``x`` that does not is made a leaf that does), so
    that this rank's backward exchange runs whenever its peers' does. ``name`` (e.g.
    "dispatch") is what an error says was being exchanged; each wait lasts at most
    ``timeout`` seconds (None: the process group's time-out)."""
    if len(in_splits) == 1:  # one rank: nothing to exchange
        return x
    if torch.is_grad_enabled() and not x.requires_grad:
        x = x.detach().requires_grad_()  # backward must reach the exchange on every rank
    return apply(_AllToAll, x, list(out_splits), list(in_splits), group, name, timeout)


def dispatch_splits(
    counts: torch.Tensor, recv_counts: torch.Tensor, world_size: int
) -> tuple[list[int], list[int]]:
    """From this rank's assignments per expert ``counts`` (E,) and the counts received
    (``recv_counts``, E: E/W per source rank, for this rank's experts), the
    ``input_split_sizes`` (rows to each rank) and ``output_split_sizes`` (rows from each)."""
    send = counts.view(world_size, -1).sum(1)  # (W,)
    recv = recv_counts.view(world_size, -1).sum(1)  # (W,)
    return [int(n) for n in send], [int(n) for n in recv]


class ExpertParallel(nn.Module):
    """This rank's share of ``moe`` (built identically, same seed, on every rank):
    ``forward(x) -> (y, aux_loss)`` as ``moe(x)`` gives on this rank's tokens x. ``timeout``:
    seconds each exchange may wait for the peers (None: the process group's time-out)."""

    def __init__(self, moe: MoE, *, group: Group = None, timeout: float | None = None):
        super().__init__()
        if not isinstance(moe, MoE):
            raise TypeError(f"moe = {type(moe).__name__}: expected a parallel.experts.MoE")
        self.timeout = (
            None
            if timeout is None
            else validate.number("timeout", timeout, positive=True, finite=True)
        )
        info = group_info(group, needs="expert parallelism", single=True)
        self.rank, self.world_size, self.group = info.rank, info.world_size, info.group
        if moe.n_experts % self.world_size:
            raise ValueError(
                f"n_experts = {moe.n_experts}: expected a multiple of the expert-parallel "
                f"ranks, {self.world_size} (each rank holds n_experts / ranks experts)"
            )
        self.n_experts, self.local = moe.n_experts, moe.n_experts // self.world_size
        self.first = self.rank * self.local
        self.router, self.shared = moe.router, moe.shared
        self.experts = nn.ModuleList(moe.experts[self.first : self.first + self.local])
        self.bias: torch.Tensor
        self.register_buffer("bias", moe.bias.clone())
        self.top_k, self.capacity_factor = moe.top_k, moe.capacity_factor
        self.router_kind, self.d_model = moe.router_kind, moe.d_model
        self.last_routing: Routing | None = None
        self.trace: list[dict[str, Any]] | None = None
        self.last_splits: tuple[list[int], list[int]] = ([], [])

    def check_input(self, x: Any) -> torch.Tensor:
        """Refuse, before any collective, tokens the layer cannot take (``MoE``'s messages)."""
        return check_tokens(x, self.d_model, next(self.parameters(), None))

    def route(self, x: torch.Tensor) -> Routing:
        """The routing of this rank's tokens x (T, d_model): exactly ``MoE.route``'s."""
        bias = self.bias if self.router_kind == "sigmoid" else None
        self.last_routing = route(
            self.router(x), self.top_k, router=self.router_kind, bias=bias,
            capacity_factor=self.capacity_factor,
        )  # fmt: skip
        return self.last_routing

    def _mark(self, phase: str, start: float, rows: int) -> None:
        if self.trace is not None:
            end = time.perf_counter()
            self.trace.append({"rank": self.rank, "phase": phase, "start": start, "end": end,
                               "rows": rows})  # fmt: skip

    def _exchange_counts(self, experts: torch.Tensor) -> tuple[list[int], list[int], torch.Tensor]:
        counts = torch.bincount(experts, minlength=self.n_experts)  # (E,) int64
        recv = torch.empty_like(counts)  # (E,): E/W per source, for my experts
        if self.world_size > 1:  # every rank, every step, whatever its counts
            collective("count exchange all_to_all_single (forward)", dist.all_to_all_single,
                       recv, counts, group=self.group, timeout=self.timeout)  # fmt: skip
        else:
            recv.copy_(counts)
        send_splits, recv_splits = dispatch_splits(counts, recv, self.world_size)
        return send_splits, recv_splits, recv.view(self.world_size, self.local)

    def _run_experts(self, rows: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        # rows arrive grouped by source rank, inside that by local expert
        which = torch.arange(self.local).repeat(self.world_size)  # (W * local,)
        local_id = torch.repeat_interleave(which, recv.reshape(-1))  # (rows,)
        out = torch.zeros_like(rows)
        for i, expert in enumerate(self.experts):
            # every expert runs, on 0 rows too: the output must depend on the rows and the
            # weights on every rank, or a rank's backward would skip the exchanges (module doc)
            idx = torch.nonzero(local_id == i, as_tuple=True)[0]
            out = out.index_copy(0, idx, expert(rows[idx]))  # (n, d)
        return out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = self.check_input(x).reshape(-1, self.d_model)  # (T, d)
        t0 = time.perf_counter()
        r = self.route(flat)
        tok, slot = torch.nonzero(r.keep, as_tuple=True)  # kept assignments
        dest = r.experts[tok, slot]
        order = torch.argsort(dest, stable=True)  # by expert, tokens in order
        tok, slot, dest = tok[order], slot[order], dest[order]
        send_splits, recv_splits, recv = self._exchange_counts(dest)
        self.last_splits = (send_splits, recv_splits)
        self._mark("route", t0, len(tok))
        t0 = time.perf_counter()
        rows = all_to_all(flat[tok], recv_splits, send_splits, self.group, name="dispatch",
                          timeout=self.timeout)  # fmt: skip
        self._mark("dispatch", t0, rows.shape[0])
        t0 = time.perf_counter()
        done = self._run_experts(rows, recv)  # (received, d)
        self._mark("experts", t0, rows.shape[0])
        t0 = time.perf_counter()
        back = all_to_all(done, send_splits, recv_splits, self.group, name="combine",
                          timeout=self.timeout)  # fmt: skip
        self._mark("combine", t0, back.shape[0])
        out = shared_sum(self.shared, flat).index_add(0, tok, back * r.weights[tok, slot, None])
        return out.reshape(x.shape), r.aux_loss


def sync_moe_grads(
    module: nn.Module, *, dense_group: Group = None, expert_dp_group: Group = None
) -> None:
    """Make the gradients those of the mean of every rank's loss: the replicated parameters
    (router, shared experts) all-reduced over ``dense_group`` and divided by its size; the
    local experts' summed over ``expert_dp_group`` (when given) and divided by the same."""
    n = group_info(dense_group, needs="sync_moe_grads").world_size
    experts = module.experts if isinstance(module, ExpertParallel) else nn.ModuleList()
    expert_ids = {id(p) for p in experts.parameters()}
    for name, p in module.named_parameters():
        if p.grad is None:  # an expert no token reached: its peers still reduce
            p.grad = torch.zeros_like(p)
        what = f"gradient all_reduce of {name}"
        if id(p) in expert_ids:
            if expert_dp_group is not None:
                collective(what, dist.all_reduce, p.grad, group=expert_dp_group)
        else:
            collective(what, dist.all_reduce, p.grad, group=dense_group)
        p.grad /= n
