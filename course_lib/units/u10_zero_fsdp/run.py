"""Unit 10's measured runs (notebooks/10_zero_fsdp.ipynb): ZeRO stages 0-3 on real ranks.

Every multi-rank run goes through ``course_lib.launch`` (gloo on CPU; NCCL with one GPU per rank)
and uses the course's from-scratch ``parallel.zero.ZeroDataParallel`` beside PyTorch's
``ZeroRedundancyOptimizer`` and FSDP2 ``fully_shard``. Each function returns a tidy DataFrame:

- :func:`parity`: 3 AdamW steps of every stage on 2-4 ranks against one process (harness);
- :func:`torch_parity`: ours beside ZeroRedundancyOptimizer (stage 1) and ``fully_shard``
  (reshard_after_forward False ~ stage 2, True ~ stage 3), losses step by step;
- :func:`memory_table`: parameters, gradients, optimizer state per rank measured by MemoryMeter
  inside the ranks, beside ``estimate.zero_layout_bytes_per_rank`` and the paper's formula;
- :func:`comm_table`: bytes each rank wrote to its sockets per step, beside
  ``estimate.zero_bytes_sent_per_step``;
- :func:`fsdp_timeline`: stage 3's per-rank Gantt chart with and without prefetch, and
  reshard-after-forward on and off (peak memory and bytes measured);
- :func:`scale_grid`, :func:`source_checks`, :func:`smallest_stage`: 7B-70B through estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from torch import nn

from course_lib import validate
from course_lib.measure import estimate
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch

__all__ = [
    "model_fn",
    "batch_fn",
    "units_of",
    "parity",
    "torch_parity",
    "memory_table",
    "comm_table",
    "fsdp_timeline",
    "scale_grid",
    "source_checks",
    "smallest_stage",
    "MEMORY_WIDTH",
]

LR = 1e-2  #: AdamW learning rate of every run
MEMORY_WIDTH = 250  #: hidden width of the memory and traffic model (units of 2,250 / 31,375 / 378)


def model_fn(
    seed: int = 0,
    *,
    width: int = 32,
    depth: int = 2,
    out: int = 2,
    dtype: torch.dtype = torch.float64,
    taper: bool = True,
) -> nn.Module:
    """An MLP 8 -> width -> width/2 (-> width/2 ...) -> out with ``depth`` hidden layers (float64
    by default: Adam magnifies rounding noise, see parallel/harness.py); ``taper=False``: every
    hidden layer ``width`` wide."""
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)
    hidden = (width,) + (width // 2 if taper else width,) * (depth - 1)
    return MLP(MLPConfig(in_features=8, hidden=hidden, out_features=out)).to(dtype)


def batch_fn(step: int, *, rows: int = 24, out: int = 2, dtype: torch.dtype = torch.float64):
    """The full batch of step ``step`` (24 rows: divisible by 1, 2, 3 and 4 ranks)."""
    from course_lib.data import regression_task

    x, y = regression_task(rows, 8, out, seed=step)
    return x.to(dtype), y.to(dtype)


def _memory_model(seed: int = 0) -> nn.Module:
    return model_fn(seed, width=MEMORY_WIDTH, out=3, dtype=torch.float32)


def _memory_batch(step: int):
    return batch_fn(step, out=3, dtype=torch.float32)


def units_of(model: nn.Module) -> list[list[int]]:
    """The element counts of the parameter tensors of each unit (module owning parameters), the
    ``units`` argument of ``estimate.zero_layout_bytes_per_rank``."""
    return [
        [p.numel() for p in m.parameters(recurse=False)]
        for m in model.modules()
        if any(True for _ in m.parameters(recurse=False))
    ]


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR)


def _self(model):  # ZeroDataParallel is its own optimizer
    return model


def _summary(table: pd.DataFrame) -> dict:
    return {
        "comparisons": len(table),
        "failed": int((~table.ok).sum()),
        "worst": float((table.max_abs_diff / table.tolerance).max()),
        "ok": bool(table.ok.all()),
    }


# --------------------------------------------------------------------------------------------
# parity: our stages against one process, and against PyTorch's own
# --------------------------------------------------------------------------------------------
_VARIANTS = {
    "": {},
    "prefetch": {"prefetch": True},
    "keep after forward": {"reshard_after_forward": False},
}


def _parity_worker(rank: int, world_size: int, stages, variants, steps: int) -> dict:
    from course_lib.parallel.zero import ZeroDataParallel, full_tensors

    out = {}
    for stage in stages:
        for variant in variants if stage == 3 else [""]:
            # each rank builds a different model: the broadcast must make them one
            model = ZeroDataParallel(model_fn(seed=rank), stage=stage, lr=LR, **_VARIANTS[variant])
            out[(stage, variant)] = H.parallel_run(
                model,
                batch_fn,
                steps=steps,
                optimizer_fn=_self,
                gather_fn=full_tensors,
                shard=(rank, world_size),
            )
    return out


def parity(
    world_sizes: Sequence[int] = (2, 3, 4),
    stages: Sequence[int] = (1, 2, 3),
    *,
    steps: int = 3,
    variants: Sequence[str] = ("",),
) -> pd.DataFrame:
    """``steps`` AdamW steps (lr 1e-2, float64) under ZeroDataParallel, each stage and world
    size, against one process on the full batch (``parallel.harness``). ``variants`` of stage 3:
    "" (reshard after forward), "prefetch", "keep after forward". One row per world size, stage
    and variant: comparisons, failed, worst (max |difference| / tolerance; tolerance
    1e-6 + 1e-5 x max|reference| per tensor), ok."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    stages = [validate.choice("stages[i]", s, (0, 1, 2, 3)) for s in stages]
    variants = validate.choices("variants", variants, tuple(_VARIANTS))
    steps = validate.count("steps", steps, minimum=1)
    reference = H.reference_run(model_fn, batch_fn, steps=steps, optimizer_fn=_adamw)
    rows = []
    for n in sizes:
        results = launch(_parity_worker, n, stages, variants, steps)
        for key in results[0]:
            table = H.compare(reference, [r[key] for r in results])
            rows.append({"world_size": n, "stage": key[0], "variant": key[1], **_summary(table)})
    return pd.DataFrame(rows)


def _torch_worker(rank: int, world_size: int, steps: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.parallel.zero import ZeroDataParallel, full_tensors

    def run(model, optimizer_fn, gather_fn=H.full_tensors):
        return H.parallel_run(
            model,
            batch_fn,
            steps=steps,
            optimizer_fn=optimizer_fn,
            gather_fn=gather_fn,
            shard=(rank, world_size),
        )

    out = {}
    for stage in (1, 2, 3):
        out[f"ours, stage {stage}"] = run(
            ZeroDataParallel(model_fn(), stage=stage, lr=LR), _self, full_tensors
        )
    out["ZeroRedundancyOptimizer"] = run(
        DDP(model_fn()),
        lambda m: ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=LR),
    )
    for reshard in (False, True):
        model = model_fn()
        for layer in model.layers:
            fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        out[f"fully_shard(reshard_after_forward={reshard})"] = run(model, _adamw)
    dist.barrier()
    return out


#: which of torch's wrappers each of our stages is compared with
TORCH_TWIN = {
    "ours, stage 1": "ZeroRedundancyOptimizer",
    "ours, stage 2": "fully_shard(reshard_after_forward=False)",
    "ours, stage 3": "fully_shard(reshard_after_forward=True)",
}


def torch_parity(*, world_size: int = 2, steps: int = 3) -> pd.DataFrame:
    """Ours and PyTorch's on the same ranks, model and batches (float64, AdamW lr 1e-2). One row
    per implementation: losses (per step), worst and ok against one process (harness
    tolerance), and for ours, twin (torch's counterpart) and loss_diff (max |our loss - its
    loss| over steps)."""
    n = validate.count("world_size", world_size, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    reference = H.reference_run(model_fn, batch_fn, steps=steps, optimizer_fn=_adamw)
    results = launch(_torch_worker, n, steps)
    rows = []
    for name in results[0]:
        rec = [r[name] for r in results]
        row = {
            "implementation": name,
            "losses": rec[0].losses,
            **_summary(H.compare(reference, rec)),
        }
        twin = TORCH_TWIN.get(name)
        if twin:
            row["twin"] = twin
            row["loss_diff"] = max(
                abs(a - b) for a, b in zip(rec[0].losses, results[0][twin].losses)
            )
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# memory per rank
# --------------------------------------------------------------------------------------------
def _memory_worker(rank: int, world_size: int, stages) -> list[dict]:
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel.zero import ZeroDataParallel

    rows = []
    for stage in stages:
        model = ZeroDataParallel(_memory_model(), stage=stage, lr=LR)
        batch = H.shard_batch(_memory_batch(0), rank, world_size)
        H.mse_loss(model, batch).backward()
        model.step()
        with MemoryMeter(model, model.optimizer) as after:  # what stays between steps
            pass
        bd = after.start_breakdown
        rows.append(
            {
                "world_size": world_size,
                "rank": rank,
                "stage": stage,
                "params": bd["params"],
                "grads": bd["grads"],
                "optimizer": bd["optimizer"],
            }
        )
    return rows


def memory_table(
    world_sizes: Sequence[int] = (1, 2, 4), stages: Sequence[int] = (0, 1, 2, 3)
) -> pd.DataFrame:
    """One AdamW step (float32) of the memory model under each stage, per world size; model
    state MEASURED inside every rank by MemoryMeter after the step (before zero_grad): params,
    grads, optimizer, total. Beside them: predicted (``estimate.
    zero_layout_bytes_per_rank``: our padded layout, exact), padding (its part of predicted),
    paper (``estimate.zero_state_breakdown_per_rank`` with 4-byte params and grads and k = 8,
    no padding and no step counters) and residual (measured - predicted)."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    stages = [validate.choice("stages[i]", s, (0, 1, 2, 3)) for s in stages]
    rows = [r for n in sizes for res in launch(_memory_worker, n, stages) for r in res]
    df = pd.DataFrame(rows)
    units = units_of(_memory_model())
    psi = sum(map(sum, units))
    df["total"] = df.params + df.grads + df.optimizer
    pred = [
        estimate.zero_layout_bytes_per_rank(units, stage=s, world_size=n)
        for s, n in zip(df.stage, df.world_size)
    ]
    df["predicted"] = [p["total"] for p in pred]
    df["padding"] = [p["padding"] for p in pred]
    df["paper"] = [
        estimate.zero_bytes_per_rank(psi, stage=s, world_size=n, k=8, param_bytes=4, grad_bytes=4)
        for s, n in zip(df.stage, df.world_size)
    ]
    df["residual"] = df.total - df.predicted
    return df


# --------------------------------------------------------------------------------------------
# bytes on the wire per step
# --------------------------------------------------------------------------------------------
def _comm_worker(rank: int, world_size: int, stages, with_torch: bool) -> list[dict]:
    from torch.distributed.fsdp import fully_shard

    from course_lib.measure.comm import CommMeter
    from course_lib.parallel.zero import ZeroDataParallel

    batch = H.shard_batch(_memory_batch(0), rank, world_size)
    configs = [(f"stage {s}", s, {}) for s in stages]
    if 3 in stages:
        configs.append(("stage 3, keep after forward", 3, {"reshard_after_forward": False}))
    rows = []
    for name, stage, kw in configs:
        model = ZeroDataParallel(_memory_model(), stage=stage, lr=LR, **kw)
        for _step in range(2):  # step 0 warms up (gloo connects, first-call warnings)
            with CommMeter(dispatch=False) as meter:
                H.mse_loss(model, batch).backward()
                model.step()
            model.zero_grad()
        rows.append(
            {
                "world_size": world_size,
                "rank": rank,
                "config": name,
                "stage": stage,
                "reshard_after_forward": kw.get("reshard_after_forward", True),
                "calls": dict(meter.calls),
                "wire_bytes": meter.wire_bytes_sent,
                "model_bytes": meter.model_bytes_sent,
                "wire_source": meter.wire_source,
            }
        )
    if with_torch:
        model = _memory_model()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        for _step in range(2):
            with CommMeter(dispatch=False) as meter:
                H.mse_loss(model, batch).backward()
                opt.step()
            opt.zero_grad()
        rows.append(
            {
                "world_size": world_size,
                "rank": rank,
                "config": "torch fully_shard",
                "stage": 3,
                "reshard_after_forward": True,
                "calls": dict(meter.calls),
                "wire_bytes": meter.wire_bytes_sent,
                "model_bytes": meter.model_bytes_sent,
                "wire_source": meter.wire_source,
            }
        )
    return rows


def comm_table(
    world_sizes: Sequence[int] = (2, 4),
    stages: Sequence[int] = (0, 1, 2, 3),
    *,
    with_torch: bool = True,
) -> pd.DataFrame:
    """Bytes each rank wrote to its sockets during one training step (forward, backward,
    ``step()``; MEASURED by CommMeter from /proc/self/io, gloo), per world size and
    configuration; stage 3 also with ``reshard_after_forward=False``, and torch's
    ``fully_shard`` (``with_torch``). Beside: predicted (``estimate.zero_bytes_sent_per_step``
    on the padded float32 size; DDP's all-reduce for stage 0), vs_ddp (measured / the ring
    all-reduce of the unpadded gradients), residual (measured - predicted: gloo's headers)."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=2)
    stages = [validate.choice("stages[i]", s, (0, 1, 2, 3)) for s in stages]
    rows = [
        r for n in sizes for res in launch(_comm_worker, n, stages, bool(with_torch)) for r in res
    ]
    df = pd.DataFrame(rows)
    units = units_of(_memory_model())
    psi = sum(map(sum, units))
    padded = [
        psi + (estimate.zero_padding(units, n) if s else 0) for s, n in zip(df.stage, df.world_size)
    ]
    df["predicted"] = [
        estimate.zero_bytes_sent_per_step(4 * p, n, stage=s, reshard_after_forward=r)
        for p, n, s, r in zip(padded, df.world_size, df.stage, df.reshard_after_forward)
    ]
    ddp = [estimate.ring_allreduce_bytes_sent(4 * psi, n) for n in df.world_size]
    df["vs_ddp"] = [None if w is None else w / d for w, d in zip(df.wire_bytes, ddp)]
    df["residual"] = [None if w is None else w - p for w, p in zip(df.wire_bytes, df.predicted)]
    return df


# --------------------------------------------------------------------------------------------
# the FSDP timeline
# --------------------------------------------------------------------------------------------
TIMELINE_CONFIGS = {
    "reshard, no prefetch": {"prefetch": False, "reshard_after_forward": True},
    "reshard, prefetch": {"prefetch": True, "reshard_after_forward": True},
    "keep, no prefetch": {"prefetch": False, "reshard_after_forward": False},
    "keep, prefetch": {"prefetch": True, "reshard_after_forward": False},
}


def _timeline_worker(
    rank: int, world_size: int, configs, width: int, depth: int, batch: int
) -> dict:
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter
    from course_lib.measure.memory import MemoryMeter
    from course_lib.measure.timing import EventLog
    from course_lib.parallel.zero import ZeroDataParallel

    x = torch.randn(batch, 8)
    y = torch.randn(batch, 2)
    events, rows = [], []
    for name in configs:
        model = ZeroDataParallel(
            model_fn(width=width, depth=depth, dtype=torch.float32, taper=False),
            stage=3,
            lr=LR,
            **TIMELINE_CONFIGS[name],
        )
        for step in range(3):  # 0: warm-up, 1: peak memory, 2: timeline and bytes
            model.log = EventLog(rank) if step == 2 else None
            meter = MemoryMeter(model, model.optimizer) if step == 1 else CommMeter(dispatch=False)
            dist.barrier()
            with meter:  # forward and backward: where stage 3 gathers (its step() sends nothing)
                H.mse_loss(model, (x, y)).backward()
            model.step()
            model.zero_grad()
            if step == 1:
                peak = meter.peak_bytes
        events += [{**e, "meta": {**e["meta"], "config": name}} for e in model.log.to_records()]
        rows.append(
            {
                "rank": rank,
                "config": name,
                **TIMELINE_CONFIGS[name],
                "peak_bytes": peak,
                "wire_bytes": meter.wire_bytes_sent,
                "all_gathers": meter.calls.get("all_gather_single", 0)
                + meter.calls.get("all_gather_into_tensor", 0),
            }
        )
    return {"events": events, "rows": rows}


def fsdp_timeline(
    configs: Sequence[str] = tuple(TIMELINE_CONFIGS),
    *,
    world_size: int = 2,
    width: int = 256,
    depth: int = 6,
    batch: int = 64,
):
    """Stage 3 on an MLP of ``depth`` + 1 Linear units (float32; hidden layers ``width`` x
    ``width``) for each configuration of
    :data:`TIMELINE_CONFIGS`. Returns ``(events, summary)``: events (``merge_event_logs`` of
    every rank: all-gather / forward / backward / reduce-scatter spans, shared host clock, per
    config; the last of 3 steps) and summary (per rank and config: peak_bytes, MemoryMeter's
    peak over forward and backward; wire_bytes, measured; all_gathers, calls counted)."""
    from course_lib.measure.timing import merge_event_logs

    configs = validate.choices("configs", configs, tuple(TIMELINE_CONFIGS))
    n = validate.count("world_size", world_size, minimum=2)
    width = validate.count("width", width, minimum=2)
    depth = validate.count("depth", depth, minimum=1)
    batch = validate.count("batch", batch, minimum=1)
    res = launch(_timeline_worker, n, configs, width, depth, batch)
    events = merge_event_logs([r["events"] for r in res])
    events["config"] = [m["config"] for m in events["meta"]]
    summary = pd.DataFrame([row for r in res for row in r["rows"]])
    return events, summary


# --------------------------------------------------------------------------------------------
# at scale, through estimate
# --------------------------------------------------------------------------------------------
def scale_grid(
    n_params: float = 7e9, world_sizes: Sequence[int] = (1, 2, 4, 8, 16), *, k: int = 12
) -> pd.DataFrame:
    """GB (1e9 B) of model state per GPU, stage (rows) x data-parallel ranks (columns), 16 B per
    parameter by default (bf16 params and grads, fp32 master + Adam moments; k = 12)."""
    n = validate.count("n_params", n_params, minimum=1)
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    return pd.DataFrame(
        {
            f"N={w}": [
                estimate.zero_bytes_per_rank(n, stage=s, world_size=w, k=k) / 1e9
                for s in (0, 1, 2, 3)
            ]
            for w in sizes
        },
        index=[f"stage {s}" for s in (0, 1, 2, 3)],
    )


def smallest_stage(n_params: float, world_size: int, gpu_GB: float, *, k: int = 12) -> int | None:
    """The lowest ZeRO stage whose model state (16 B/param by default) fits in ``gpu_GB`` GB per
    GPU, or None if even stage 3 does not (activations not counted)."""
    n = validate.count("n_params", n_params, minimum=1)
    w = validate.count("world_size", world_size, minimum=1)
    cap = validate.number("gpu_GB", gpu_GB, positive=True)
    for stage in (0, 1, 2, 3):
        if estimate.zero_bytes_per_rank(n, stage=stage, world_size=w, k=k) <= cap * 1e9:
            return stage
    return None


def source_checks() -> pd.DataFrame:
    """The sources' ZeRO figures, recomputed with estimate (GB = 1e9 B). One row per claim:
    source, claim, quoted, recomputed."""
    z = estimate.zero_bytes_per_rank
    gb = lambda b: round(b / 1e9, 3)  # noqa: E731
    rows = [
        (
            "S0 / ZeRO Fig. 1",
            "7.5B on 64 GPUs, stages 0-3 (GB)",
            "120 / 31.4 / 16.6 / 1.9",
            " / ".join(f"{gb(z(7.5e9, stage=s, world_size=64)):g}" for s in range(4)),
        ),
        (
            "S1",
            "10B on 8 GPUs (GB)",
            "160 / 55 / 37.5 / 20",
            " / ".join(f"{gb(z(10e9, stage=s, world_size=8)):g}" for s in range(4)),
        ),
        (
            "S4",
            "7B on 8 GPUs (GB)",
            "112 / 38.5 / 26.25 / 14",
            " / ".join(f"{gb(z(7e9, stage=s, world_size=8)):g}" for s in range(4)),
        ),
        (
            "S1 exercise 3",
            "12B: DP vs ZeRO-3 on 8 (GB)",
            "192 / 24",
            f"{gb(z(12e9, stage=0, world_size=8)):g} / {gb(z(12e9, stage=3, world_size=8)):g}",
        ),
        (
            "S3",
            "ZeRO-1 = 2Ψ + 14Ψ/N; 7B, N = 8 (GB)",
            f"{gb(2 * 7e9 + 14 * 7e9 / 8):g}",
            f"4Ψ + 12Ψ/N = {gb(z(7e9, stage=1, world_size=8)):g}",
        ),
        (
            "S2",
            "table 95 / 52 / 38 / 16 GB (7B, 8 GPUs)",
            "95 / 52 / 38 / 16",
            "16 B: "
            + " / ".join(f"{gb(z(7e9, stage=s, world_size=8)):g}" for s in range(4))
            + "; 12 B: "
            + " / ".join(
                f"{gb(estimate.zero_bytes_per_rank(7e9, stage=s, world_size=8, k=8)):g}"
                for s in range(4)
            ),
        ),
        (
            "S2",
            "stage 1 saves ~60 % of optimizer state (N = 8)",
            "60 %",
            f"{100 * (1 - 1 / 8):g} %",
        ),
        (
            "S4",
            "ZeRO-3 traffic vs DDP",
            "3x",
            f"{estimate.zero_bytes_sent_per_step(10**9, 8, stage=3) / estimate.ring_allreduce_bytes_sent(10**9, 8):g}x",
        ),
    ]
    return pd.DataFrame(rows, columns=["source", "claim", "quoted", "recomputed"])
