"""Unit 14's figures (notebooks/14_planning_a_run.ipynb): the planner's predictions, drawn in the
course style. Data in (what ``course_lib.plan.plan`` or run.py returned), Figure out.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_lib.plan import MEMORY_CATEGORIES, TIME_PARTS
from course_lib.viz.plots import CATEGORY_COLORS, require_columns, style

__all__ = ["plot_top_memory", "plot_step_parts", "plot_mfu"]

_EXTRA = {"activations": "tab:red", "logits": "tab:purple", "buffers": "tab:gray"}


def _label(row: pd.Series) -> str:
    """A plan as a bar's label: every dimension it sets (cp, ep and the virtual stages v when
    they are not 1), so that no two plans of a chart read the same."""
    axes = [f"TP{row['tp']}"]
    axes += [f"CP{row['cp']}"] if row.get("cp", 1) > 1 else []
    axes += [f"PP{row['pp']}" + (f" v{row['v']}" if row.get("v", 1) > 1 else "")]
    axes += [f"EP{row['ep']}"] if row.get("ep", 1) > 1 else []
    axes += [f"DP{row['dp']}"]
    return (
        f"#{int(row['rank'])} {' '.join(axes)}\n"
        f"ZeRO-{row['zero']} {row['recompute']} mb{row['micro_batch']}"
    )


def plot_top_memory(
    result: pd.DataFrame, *, n: int = 3, capacity_GB: float | None = None
) -> Figure:
    """Memory per GPU (GB) of the first ``n`` plans, stacked by category, with the usable memory
    as a line (``capacity_GB``, default the plan's own)."""
    cols = [
        "rank",
        "tp",
        "pp",
        "dp",
        "zero",
        "recompute",
        "micro_batch",
        *[f"{k}_GB" for k in MEMORY_CATEGORIES],
    ]
    require_columns(result, cols, "result", nonempty=True)
    top = result.head(n)
    cap = (
        capacity_GB if capacity_GB is not None else result.attrs.get("inputs", {}).get("usable_GB")
    )
    with style():
        fig, ax = plt.subplots(figsize=(2.4 + 2.2 * len(top), 4.2))
        bottom = [0.0] * len(top)
        for k in MEMORY_CATEGORIES:
            vals = list(top[f"{k}_GB"])
            if not any(vals):
                continue
            ax.bar(
                range(len(top)),
                vals,
                bottom=bottom,
                label=k,
                color={**_EXTRA, **CATEGORY_COLORS}.get(k),
            )
            bottom = [b + v for b, v in zip(bottom, vals)]
        if cap:
            ax.axhline(cap, color="black", ls="--", lw=1, label=f"usable {cap:.0f} GB")
        ax.set_xticks(range(len(top)))
        ax.set_xticklabels([_label(r) for _, r in top.iterrows()], fontsize=8)
        ax.set_ylabel("GB per GPU (predicted)")
        ax.set_title("Memory per GPU of the top plans")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
        fig.tight_layout()
    return fig


def plot_step_parts(result: pd.DataFrame, *, n: int = 6) -> Figure:
    """Where the step time of the first ``n`` plans goes (s): compute, recompute, TP, P2P,
    bubble, exposed DP traffic."""
    require_columns(
        result,
        ["rank", "tp", "pp", "dp", "zero", "recompute", "micro_batch", *TIME_PARTS],
        "result",
        nonempty=True,
    )
    top = result.head(n)
    colors = ["tab:blue", "tab:cyan", "tab:orange", "tab:olive", "tab:red", "tab:purple"]
    with style():
        fig, ax = plt.subplots(figsize=(8, 0.9 + 0.6 * len(top)))
        left = [0.0] * len(top)
        for part, c in zip(TIME_PARTS, colors):
            vals = list(top[part])
            ax.barh(range(len(top)), vals, left=left, color=c, label=part[:-2].replace("_", " "))
            left = [a + v for a, v in zip(left, vals)]
        ax.set_yticks(range(len(top)))
        ax.set_yticklabels([_label(r).replace("\n", " ") for _, r in top.iterrows()], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("seconds per step (predicted)")
        ax.set_title("Where a step goes")
        # under the axes: inside, it hid the last bars' communication parts
        ax.legend(
            fontsize=8, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False
        )
        fig.tight_layout()
    return fig


def plot_mfu(published: pd.DataFrame) -> Figure:
    """Predicted beside reported MFU for the published runs (``run.published_runs``), one
    row per run: both model FLOPs, counted the PaLM way (a paper's HFU, step time or GPU-hours
    converted by ``plan.published.reported``)."""
    require_columns(published, ["run", "predicted MFU", "reported MFU"], "published", nonempty=True)
    with style():
        n = len(published)
        fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.32 * n))
        y = range(n)
        ax.barh([i - 0.2 for i in y], published["reported MFU"] * 100, 0.4, label="papers (MFU)")
        ax.barh([i + 0.2 for i in y], published["predicted MFU"] * 100, 0.4, label="planner (MFU)")
        ax.set_yticks(list(y))
        ax.set_yticklabels(published["run"], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("MFU (%)")
        ax.set_title("The planner beside the papers, as published (MFU, PaLM count)")
        ax.legend(loc="lower right")
        fig.tight_layout()
    return fig
