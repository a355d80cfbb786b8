"""The ZeRO paper's Figure 1 (and the 7B-on-8-GPUs table) on the virtual cluster.

Rajbhandari et al. 2020 (arXiv:1910.02054), Figure 1: Ψ = 7.5e9 parameters, N_d = 64 GPUs,
mixed-precision Adam at 16 B/param (fp16 params 2, fp16 grads 2, fp32 master + momentum +
variance 12): 120 / 31.4 / 16.6 / 1.9 GB per GPU for baseline / P_os / P_os+g / P_os+g+p.
``course_lib.measure.estimate.zero_bytes_per_rank`` is that formula; here PyTorch's real FSDP2
runs one step of a 7.5B Llama-shaped model as rank 0 of 64 and we read what it holds.

Which stage FSDP2 implements:

* ``fully_shard`` (strategy "fsdp") is P_os+g+p (ZeRO-3): fp32 parameter shard, fp32 gradient
  shard, Adam moments of the shard -- 16Ψ/N -- plus the bf16 gathered parameters of the layer(s)
  being computed.
* ``reshard_after_forward=False`` ("fsdp_no_reshard") keeps every layer's gathered bf16
  parameters from its forward to its backward: at the backward peak a rank holds 2Ψ of
  parameters, as ZeRO-2 does, plus the same 16Ψ/N shards. The closest FSDP2 gets to P_os+g.
* ``replicate`` ("ddp") is the baseline: fp32 parameters, fp32 gradients and Adam moments of
  everything, plus the bf16 copy mixed precision computes with.
* P_os alone (shard only the optimizer) has no FSDP2 mode (``ZeroRedundancyOptimizer`` is
  ZeRO-1 in PyTorch); the table gives the estimate only.

What is compared: ``virtual_GB`` = fp32 parameter shard + fp32 gradient shard + Adam state
(:func:`model_states`: after backward) + the most gathered bf16 parameters alive at once. Per
parameter, ZeRO counts fp16 params 2 + fp16 grads 2 + fp32 master 4 + Adam 8 = 16 B; FSDP2 with
``MixedPrecisionPolicy(param_dtype=bf16)`` keeps the fp32 parameter (it *is* the master) 4 +
fp32 gradient 4 + Adam 8 = 16 B of shards, and makes the bf16 copy (ZeRO's fp16 params) by
all-gather when a layer runs. The residuals, each PyTorch's design and not a tracker artefact:

1. baseline: +2Ψ (15 GB at 7.5B): gradients are kept in fp32 (FSDP2 casts the reduced gradient
   to the parameter's dtype), ZeRO counts fp16 gradients; the bf16 copy plays ZeRO's fp16 params.
2. P_os+g: +2Ψ/N (0.23 GB at N = 64): the same fp32 gradients, now sharded. The 2Ψ of gathered
   bf16 parameters are ZeRO-2's replicated fp16 parameters, held from forward to backward.
3. P_os+g+p: the shards match 16Ψ/N to the byte (1.875 GB; the paper rounds to 1.9). The rest is
   the gathered working set Figure 1 leaves out: the root module's parameters (embedding and
   output layer: FSDP2 does not reshard the root after forward, since backward starts there)
   plus the block being computed (and the next one when prefetched).
4. Small terms: Adam's fp32 ``step`` counter per parameter tensor (4 B each), and padding of
   every parameter's dim 0 to a multiple of N (at most N - 1 rows each; none for these shapes).
5. Beyond model states, the peak (``peak_GB``) adds activations, all-gather and reduce-scatter
   buffers, backward temporaries and (for the replicated baseline) the foreach optimizer's
   scratch: Figure 1 leaves all of those out.

Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from course_lib.measure import estimate
from course_lib.virtual._types import Strategy
from course_lib.virtual.model import PRESETS, LlamaLike
from course_lib.virtual.result import LABEL, SimulatedStep
from course_lib.virtual.simulate import seq_argument, simulate_step

__all__ = [
    "ZeroRow",
    "ZeroTable",
    "model_states",
    "zero_table",
    "zero_figure1",
    "zero_7b_table",
    "FIGURE1_GB",
    "SEVEN_B_GB",
    "STAGE_NAMES",
    "STAGE_STRATEGY",
]

STAGE_NAMES = {
    0: "baseline (DDP)",
    1: "P_os (ZeRO-1)",
    2: "P_os+g (ZeRO-2)",
    3: "P_os+g+p (ZeRO-3)",
}
#: ZeRO stage -> the FSDP2 strategy that implements it (None: no FSDP2 counterpart)
STAGE_STRATEGY: dict[int, Strategy | None] = {0: "ddp", 1: None, 2: "fsdp_no_reshard", 3: "fsdp"}
#: arXiv:1910.02054, Figure 1 (Ψ = 7.5e9, N_d = 64), GB per GPU
FIGURE1_GB = (120.0, 31.4, 16.6, 1.9)
#: 7B at 16 B/param on 8 GPUs (UNITS.md, unit 10, source S4), GB per GPU
SEVEN_B_GB = (112.0, 38.5, 26.25, 14.0)


def model_states(step: SimulatedStep) -> dict[str, int]:
    """Model-state bytes per rank from a ``simulate_step`` result, in ZeRO's sense.

    params, grads, optimizer: what the rank holds after backward, before the step (its shards,
    or everything when replicated); gathered: the most bytes of gathered (unsharded) parameters
    alive at once during the step. ``total`` = the four.
    """
    if not isinstance(step, SimulatedStep):
        raise TypeError(
            f"step = {type(step).__name__}: expected the SimulatedStep that "
            "virtual.simulate_step returned"
        )
    return step.model_states()


@dataclass(frozen=True)
class ZeroRow:
    """One ZeRO stage of a :class:`ZeroTable`, GB = 1e9 bytes (see :func:`zero_table`). The
    virtual cluster's fields are None on a stage it did not run (``label`` "estimate only")."""

    stage: int
    name: str
    target_GB: float
    estimate_GB: float
    estimate_model_GB: float
    strategy: Strategy | None
    label: str
    note: str
    params_GB: float | None = None
    gathered_GB: float | None = None
    grads_GB: float | None = None
    optimizer_GB: float | None = None
    states_GB: float | None = None
    virtual_GB: float | None = None
    ratio: float | None = None
    residual_GB: float | None = None
    sim_cpu_s: float | None = None
    peak_GB: float | None = None


#: the table's columns in order: the estimate's, the virtual cluster's (rows that ran), the rest
_ESTIMATE_COLUMNS = ("stage", "name", "target_GB", "estimate_GB", "estimate_model_GB", "strategy")
_VIRTUAL_COLUMNS = (
    "params_GB",
    "gathered_GB",
    "grads_GB",
    "optimizer_GB",
    "states_GB",
    "virtual_GB",
    "ratio",
    "residual_GB",
    "sim_cpu_s",
    "peak_GB",
)


@dataclass(frozen=True)
class ZeroTable:
    """Per-stage model states per rank: the source's numbers, estimate, and the virtual cluster
    (:func:`zero_table`). ``rows``: one :class:`ZeroRow` per stage 0-3; ``runs``: stage -> its
    :class:`SimulatedStep` (stages that ran); ``title`` says "virtual cluster"."""

    rows: tuple[ZeroRow, ...]
    runs: Mapping[int, SimulatedStep]
    world_size: int
    model: str
    n_params: int
    paper_n_params: float
    title: str

    label = LABEL

    def to_frame(self) -> pd.DataFrame:
        """One row per stage; the virtual cluster's columns only when some stage ran (NaN on the
        stages that did not), then ``label`` and ``note``."""
        ran = any(r.virtual_GB is not None for r in self.rows)
        columns = (*_ESTIMATE_COLUMNS, *(_VIRTUAL_COLUMNS if ran else ()), "label", "note")
        records = [{c: getattr(r, c) for c in columns} for r in self.rows]
        out = pd.DataFrame(records, columns=list(columns))
        for c in _VIRTUAL_COLUMNS if ran else ():
            out[c] = out[c].astype(float)
        return out

    def __repr__(self) -> str:
        return f"{self.title}\n{self.to_frame()!r}"


_NOTE = {
    0: "+2Ψ: grads kept in fp32 (4 B; ZeRO: fp16, 2 B); bf16 copy = ZeRO's fp16 params",
    1: "no FSDP2 mode shards only the optimizer (PyTorch: ZeroRedundancyOptimizer)",
    2: "+2Ψ/N: fp32 grad shards; gathered = all bf16 params, forward to backward (ZeRO-2's 2Ψ)",
    3: "shards = 16Ψ/N exactly; + gathered working set (root's embedding/output + block in "
    "flight), not in Figure 1",
}


def _estimate_row(
    stage: int, model: LlamaLike, world_size: int, target_gb: float, paper_n_params: float
) -> dict[str, Any]:
    """One stage's fields before the virtual cluster runs: the source's target and estimate's."""
    return {
        "stage": stage,
        "name": STAGE_NAMES[stage],
        "target_GB": target_gb,
        "estimate_GB": estimate.zero_bytes_per_rank(
            paper_n_params,  # type: ignore[arg-type]  # counts accept integral floats (7.5e9)
            stage=stage,
            world_size=world_size,
        )
        / 1e9,
        "estimate_model_GB": estimate.zero_bytes_per_rank(
            model.n_params, stage=stage, world_size=world_size
        )
        / 1e9,
        "strategy": STAGE_STRATEGY[stage],
        "note": _NOTE[stage],
    }


def _virtual_row(row: dict[str, Any], step: SimulatedStep) -> ZeroRow:
    """One stage's row with the virtual cluster's fields (``row`` holds its targets)."""
    states = step.model_states()
    virtual_gb = states["total"] / 1e9
    return ZeroRow(
        **row,
        label=LABEL,
        params_GB=states["params"] / 1e9,
        gathered_GB=states["gathered"] / 1e9,
        grads_GB=states["grads"] / 1e9,
        optimizer_GB=states["optimizer"] / 1e9,
        states_GB=(states["total"] - states["gathered"]) / 1e9,
        virtual_GB=virtual_gb,
        ratio=virtual_gb / row["target_GB"],
        residual_GB=virtual_gb - row["estimate_model_GB"],
        sim_cpu_s=step.simulate_s,
        peak_GB=step.at("total", "at_peak") / 1e9,
    )


def zero_table(
    model: LlamaLike,
    world_size: int,
    targets_gb: Sequence[float],
    *,
    paper_n_params: float,
    batch: int = 1,
    seq: int | None = None,
    run_virtual: bool = True,
    timeout: float = 300.0,
    count_comm: bool = True,
    seq_len: int | None = None,
) -> ZeroTable:
    """Per-stage model states per rank: the source's numbers, estimate, and the virtual cluster.

    Returns a :class:`ZeroTable`; the columns of its ``to_frame()``: stage, name, target_GB
    (the source), estimate_GB (zero_bytes_per_rank at the source's Ψ), estimate_model_GB (at this model's exact Ψ), strategy (the FSDP2 run, or
    None), params_GB, gathered_GB, grads_GB, optimizer_GB, states_GB (params + grads +
    optimizer), virtual_GB (states + gathered; see :func:`model_states`), ratio (virtual /
    target), residual_GB (virtual - estimate_model), peak_GB (the rank's whole peak, with
    activations and buffers), sim_cpu_s (CPU seconds of the simulation), note, label
    (= "virtual" on rows run on the virtual cluster, else "estimate only").
    GB = 1e9 bytes, as the paper. ``batch`` sequences of ``seq`` tokens (None: 64) per rank;
    ``seq_len`` is the old name of ``seq``, kept one release (giving both is a TypeError).
    """
    seq_name, seq_value = seq_argument(seq, seq_len, default=64)
    rows = []
    runs: dict[int, SimulatedStep] = {}
    for stage in range(4):
        strategy = STAGE_STRATEGY[stage]
        row = _estimate_row(stage, model, world_size, float(targets_gb[stage]), paper_n_params)
        if run_virtual and strategy is not None:
            runs[stage] = simulate_step(
                model,
                world_size=world_size,
                strategy=strategy,
                mixed_precision="bf16",
                batch=batch,
                **{seq_name: seq_value},
                timeout=timeout,
                count_comm=count_comm,
            )
            rows.append(_virtual_row(row, runs[stage]))
        else:
            rows.append(ZeroRow(**row, label="estimate only"))
    return ZeroTable(
        rows=tuple(rows),
        runs=runs,
        world_size=world_size,
        model=model.name,
        n_params=model.n_params,
        paper_n_params=paper_n_params,
        title=f"virtual cluster vs ZeRO accounting: {model.name} "
        f"({model.n_params / 1e9:.3f}B params), {world_size} ranks, bf16 "
        "params + fp32 master/Adam, GB per rank",
    )


def zero_figure1(*, world_size: int = 64, run_virtual: bool = True, **kwargs: Any) -> ZeroTable:
    """Figure 1 of arXiv:1910.02054 (7.5B params, 64 GPUs) with FSDP2 on the virtual cluster."""
    return zero_table(
        PRESETS["zero-7.5b"],
        world_size,
        FIGURE1_GB,
        paper_n_params=7.5e9,
        run_virtual=run_virtual,
        **kwargs,
    )


def zero_7b_table(*, world_size: int = 8, run_virtual: bool = True, **kwargs: Any) -> ZeroTable:
    """7B at 16 B/param on 8 GPUs: 112 / 38.5 / 26.25 / 14 GB, with FSDP2 on the virtual cluster."""
    return zero_table(
        PRESETS["7b"], world_size, SEVEN_B_GB, paper_n_params=7e9, run_virtual=run_virtual, **kwargs
    )
