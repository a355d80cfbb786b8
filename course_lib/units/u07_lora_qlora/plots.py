"""Figures of unit 07 (notebooks/07_lora_qlora.ipynb): results of ``run.py`` -> matplotlib Figure.

Pure: nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_lib.units.u07_lora_qlora.run_finetune import LossRow
from course_lib.units.u07_lora_qlora.run_memory import MemoryRow, ScaleRow
from course_lib.viz.plots import require_columns, styled

__all__ = ["METHOD_COLORS", "plot_finetune", "plot_memory", "plot_scale"]

READS = {
    LossRow: ("method", "step", "loss", "trainable"),
    MemoryRow: (
        "method",
        "grads",
        "grads_pred",
        "optimizer",
        "optimizer_pred",
        "target_weights",
        "target_weights_pred",
    ),
    ScaleRow: ("model", "method", "adapter", "frozen_base_GB", "trained_state_GB", "total_GB"),
}

#: one colour per fine-tuning method
METHOD_COLORS = {"full": "tab:blue", "lora": "tab:orange", "qlora": "tab:green"}


@styled
def plot_finetune(df: pd.DataFrame) -> Figure:
    """Loss per step of each method on the shifted task (log scale). ``df``: ``run.finetune()``."""
    require_columns(df, list(READS[LossRow]), "df", nonempty=True)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for method, sub in df.groupby("method", sort=False):
        ax.plot(
            sub["step"],
            sub["loss"],
            lw=2,
            color=METHOD_COLORS.get(method),
            label=f"{method} ({sub['trainable'].iloc[0]:,} trained)",
        )
    ax.set_yscale("log")
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("training loss (nats, log scale)")
    ax.set_title("Pre-trained tiny GPT fine-tuned on the shifted task")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


_PARTS = (
    ("target_weights", "frozen target weights"),
    ("grads", "gradients"),
    ("optimizer", "Adam state"),
)


@styled
def plot_memory(df: pd.DataFrame) -> Figure:
    """Bytes of the targeted weights, gradients and Adam state per method: measured bars, the
    prediction as a black tick on each. ``df``: ``run.memory_table()``."""
    require_columns(df, list(READS[MemoryRow]), "df", nonempty=True)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(df)
    for i, (_, row) in enumerate(df.iterrows()):
        xs = [j + (i - (len(df) - 1) / 2) * width for j in range(len(_PARTS))]
        kib = [row[p] / 1024 for p, _ in _PARTS]
        ax.bar(xs, kib, width=width, color=METHOD_COLORS.get(row["method"]), label=row["method"])
        ax.scatter(
            xs,
            [row[f"{p}_pred"] / 1024 for p, _ in _PARTS],
            marker="_",
            s=400,
            color="black",
            zorder=3,
            label="predicted (estimate)" if i == 0 else None,
        )
        for x, v in zip(xs, kib):
            ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(_PARTS)), [label for _, label in _PARTS])
    ax.set_ylabel("KiB (measured)")
    ax.set_title("One Adam step of the tiny GPT: what each method keeps")
    ax.legend()
    fig.tight_layout()
    return fig


@styled
def plot_scale(df: pd.DataFrame, *, gpus_GB: tuple[float, ...] = (48, 80)) -> Figure:
    """Model-state GB (frozen base + trained state) per model and method, log scale, with lines at
    the memory of common GPUs. ``df``: ``run.scale_table()``."""
    require_columns(df, list(READS[ScaleRow]), "df", nonempty=True)
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(df) + 1.5))
    labels = [
        f"{m}, {meth}" + (f" ({a})" if a else "")
        for m, meth, a in zip(df["model"], df["method"], df["adapter"])
    ]
    ys = range(len(df))
    ax.barh(ys, df["frozen_base_GB"], color="lightgray", edgecolor="black", label="frozen base")
    ax.barh(
        ys,
        df["trained_state_GB"],
        left=df["frozen_base_GB"],
        color=[METHOD_COLORS.get(m) for m in df["method"]],
        label="trained: params + grads + Adam",
    )
    for y, total in zip(ys, df["total_GB"]):
        ax.text(total * 1.08, y, f"{total:,.1f} GB", va="center", fontsize=9)
    for gb in gpus_GB:
        ax.axvline(gb, color="black", ls=":", lw=1)
        ax.text(gb, -0.9, f"{gb:g} GB", ha="center", fontsize=9)
    ax.set_xscale("log")
    ax.set_xlim(1, df["total_GB"].max() * 4)
    ax.set_yticks(list(ys), labels)
    ax.invert_yaxis()
    ax.set_xlabel("model-state GB (10^9 B; activations not included), log scale")
    ax.set_title("Full fine-tuning vs LoRA vs QLoRA (bf16-mixed Adam for what is trained)")
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    return fig
