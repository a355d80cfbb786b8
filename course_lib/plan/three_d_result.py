"""What the 3-D run returns: :class:`RankRun3D` (what one rank measured) and :class:`Run3D` (the
run: every rank, the loss per step, the full parameters after training, the settings), each a
frozen dataclass; ``run.to_frame()`` is one row per rank. Read by ``three_d_report`` (parity,
memory and traffic tables). Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from course_lib.dims import ParallelDims
from course_lib.models import GPTConfig

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from course_lib.plan.specs import Layout

__all__ = ["RankRun3D", "Run3D"]

#: CommMeter's summary keys a rank's row of ``Run3D.to_frame()`` carries
_SENT = ("p2p_bytes_sent", "model_bytes_sent", "wire_bytes_sent")


@dataclass(frozen=True)
class RankRun3D:
    """What one rank of a 3-D (or ZeRO) run measured.

    ``coords``: (pp, dp, tp) of the rank; ``losses``: the step losses (None off the last
    pipeline stage); ``memory``: MemoryMeter's params / grads / optimizer bytes at the end;
    ``peak_bytes``: its peak; ``params_numel``: parameter elements the rank holds;
    ``buffer_bytes``: module buffers (MemoryMeter counts them as params); ``comm``: CommMeter's
    summary (model and wire bytes sent, ...); ``calls``: collective op -> calls; ``params``: the
    rank's full (tp-gathered) stage parameters under the unsplit model's names, on tp rank 0
    (None on the others).
    """

    rank: int
    coords: tuple[int, int, int]
    losses: tuple[float | None, ...]
    memory: Mapping[str, int]
    peak_bytes: int
    params_numel: int
    buffer_bytes: int
    comm: Mapping[str, Any]
    calls: Mapping[str, int]
    params: Mapping[str, torch.Tensor] | None

    @classmethod
    def measured(
        cls,
        rank: int,
        coords: Any,
        losses: Sequence[float | None],
        mem: Any,
        module: torch.nn.Module,
        comm: Any,
        params: Mapping[str, torch.Tensor] | None,
    ) -> RankRun3D:
        """A rank's row from what it measured: ``coords`` (a mesh's, with pp, dp, tp), the
        MemoryMeter ``mem`` and CommMeter ``comm`` it ran under, the ``module`` it trained."""
        return cls(
            rank=rank,
            coords=(coords.pp, coords.dp, coords.tp),
            losses=tuple(losses),
            memory={k: (mem.end_breakdown or {})[k] for k in ("params", "grads", "optimizer")},
            peak_bytes=mem.peak_bytes,
            params_numel=sum(p.numel() for p in module.parameters()),
            buffer_bytes=sum(b.numel() * b.element_size() for b in module.buffers()),
            comm=comm.summary(),
            calls=comm.calls,
            params=params,
        )

    def as_dict(self) -> dict[str, object]:
        """The rank's dict as ``run_3d`` returned it before its result was typed (losses a
        list); what the exported cluster experiment stores."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["losses"] = list(self.losses)
        return out


@dataclass(frozen=True)
class Run3D:
    """A training run of the tiny GPT on dp × tp × pp ranks (:func:`three_d.run_3d`).

    ``ranks``: one :class:`RankRun3D` per rank, by rank; ``losses``: the loss of every step
    (mean over the dp replicas, from the last stage); ``params``: the full parameters after
    training, reassembled from the shards; ``dims``: the layout run; ``config``: the model; the
    training settings ``steps``, ``batch`` (sequences per step, all replicas), ``microbatches``,
    ``lr``, ``seed``; ``plan_layout``: the planner's ``Layout`` when the run came from one
    (``plan.run_layout``), else None.
    """

    ranks: tuple[RankRun3D, ...]
    losses: tuple[float, ...]
    params: Mapping[str, torch.Tensor]
    dims: ParallelDims
    config: GPTConfig
    steps: int
    batch: int
    microbatches: int
    lr: float
    seed: int
    plan_layout: Layout | None = None

    def to_frame(self) -> pd.DataFrame:
        """One row per rank: rank, pp, dp, tp (its coordinates), params / grads / optimizer
        (bytes at the end), peak_bytes, params_numel, buffer_bytes, the collective calls
        (all_reduce, send, recv) and the bytes it sent (p2p, model and wire)."""
        import pandas as pd

        rows = []
        for r in self.ranks:
            pp, dp, tp = r.coords
            row: dict[str, object] = {"rank": r.rank, "pp": pp, "dp": dp, "tp": tp}
            row.update({k: r.memory[k] for k in ("params", "grads", "optimizer")})
            row.update(peak_bytes=r.peak_bytes, params_numel=r.params_numel)
            row["buffer_bytes"] = r.buffer_bytes
            row.update(
                all_reduce=r.calls.get("all_reduce", 0),
                send=r.calls.get("isend", 0),
                recv=r.calls.get("recv", 0),
            )
            row.update({k: r.comm[k] for k in _SENT})
            rows.append(row)
        return pd.DataFrame(rows)

    def as_dict(self) -> dict[str, object]:
        """The run as the dict ``run_3d`` returned before its result was typed: ranks (their
        dicts), losses (a list), params, layout ({dp, tp, pp}), config, setup (steps, batch,
        microbatches, lr, seed). What the exported cluster experiment ``u14.run_3d`` stores,
        so a results file reads as before."""
        return {
            "ranks": [r.as_dict() for r in self.ranks],
            "losses": list(self.losses),
            "params": self.params,
            "layout": dict(dp=self.dims.dp, tp=self.dims.tp, pp=self.dims.pp),
            "config": self.config,
            "setup": dict(
                steps=self.steps,
                batch=self.batch,
                microbatches=self.microbatches,
                lr=self.lr,
                seed=self.seed,
            ),
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Run3D:
        """The run from its :meth:`as_dict` form (e.g. a results file's value)."""
        ranks = tuple(
            RankRun3D(**{**r, "losses": tuple(r["losses"]), "coords": tuple(r["coords"])})
            for r in value["ranks"]
        )
        lay, s = value["layout"], value["setup"]
        return cls(
            ranks=ranks,
            losses=tuple(value["losses"]),
            params=value["params"],
            dims=ParallelDims(dp=lay["dp"], tp=lay["tp"], pp=lay["pp"]),
            config=value["config"],
            **s,
        )
