"""What one virtual-cluster simulation returns: :class:`SimulatedStep`, the bytes rank 0 holds
per category at each moment of the step, and the settings and counts of the run, each a typed
field. ``step.to_frame()`` is the table (one row per category); ``step.title`` says "virtual
cluster" and what ran. Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from course_lib.virtual._types import Checkpoint, MixedPrecision, Optimizer, Strategy

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SimulatedStep", "ROWS", "COLUMNS", "LABEL", "ROW_HELP", "Comm"]

LABEL = "virtual"

#: rows of the result, in order
ROWS = (
    "params",
    "unsharded_params",
    "grads",
    "unsharded_grads",
    "optimizer",
    "activations",
    "temporaries",
    "all_gather",
    "reduce_scatter",
    "buffers",
    "inputs",
    "total",
)
#: numeric columns of the result (bytes, int)
COLUMNS = ("at_peak", "max", "after_forward", "after_backward", "after_step")

#: row -> what it counts
ROW_HELP = {
    "params": "this rank's parameters as stored (FSDP: its fp32 shard; TP: its slices)",
    "unsharded_params": "gathered full parameters (bf16 with mixed precision) alive at the time",
    "grads": "this rank's gradients as kept for the optimizer (FSDP: the reduced shard)",
    "unsharded_grads": "full-size gradients before reduce-scatter",
    "optimizer": "optimizer state kept between steps (Adam: 2 moments + a step counter per tensor)",
    "activations": "tensors made in forward (what autograd saves, outputs)",
    "temporaries": "backward scratch, activation gradients, and the optimizer step's transients",
    "all_gather": "FSDP's all-gather output buffers",
    "reduce_scatter": "FSDP's reduce-scatter input buffers",
    "buffers": "module buffers",
    "inputs": "the batch of token ids",
    "total": "sum of the rows (at_peak: the rank's peak)",
}

#: collective counts from ``CommDebugMode``: phase ("total", "forward", "backward") -> op -> calls
Comm = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class SimulatedStep:
    """One training step on the virtual cluster, as rank 0 of ``world_size`` ranks saw it.

    ``breakdown[column][row]``: bytes of category ``row`` (:data:`ROWS`) at moment ``column``
    (:data:`COLUMNS`: ``at_peak``, the breakdown when the total peaked in forward + backward;
    ``max``, each category's largest value; ``after_forward``, ``after_backward``,
    ``after_step``). The settings are those of ``simulate_step``; ``dp = world_size // tp``.
    ``comm``: collective counts (None when not counted). ``simulate_s``: CPU seconds of the
    simulating process; ``launch_s``: the whole call; ``rss_peak_bytes``: that process's peak
    resident memory. ``step_peak_bytes_traced``: the optimizer step's traced peak (inflated by
    DTensor's global shapes, left out of ``at_peak``). ``activation_peak_bytes``: the largest
    activations + temporaries during forward and backward; ``activation_peak``: every row at
    that moment.
    """

    title: str
    strategy: Strategy
    world_size: int
    tp: int
    mixed_precision: MixedPrecision
    optimizer: Optimizer
    checkpoint: Checkpoint
    batch: int
    seq: int  # tokens per sequence
    model: str
    n_params: int | None
    n_params_local: int
    breakdown: Mapping[str, Mapping[str, int]]
    comm: Comm | None
    simulate_s: float
    launch_s: float | None
    rss_peak_bytes: int
    torch: str
    step_peak_bytes_traced: int
    activation_peak_bytes: int
    activation_peak: Mapping[str, int]

    label = LABEL  # what every frame and figure of the virtual cluster is labelled with
    row_help = ROW_HELP

    @property
    def seq_len(self) -> int:
        """The old name of ``seq`` (kept one release)."""
        return self.seq

    @property
    def dp(self) -> int:
        """Data-parallel degree: world_size // tp."""
        return self.world_size // self.tp

    def at(self, row: str, column: str = "at_peak") -> int:
        """Bytes of category ``row`` at moment ``column``, e.g. ``step.at("params",
        "after_backward")``."""
        if column not in self.breakdown:
            raise ValueError(f"column = {column!r}: expected one of {', '.join(COLUMNS)}")
        if row not in ROWS:
            raise ValueError(f"row = {row!r}: expected one of {', '.join(ROWS)}")
        return int(self.breakdown[column].get(row, 0))

    def to_frame(self) -> pd.DataFrame:
        """One row per category of :data:`ROWS`: columns ``category``, the byte columns of
        :data:`COLUMNS` (int) and ``label`` (= "virtual")."""
        import pandas as pd

        return pd.DataFrame(
            {
                "category": list(ROWS),
                **{c: [self.at(r, c) for r in ROWS] for c in COLUMNS},
                "label": [LABEL] * len(ROWS),
            }
        )

    def gib(self) -> pd.DataFrame:
        """The byte columns in GiB (2^30 B), rounded to 3 decimals, indexed by category."""
        frame = self.to_frame().set_index("category")[list(COLUMNS)]
        return (frame / 2**30).round(3)

    def model_states(self) -> dict[str, int]:
        """Model-state bytes per rank in ZeRO's sense (see ``virtual.model_states``)."""
        out = {
            "params": self.at("params", "after_backward"),
            "gathered": self.at("unsharded_params", "max"),
            "grads": self.at("grads", "after_backward"),
            "optimizer": self.at("optimizer", "after_backward"),
        }
        out["total"] = sum(out.values())
        return out

    def __repr__(self) -> str:
        return f"{self.title}\n{self.gib()!r}\n(GiB on rank 0; .to_frame() for bytes)"

    def _repr_html_(self) -> str:
        inner = self.gib()._repr_html_() or ""
        return f"<p><b>{html.escape(self.title)}</b> (GiB on rank 0)</p>{inner}"
