"""Unit 15's measured runs (notebooks/15_context_parallelism.ipynb): context parallelism on real
ranks.

Every multi-rank run goes through ``course_lib.launch`` (gloo on CPU) and uses the course's
from-scratch ``parallel.context``; arguments are checked before any rank starts. Each
function returns a tidy DataFrame:

- :func:`layouts`: which tokens each rank holds, contiguous and zigzag, and the causal work
  ``estimate.cp_attention_work`` predicts for it;
- :func:`parity`: ring, all-gather K/V and Ulysses against ``F.scaled_dot_product_attention``
  on the full sequence, forward and the gradients of q, k, v;
- :func:`wire_bytes`: bytes each rank sent per attention layer, counted from the calls
  CommMeter saw and measured by the OS, beside ``estimate.cp_comm_bytes_per_layer``;
- :func:`timeline` / :func:`balance`: ring attention's compute and wait spans per rank and
  step, and the blocks each rank computed against ``estimate.cp_attention_work``;
- :func:`block_times` (``run_balance.py``): the time of one full and one diagonal block, and
  the compute time they predict for each rank of a causal ring;
- :func:`saved_bytes` (``run_memory.py``): what attention keeps for backward per rank against
  the sequence length, written out on one process and ring on W ranks, beside
  ``estimate.attention_saved_bytes``;
- :func:`train_parity`: the tiny GPT made context parallel trains as one process does;
- :func:`ring_overlap` (``run_overlap.py``): a ring step's K/V
  transfer against a stand-in compute of known speed on 2 ranks: where the wait vanishes;
- :func:`llama3_scale` (``run_scale.py``): Llama 3 405B at 8K and 128K tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import context as C
from course_lib.runtime.launch import launch
from course_lib.units.u15_context_parallelism.run_scale import LLAMA3_TABLE4, llama3_scale

__all__ = [
    "layouts",
    "parity",
    "wire_bytes",
    "timeline",
    "balance",
    "block_times",
    "ring_overlap",
    "train_parity",
    "saved_bytes",
    "LLAMA3_TABLE4",
    "llama3_scale",
]

#: attention inputs of the runs: (batch, heads, kv_heads, seq, head_dim), tiny on purpose
Shape = tuple[int, int, int, int, int]
SHAPE: Shape = (1, 8, 4, 64, 8)


@dataclass(frozen=True)
class LayoutRow:
    """:func:`layouts`: the tokens one rank holds in one layout, and its causal work."""

    layout: str
    rank: int
    tokens: list[int]
    causal_blocks: int
    share_of_scores: str


@dataclass(frozen=True)
class ParityRow:
    """:func:`parity`: one method and layout on ``world_size`` ranks against one process."""

    world_size: int
    method: str
    layout: str
    causal: bool
    out_max_diff: float
    dq_max_diff: float
    dk_max_diff: float
    dv_max_diff: float
    ok: bool


@dataclass(frozen=True)
class WireRow:
    """:func:`wire_bytes`: what rank 0 sent in one phase of one attention call."""

    cp: int
    method: str
    layout: str
    phase: str
    calls: str
    predicted: int
    sent: int
    wire: int | None
    framing: int | None


@dataclass(frozen=True)
class SpanRow:
    """:func:`timeline`: one compute (with the blocks it computed) or wait span of a rank."""

    layout: str
    repeat: int
    rank: int
    phase: str
    step: int
    kind: str
    blocks: int | None
    start: float
    end: float


@dataclass(frozen=True)
class BalanceRow:
    """:func:`balance`: one rank's causal blocks, counted and predicted, and its compute time."""

    layout: str
    rank: int
    blocks: int
    predicted_blocks: int
    compute_s: float
    compute_vs_busiest: float


def _cases(world_size: int, shape: Shape, causal: Sequence[bool]):
    b, h, hk, s, _ = shape
    for m in C.METHODS:
        for lay in C.LAYOUTS:
            if m == "ulysses" and (lay == "zigzag" or h % world_size or hk % world_size):
                continue  # Ulysses: contiguous only, whole heads per rank
            if s % (world_size * C.chunks_per_rank(lay)):
                continue
            for c in causal:
                yield m, lay, bool(c)


def _inputs(shape: Shape):
    b, h, hk, s, d = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, s, d, generator=g)
    k, v = (torch.randn(b, hk, s, d, generator=g) for _ in range(2))
    return q, k, v, torch.randn(b, h, s, d, generator=g)


def _attention_worker(rank: int, world_size: int, shape: Shape, causal: tuple) -> dict:
    from course_lib.measure.comm import CommMeter

    q, k, v, dout = _inputs(shape)
    out = {}
    for method, layout, c in _cases(world_size, shape, causal):
        cut = dict(rank=rank, world_size=world_size, dim=2, layout=layout)
        leaves = [C.shard_sequence(t, **cut).requires_grad_() for t in (q, k, v)]
        y = C.context_attention(*leaves, method=method, layout=layout, causal=c)  # warm-up
        y.backward(C.shard_sequence(dout, **cut))
        leaves = [C.shard_sequence(t, **cut).requires_grad_() for t in (q, k, v)]
        if dist.is_initialized():
            dist.barrier()
        with CommMeter(dispatch=False) as fwd:
            y = C.context_attention(
                *leaves, method=method, layout=layout, causal=c, check_shapes=False
            )
        with CommMeter(dispatch=False) as bwd:
            y.backward(C.shard_sequence(dout, **cut))
        out[method, layout, c] = {
            "tensors": [y.detach(), *(t.grad for t in leaves)],
            "meters": [(m.calls, m.model_bytes_sent, m.wire_bytes_sent) for m in (fwd, bwd)],
        }
    return out


def _check_shape(shape: Shape) -> Shape:
    b, h, hk, s, d = (validate.count(f"shape[{i}]", x, minimum=1) for i, x in enumerate(shape))
    if h % hk:
        raise ValueError(f"shape[2] = {hk}: expected a divisor of the heads, {h}")
    return b, h, hk, s, d


def _run(world_size: int, shape: Shape, causal: Sequence[bool]) -> list[dict]:
    w = validate.count("world_size", world_size, minimum=1, maximum=8)
    if shape[3] % w:
        raise ValueError(f"seq = {shape[3]}: expected a multiple of world_size = {w}")
    return launch(_attention_worker, w, shape, tuple(bool(c) for c in causal))


def layouts(world_size: int = 4, seq: int = 16) -> pd.DataFrame:
    """Which tokens each rank holds in each layout, and the causal blocks it computes
    (``estimate.cp_attention_work``: r + 1 blocks of (s/W)^2 contiguous, 2W + 1 of (s/2W)^2
    zigzag) with their share of the s^2 scores. Nothing runs on ranks."""
    w = validate.count("world_size", world_size, minimum=1, maximum=16)
    rows = []
    for lay in C.LAYOUTS:
        for r in range(w):
            work = estimate.cp_attention_work(w, rank=r, layout=lay)
            tokens = C.positions(seq, rank=r, world_size=w, layout=lay).tolist()
            rows.append(LayoutRow(lay, r, tokens, int(work["blocks"]), str(work["share"])))
    return kit.frame(rows, LayoutRow)


def parity(
    world_sizes: Sequence[int] = (1, 2, 4),
    *,
    shape: Shape = SHAPE,
    causal: Sequence[bool] = (True, False),
) -> pd.DataFrame:
    """Each method and layout on each world size against ``F.scaled_dot_product_attention`` on
    the full sequence in one process (float32). One row per (world_size, method, layout,
    causal): the largest |difference| of the unsharded output and of the gradients of q, k, v,
    and ok (all within 1e-5 + 1e-5 |reference|)."""
    shape = _check_shape(shape)
    q, k, v, dout = _inputs(shape)
    rows = []
    for w in validate.counts("world_sizes", world_sizes, minimum=1):
        results = _run(w, shape, causal)
        for key in results[0]:
            ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
            leaves = [ql, kl, vl]
            ref = torch.nn.functional.scaled_dot_product_attention(
                ql, kl, vl, is_causal=key[2], enable_gqa=shape[1] != shape[2]
            )
            ref.backward(dout)
            want = [ref.detach(), *(t.grad for t in leaves)]
            got = [
                C.unshard_sequence([r[key]["tensors"][i] for r in results], dim=2, layout=key[1])
                for i in range(4)
            ]
            out, dq, dk, dv = (float((a - b).abs().max()) for a, b in zip(got, want))
            ok = all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want))
            rows.append(ParityRow(w, key[0], key[1], key[2], out, dq, dk, dv, ok))
    return kit.frame(rows, ParityRow)


def wire_bytes(
    world_sizes: Sequence[int] = (2, 4), *, shape: Shape = SHAPE, causal: bool = True
) -> pd.DataFrame:
    """Bytes rank 0 sent for one attention call (forward, backward) of each method and layout,
    float32. Columns: calls (what CommMeter saw), predicted (``estimate.cp_comm_bytes_per_layer``),
    sent (the payloads of the calls CommMeter saw: each point-to-point tensor, the all-gather's
    (W-1) shards, the all-to-all's chunks for other ranks), wire (MEASURED: what the OS saw
    this rank write, gloo's message headers included), framing = wire - sent."""
    shape = _check_shape(shape)
    b, h, hk, s, d = shape
    rows = []
    for w in validate.counts("world_sizes", world_sizes, minimum=2):
        res = _run(w, shape, (causal,))[0]
        for (method, layout, _), r in res.items():
            pred = estimate.cp_comm_bytes_per_layer(
                s, b, h * d, h, w, kv_heads=hk, method=method, dtype_bytes=4
            )
            for phase, (calls, sent, wire) in zip(("forward", "backward"), r["meters"]):
                said = ", ".join(f"{n} {op}" for op, n in calls.items())
                framing = None if wire is None else wire - int(sent)
                row = (w, method, layout, phase, said, pred[f"sent_{phase}"], int(sent), wire)
                rows.append(WireRow(*row, framing))
    return kit.frame(rows, WireRow)


def _timeline_worker(rank: int, world_size: int, shape: Shape, repeats: int) -> list[SpanRow]:
    q, k, v, dout = _inputs(shape)
    rows: list[SpanRow] = []
    for layout in C.LAYOUTS:
        cut: dict[str, Any] = dict(rank=rank, world_size=world_size, dim=2, layout=layout)
        for rep in range(repeats + 1):  # the first is a warm-up
            leaves = [C.shard_sequence(t, **cut).requires_grad_() for t in (q, k, v)]
            trace: list[dict] = []
            dist.barrier()
            t0 = time.perf_counter()  # one clock for all processes of this machine
            y = C.ring_attention(*leaves, layout=layout, check_shapes=False, trace=trace)
            y.backward(C.shard_sequence(dout, **cut))
            if rep:
                rows += [
                    SpanRow(layout, rep, rank, s["phase"], s["step"], s["kind"], s.get("blocks"),
                            s["start"] - t0, s["end"] - t0)
                    for s in trace
                ]  # fmt: skip
    return rows


def timeline(
    world_size: int = 2, *, shape: Shape = (1, 4, 4, 1024, 16), repeats: int = 1
) -> pd.DataFrame:
    """Causal ring attention (forward + backward) in both layouts on ``world_size`` ranks,
    traced: one row per rank, phase, step and kind (compute: with the blocks computed; wait:
    for the K/V or dK/dV in flight), start and end in seconds after a barrier."""
    w = validate.count("world_size", world_size, minimum=2, maximum=8)
    shape = _check_shape(shape)
    reps = validate.count("repeats", repeats, minimum=1)
    for lay in C.LAYOUTS:
        C.segments(shape[3], rank=0, world_size=w, layout=lay)  # refuses a bad seq here
    return kit.sweep(_timeline_worker, [dict(shape=shape, repeats=reps)], SpanRow, world_size=w)


def balance(tl: pd.DataFrame) -> pd.DataFrame:
    """From a :func:`timeline`: per layout and rank, the blocks its forward computed (counted as
    they ran) beside ``estimate.cp_attention_work``, and its compute seconds (forward +
    backward, median over repeats) relative to the layout's busiest rank."""
    comp = tl[tl.kind == "compute"]
    w = int(comp["rank"].max()) + 1
    found = []
    for (lay, rank), part in comp.groupby(["layout", "rank"]):
        fwd = part[(part.phase == "forward") & (part.repeat == part.repeat.min())]
        secs = float((part.end - part.start).groupby(part.repeat).sum().median())
        found.append((lay, int(rank), int(fwd.blocks.sum()), secs))
    busiest = {lay: max(s for other, *_, s in found if other == lay) for lay, *_ in found}
    return kit.frame(
        [BalanceRow(lay, r, b, int(estimate.cp_attention_work(w, rank=r, layout=lay)["blocks"]), s,
                    s / busiest[lay]) for lay, r, b, s in found],
        BalanceRow,
    )  # fmt: skip


from course_lib.units.u15_context_parallelism.run_balance import block_times  # noqa: E402
from course_lib.units.u15_context_parallelism.run_memory import saved_bytes  # noqa: E402
from course_lib.units.u15_context_parallelism.run_overlap import ring_overlap  # noqa: E402
from course_lib.units.u15_context_parallelism.run_train import train_parity  # noqa: E402
