"""Unit 16's measured runs (notebooks/16_mixture_of_experts.ipynb): mixture of experts on one
process and expert parallelism on real ranks.

Every multi-rank run goes through ``course_lib.launch`` (gloo on CPU) and uses the course's
from-scratch ``parallel.experts``; arguments are checked before any rank starts. Each
function returns a tidy DataFrame:

- :func:`params`: the tiny layer's parameters counted on the module, total and active,
  beside ``estimate.moe_param_count``;
- :func:`train` (``run_train.py``): one MoE layer trained with no balancing, Switch's
  auxiliary loss or DeepSeek-V3's bias, and with capacity factors that drop tokens;
- :func:`parity`: ``ExpertParallel`` on W ranks against the one-process ``MoE`` on each
  rank's tokens: outputs, input gradients, parameter gradients after ``sync_moe_grads``;
- :func:`wire_bytes`: bytes each rank sent for one layer, counted from the calls CommMeter saw
  and measured by the OS, beside ``estimate.ep_all_to_all_bytes`` of the routing;
- :func:`ep_dp`: expert parallelism inside data parallelism on 4 ranks (2 x 2);
- :func:`timeline`: each rank's route / dispatch / experts / combine spans, balanced and with
  one hot expert;
- :func:`scale` (``run_scale.py``): Mixtral 8x7B and DeepSeek-V3.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import experts as X
from course_lib.runtime.launch import launch
from course_lib.units.u16_mixture_of_experts.run_overlap import a2a_overlap
from course_lib.units.u16_mixture_of_experts.run_scale import MODELS, architecture_params, scale
from course_lib.units.u16_mixture_of_experts.run_train import train

__all__ = [
    "params",
    "parity",
    "wire_bytes",
    "ep_dp",
    "timeline",
    "imbalance",
    "train",
    "MODELS",
    "architecture_params",
    "scale",
    "a2a_overlap",
]

#: the layer of the runs: d_model, d_ff, n_experts, top_k, tokens per rank (tiny on purpose)
D, F, E, K, T = 16, 32, 8, 2, 32
#: (capacity_factor, router, shared_experts) of the parity and wire runs
CASES: tuple[tuple[float | None, str, int], ...] = (
    (None, "softmax", 0),
    (1.0, "softmax", 0),
    (None, "sigmoid", 1),
)


@dataclass(frozen=True)
class ParamRow:
    """:func:`params`: parameters counted on the module beside the estimate."""

    count: str
    counted: int
    predicted: int


@dataclass(frozen=True)
class ParityRow:
    """:func:`parity`: one case of :data:`CASES` on ``world_size`` ranks against one process."""

    world_size: int
    capacity_factor: float | None
    router: str
    shared: int
    dropped: int
    out_max_diff: float
    dx_max_diff: float
    grad_max_diff: float
    ok: bool


@dataclass(frozen=True)
class WireRow:
    """:func:`wire_bytes`: what one rank sent in one phase of one MoE layer."""

    ep: int
    capacity_factor: float | None
    router: str
    rank: int
    phase: str
    calls: str
    predicted: int
    sent: int
    wire: int | None
    framing: int | None


@dataclass(frozen=True)
class MeshRow:
    """:func:`ep_dp`: one rank's groups, its gradient all-reduces and its error."""

    rank: int
    ep_group: list[int]
    expert_dp_group: list[int]
    sync_calls: str
    out_max_diff: float
    grad_max_diff: float
    ok: bool


@dataclass(frozen=True)
class SpanRow:
    """:func:`timeline`: one phase of one rank's MoE forward, and the rows it handled."""

    hot: float
    rank: int
    phase: str
    start: float
    end: float
    rows: int
    repeat: int


@dataclass(frozen=True)
class ImbalanceRow:
    """:func:`imbalance`: one rank's expert rows and the median times of its layer."""

    hot: float
    rank: int
    expert_rows: int
    experts_ms: float
    layer_ms: float


def _calls(calls: dict[str, int]) -> str:
    return ", ".join(f"{n} {op}" for op, n in calls.items())


def _build(cf: float | None, router: Any, shared: int, d: int = D, f: int = F) -> X.MoE:
    torch.manual_seed(0)  # the same layer on every rank
    return X.MoE(d, f, E, K, capacity_factor=cf, router=router, shared_experts=shared)


def _tokens(world_size: int, tokens: int = T, d: int = D) -> torch.Tensor:
    return torch.randn(world_size, tokens, d, generator=torch.Generator().manual_seed(1))


def params() -> pd.DataFrame:
    """The runs' layer (top-2 of 8 experts, 16 wide, experts of 32): parameters counted on the
    module (total: all of them; active: the router and top_k experts a token uses) beside
    ``estimate.moe_param_count``. Nothing runs on ranks."""
    moe = _build(None, "softmax", 0)
    one = sum(p.numel() for p in moe.experts[0].parameters())
    router = sum(p.numel() for p in moe.router.parameters())
    counted = {"total": sum(p.numel() for p in moe.parameters()), "active": router + K * one}
    pred = estimate.moe_param_count(D, F, E, top_k=K, bias=True)
    return kit.frame([ParamRow(k, v, pred[k]) for k, v in counted.items()], ParamRow)


def _worker(rank: int, world_size: int, cases: tuple) -> dict:
    from course_lib.measure.comm import CommMeter

    out = {}
    for case in cases:
        ep = X.ExpertParallel(_build(*case))
        x = _tokens(world_size)[rank].clone().requires_grad_()
        dist.barrier()
        with CommMeter(dispatch=False) as fwd:
            y, aux = ep(x)
        with CommMeter(dispatch=False) as bwd:
            (y.square().mean() + aux).backward()
        X.sync_moe_grads(ep)
        r = ep.last_routing
        assert r is not None
        out[case] = {
            "y": y.detach(),
            "dx": x.grad,
            "grads": {n: p.grad for n, p in ep.named_parameters()},
            "first": ep.first,
            "routed": torch.bincount(r.experts[r.keep], minlength=E).tolist(),
            "dropped": int((~r.keep).sum()),
            "meters": [(m.calls, int(m.model_bytes_sent), m.wire_bytes_sent) for m in (fwd, bwd)],
        }
    return out


def _runs(world_sizes: Sequence[int], minimum: int) -> Iterator[tuple[int, list[dict]]]:
    """(W, every rank's :func:`_worker` results) per world size, all checked before any runs."""
    ws = validate.counts("world_sizes", world_sizes, minimum=minimum)
    if any(E % w for w in ws):
        raise ValueError(f"world_sizes = {list(world_sizes)}: expected divisors of {E}")
    return ((w, launch(_worker, w, CASES)) for w in ws)


def _compare(world_size: int, case: tuple, results: list[dict]) -> dict[str, Any]:
    moe, xs = _build(*case), _tokens(world_size)
    diff = {"out": 0.0, "dx": 0.0, "grads": 0.0}
    ref = dict(moe.named_parameters())
    for r in range(world_size):
        x = xs[r].clone().requires_grad_()
        y, aux = moe(x)
        ((y.square().mean() + aux) / world_size).backward()  # the mean of every rank's loss
        res = results[r][case]
        diff["out"] = max(diff["out"], float((y.detach() - res["y"]).abs().max()))
        dx = torch.zeros_like(x) if x.grad is None else x.grad
        diff["dx"] = max(diff["dx"], float((dx * world_size - res["dx"]).abs().max()))
    for r in range(world_size):
        for name, grad in results[r][case]["grads"].items():
            if name.startswith("experts."):
                _, i, rest = name.split(".", 2)
                name = f"experts.{int(i) + results[r][case]['first']}.{rest}"
            want = ref[name].grad
            want = torch.zeros_like(grad) if want is None else want
            diff["grads"] = max(diff["grads"], float((want - grad).abs().max()))
    return diff


def parity(world_sizes: Sequence[int] = (1, 2, 4)) -> pd.DataFrame:
    """``ExpertParallel`` (8 experts split over W ranks, 32 tokens per rank, top-2) against
    the one-process ``MoE`` on each rank's tokens, float32, for each of :data:`CASES`. One row
    per (world_size, case): the tokens' assignments dropped (all ranks), the largest
    |difference| of the outputs, of the input gradients and of every parameter gradient
    (after ``sync_moe_grads``, against the gradient of the mean of the ranks' losses), ok
    (all within 1e-6)."""
    rows = []
    for w, results in _runs(world_sizes, minimum=1):
        for case in CASES:
            d = _compare(w, case, results)
            dropped = sum(r[case]["dropped"] for r in results)
            diffs = (d["out"], d["dx"], d["grads"])
            rows.append(ParityRow(w, *case, dropped, *diffs, max(diffs) <= 1e-6))
    return kit.frame(rows, ParityRow)


def wire_bytes(world_sizes: Sequence[int] = (2, 4)) -> pd.DataFrame:
    """Bytes each rank sent for one MoE layer (forward, backward), float32, for each of
    :data:`CASES`. Columns: calls (what CommMeter saw), predicted
    (``estimate.ep_all_to_all_bytes`` of the routing the ranks made: which rank sent how many
    rows to which expert), sent (the payloads of the calls CommMeter saw: the chunks each
    ``all_to_all_single`` addressed to other ranks), wire (MEASURED: what the OS saw this rank
    write, gloo's message headers included), framing = wire - sent."""
    rows = []
    for w, results in _runs(world_sizes, minimum=2):
        for case in CASES:
            routed = [res[case]["routed"] for res in results]
            for rank, res in enumerate(results):
                pred = estimate.ep_all_to_all_bytes(routed, D, rank=rank, dtype_bytes=4)
                for phase, (calls, sent, wire) in zip(("forward", "backward"), res[case]["meters"]):
                    rows.append(WireRow(w, case[0], case[1], rank, phase, _calls(calls),
                                        pred[f"sent_{phase}"], sent, wire,
                                        None if wire is None else wire - sent))  # fmt: skip
    return kit.frame(rows, WireRow)


def _mesh_worker(rank: int, world_size: int, ep: int) -> dict:
    from course_lib.measure.comm import CommMeter

    dp = world_size // ep
    ep_groups = [dist.new_group(list(range(i * ep, (i + 1) * ep))) for i in range(dp)]
    edp_groups = [dist.new_group(list(range(j, world_size, ep))) for j in range(ep)]
    layer = X.ExpertParallel(_build(*CASES[0]), group=ep_groups[rank // ep])
    x = _tokens(world_size)[rank]
    y, aux = layer(x)
    (y.square().mean() + aux).backward()
    with CommMeter(dispatch=False) as meter:
        X.sync_moe_grads(layer, expert_dp_group=edp_groups[rank % ep])
    return {
        "y": y.detach(),
        "dx": None,
        "grads": {n: p.grad for n, p in layer.named_parameters()},
        "first": layer.first,
        "calls": meter.calls,
        "groups": (list(range((rank // ep) * ep, (rank // ep + 1) * ep)),
                   list(range(rank % ep, world_size, ep))),
    }  # fmt: skip


def ep_dp(world_size: int = 4, ep: int = 2) -> pd.DataFrame:
    """Expert parallelism inside data parallelism: ``world_size`` ranks in world_size / ep
    groups of ``ep`` (each group splits the 8 experts; tokens travel only inside it); each
    expert's copies are summed over the ranks that hold it (the expert-data-parallel group),
    the router over all ranks (``sync_moe_grads``). One row per rank: its two groups, the
    all-reduces it made, and the largest |difference| of its output and gradients against
    the one-process MoE (the mean of every rank's loss)."""
    w = validate.count("world_size", world_size, minimum=2, maximum=8)
    e = validate.count("ep", ep, minimum=1)
    if w % e or E % e:
        raise ValueError(f"ep = {e}: expected a divisor of world_size = {w} and of {E} experts")
    results = launch(_mesh_worker, w, e)
    wrapped = [{CASES[0]: {**r, "dx": torch.zeros(T, D)}} for r in results]
    d = _compare(w, CASES[0], wrapped)
    ok = max(d["out"], d["grads"]) <= 1e-6
    return kit.frame(
        [MeshRow(i, r["groups"][0], r["groups"][1], _calls(r["calls"]), d["out"], d["grads"], ok)
         for i, r in enumerate(results)],
        MeshRow,
    )  # fmt: skip


_TD, _TF = 128, 512  # the timeline's layer: wide enough that the experts' work shows


def _timeline_worker(
    rank: int, world_size: int, hot: float, tokens: int, repeats: int
) -> list[SpanRow]:
    rows: list[SpanRow] = []
    torch.manual_seed(0)
    moe = X.MoE(_TD, _TF, world_size * 2, 1, router="sigmoid")
    with torch.no_grad():
        moe.bias[0] = 10.0 * hot  # the sigmoid router's bias chooses: expert 0 wins often
    ep = X.ExpertParallel(moe)
    g = torch.Generator().manual_seed(rank)
    for rep in range(repeats + 1):  # the first is a warm-up
        x = torch.randn(tokens, _TD, generator=g)
        if hot > 0:  # tokens that like expert 0 (sigmoid > 1 - hot after the bias)
            x = x + hot * 4 * moe.router.weight[0].detach()
        ep.trace = []
        dist.barrier()
        t0 = time.perf_counter()  # one clock for all processes of this machine
        with torch.no_grad():
            ep(x)
        if rep:
            rows += [SpanRow(hot, r["rank"], r["phase"], r["start"] - t0, r["end"] - t0,
                             r["rows"], rep) for r in ep.trace]  # fmt: skip
    return rows


def timeline(
    world_size: int = 2, *, hot: Sequence[float] = (0.0, 1.0), tokens: int = 1024, repeats: int = 3
) -> pd.DataFrame:
    """One MoE layer's forward (128 wide, 2 experts of 512 per rank, top-1, sigmoid router) on
    ``world_size`` ranks, ``tokens`` per rank, traced: one row per hot setting, repeat, rank
    and phase (route, dispatch, experts, combine) with start and end in seconds after a
    barrier and the rows the phase handled. ``hot`` = 0: routing as it comes; 1: a bias and
    the tokens push most of every rank's tokens to expert 0, which lives on rank 0."""
    w = validate.count("world_size", world_size, minimum=2, maximum=8)
    n = validate.count("tokens", tokens, minimum=1)
    reps = validate.count("repeats", repeats, minimum=1)
    hots = [validate.number("hot", h, minimum=0.0, maximum=1.0) for h in hot]
    configs = kit.grid(hot=hots, tokens=(n,), repeats=(reps,))
    return kit.sweep(_timeline_worker, configs, SpanRow, world_size=w)


def imbalance(tl: pd.DataFrame) -> pd.DataFrame:
    """From a :func:`timeline`: per hot setting and rank, the rows its experts processed in the
    last repeat (the one ``plots.plot_timeline`` draws; each repeat routes new tokens) and the
    median seconds of its expert phase and of its whole layer (route to combine)."""
    rows = []
    for (h, rank), part in tl.groupby(["hot", "rank"]):
        exp = part[part.phase == "experts"].sort_values("repeat")
        whole = part.groupby("repeat").apply(lambda p: p.end.max() - p.start.min())
        experts_s = float((exp.end - exp.start).median())
        rows.append(ImbalanceRow(h, int(rank), int(exp.rows.iloc[-1]), 1e3 * experts_s,
                                 1e3 * float(whole.median())))  # fmt: skip
    return kit.frame(rows, ImbalanceRow)
