"""Unit 11's figures (notebooks/11_tensor_parallelism.ipynb). Data in (what run.py returned),
matplotlib Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import TABLEAU_COLORS
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_lib.units.u11_tensor_parallelism.run import ShapeRow
from course_lib.units.u11_tensor_parallelism.run_costs import MemoryRow
from course_lib.units.u11_tensor_parallelism.run_scale import LayerScaleRow
from course_lib.viz.plots import require_columns, style

__all__ = ["plot_split", "plot_memory", "plot_scale"]

_PANELS = (
    ("attn.c_attn.weight", "attention qkv: column parallel\n(q, k, v each split by heads)", 3),
    ("attn.c_proj.weight", "attention output: row parallel", 1),
    ("mlp.c_fc.weight", "MLP c_fc: column parallel", 1),
    ("mlp.c_proj.weight", "MLP c_proj: row parallel", 1),
)

READS = {
    ShapeRow: ("tp_rank", "parameter", "full", "on_rank"),
    MemoryRow: ("tp", "sequence_parallel", "rank", "category", "measured", "predicted"),
    LayerScaleRow: ("model", "tp", "state_bytes", "activations_tp", "activations_sp"),
}


def _draw_shard(
    ax: Axes,
    name: str,
    k: int,
    on_rank: tuple[int, int],
    full: tuple[int, int],
    chunks: int,
    tp: int,
) -> None:
    """Rank ``k``'s part of the ``full`` (out, inp) matrix, coloured, with its measured shape."""
    colour = list(TABLEAU_COLORS.values())[k % 10]  # tab10
    (h, w), (out, inp) = on_rank, full
    if "c_proj" in name:  # row parallel: a block of input columns
        ax.add_patch(Rectangle((k * w, 0), w, out, color=colour, alpha=0.75))
        ax.text(
            k * w + w / 2,
            out / 2,
            f"rank {k}\n{h}x{w}",
            ha="center",
            va="center",
            fontsize=10,
            rotation=90 if tp > 2 else 0,
        )
    else:  # column parallel: blocks of output rows (in each of `chunks` parts)
        part = h // chunks
        for c in range(chunks):
            y0 = c * out / chunks + k * part
            ax.add_patch(Rectangle((0, y0), inp, part, color=colour, alpha=0.75))
        # a matrix drawn narrower than its label: two short lines where its bands are tall
        # enough (the MLP's), one line in the thin bands of the fused qkv projection
        sep = "\n" if chunks == 1 else ": "
        ax.text(
            inp / 2, k * part + part / 2, f"r{k}{sep}{h}x{w}", ha="center", va="center", fontsize=8
        )


def plot_split(shapes: pd.DataFrame) -> Figure:
    """The four weight matrices of a block (rows = output features, columns = input features,
    as nn.Linear stores them), coloured by the rank that holds each part, with each rank's
    shard shape as measured on that rank, from ``run.shard_shapes``."""
    require_columns(shapes, list(READS[ShapeRow]), "shapes", nonempty=True)
    ranks = shapes.drop_duplicates(["tp_rank", "parameter"])
    tp = int(ranks.tp_rank.max()) + 1
    with style():
        fig, axes = plt.subplots(1, 4, figsize=(16, 5.5))
        for ax, (name, title, chunks) in zip(axes, _PANELS):
            rows = ranks[ranks.parameter == name].sort_values("tp_rank")
            out, inp = rows.full.iloc[0]
            for _, r in rows.iterrows():
                _draw_shard(ax, name, int(r.tp_rank), r.on_rank, (out, inp), chunks, tp)
            if chunks == 3:  # name the q, k, v blocks of the fused projection
                for c, label in enumerate("qkv"):
                    ax.text(
                        inp * 1.05,
                        (c + 0.5) * out / 3,
                        label,
                        ha="left",
                        va="center",
                        fontsize=12,
                        fontweight="bold",
                    )
            ax.set_xlim(0, inp)
            ax.set_ylim(out, 0)
            ax.set_aspect("equal")
            ax.set_title(f"{title}\nfull {out}x{inp}", fontsize=11)
            ax.set_xlabel("input features")
            ax.set_ylabel("output features")
        fig.suptitle(
            f"One block of the tiny GPT split over tp = {tp} ranks (shapes measured on each rank)"
        )
        fig.tight_layout()
    return fig


def plot_memory(mem: pd.DataFrame, *, rank: int = 0) -> Figure:
    """Per-rank memory of one Adam step by category, measured (bars) beside predicted (black
    ticks), for every (tp, sequence_parallel) of ``run.memory_per_rank``; KiB (1024 B)."""
    require_columns(mem, list(READS[MemoryRow]), "mem", nonempty=True)
    df = mem[mem["rank"] == rank]
    configs = list(dict.fromkeys(zip(df.tp, df.sequence_parallel)))
    cats = list(dict.fromkeys(df.category))
    width = 0.8 / len(configs)
    colours = plt.get_cmap("viridis")
    with style():
        fig, ax = plt.subplots(figsize=(11, 5.5))
        for i, (t, sp) in enumerate(configs):
            part = df[(df.tp == t) & (df.sequence_parallel == sp)].set_index("category")
            xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(cats))]
            ax.bar(
                xs,
                [part.measured[c] / 1024 for c in cats],
                width=width * 0.95,
                color=colours(i / max(1, len(configs) - 1)),
                label=f"tp = {t}" + (" + sequence parallel" if sp else ""),
            )
            ax.scatter(
                xs,
                [part.predicted[c] / 1024 for c in cats],
                marker="_",
                s=300,
                color="black",
                zorder=3,
                label="predicted" if i == 0 else None,
            )
        ax.set_xticks(range(len(cats)), cats)
        ax.set_ylabel("KiB on one rank")
        ax.set_title(f"Rank {rank}: measured (bars) and predicted (black) per category")
        ax.legend(fontsize=10)
        fig.tight_layout()
    return fig


def plot_scale(table: pd.DataFrame) -> Figure:
    """From ``run.scale_table``: left, one layer's memory on a rank (model state, activations
    with tensor parallelism, with sequence parallelism) against tp, per model; right, the time
    of one layer's 4 all-reduces per step on each link (log scale)."""
    require_columns(table, list(READS[LayerScaleRow]), "table", nonempty=True)
    links = [c for c in table.columns if c.startswith("comm_s_per_layer ")]
    with style():
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
        for (model, part), marker in zip(table.groupby("model", sort=False), "os^"):
            ax.plot(part.tp, part.state_bytes / 2**30, marker=marker, label=f"{model}: model state")
            ax.plot(
                part.tp,
                part.activations_tp / 2**30,
                marker=marker,
                linestyle="--",
                label=f"{model}: activations, TP",
            )
            ax.plot(
                part.tp,
                part.activations_sp / 2**30,
                marker=marker,
                linestyle=":",
                label=f"{model}: activations, TP + SP",
            )
            sub = part[part.tp > 1]
            for link in links:
                bx.plot(
                    sub.tp,
                    sub[link] * 1e3,
                    marker=marker,
                    label=f"{model}, {link.split(' ', 1)[1]}",
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tp")
        ax.set_ylabel("GiB per rank, one layer")
        ax.set_title("One layer on one rank (16 B/param; 16-bit activations)")
        ax.legend(fontsize=9)
        bx.set_xscale("log", base=2)
        bx.set_yscale("log")
        bx.set_xlabel("tp")
        bx.set_ylabel("ms per layer per step (4 all-reduces)")
        bx.set_title("Tensor-parallel communication by link")
        bx.legend(fontsize=9)
        fig.tight_layout()
    return fig
