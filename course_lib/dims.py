"""How a run splits its ranks: :class:`ParallelDims` (dp, tp, pp, cp, ep, virtual stages), and
the one place where a rank's position along each axis is computed (rank order).

Rank order is Megatron-LM's (Shoeybi et al. 2019, arXiv:1909.08053; Narayanan et al. 2021,
arXiv:2104.04473): the ``world_size = pp × dp × cp × tp`` ranks form a grid of shape
``(pp, dp, cp, tp)`` in row-major order, tp innermost::

    rank = ((pp_rank × dp + dp_rank) × cp + cp_rank) × tp + tp_rank

so a tensor-parallel group (talking at every layer) is consecutive ranks inside a node, context
parallelism (every layer, K and V) sits next to it, data parallelism (once a step) and the
pipeline (neighbours only) cross the slower links. Expert parallelism is carved out of the dp
ranks, as Megatron carves its expert-parallel group out of the data-parallel one: the ep ranks of
an expert group are ``ep`` consecutive dp ranks (ep divides dp), and the ranks that hold the same
expert are the dp ranks ``ep`` apart. With ``etp`` >= 1 the experts are folded over the tp x cp x
dp ranks of a stage instead (Megatron-Core's MoE "parallel folding", Liu et al. 2025,
arXiv:2504.14960): those ranks, in rank order, are regrouped as (expert-data, ep, etp), etp
innermost, so ep x etp divides tp x cp x dp and ep may exceed dp (Qwen3-235B-A22B: EP 32 on TP 2
x DP 16).

``parallel.mesh.Mesh`` (real ranks), ``plan.Layout`` (the planner, which prices each group on the
links its stride crosses) and the virtual cluster's device mesh all read rank order from here.
Pure Python (no torch): a notebook, a planner and a test use it without ranks. Introduced in
notebooks/09_data_parallelism.ipynb (dp x tp x pp) and notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from course_lib import validate as _v

__all__ = ["Axis", "AXES", "RANK_ORDER", "Coords", "ParallelDims"]

#: the axes of a layout: data, tensor, pipeline, context and expert parallelism
Axis = Literal["dp", "tp", "pp", "cp", "ep"]
AXES: tuple[Axis, ...] = ("dp", "tp", "pp", "cp", "ep")
#: the grid's axes, outermost first (ep is not one: it folds into dp)
RANK_ORDER: tuple[Axis, ...] = ("pp", "dp", "cp", "tp")


class Coords(NamedTuple):
    """Where one rank sits: its index along each axis (ep: its place in its expert group)."""

    pp: int
    dp: int
    cp: int
    tp: int
    ep: int


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of a layout's axes, checked: each an int >= 1, ``ep`` a divisor of ``dp``
    (or, folded with ``etp`` >= 1, ep x etp a divisor of tp x cp x dp), ``virtual_stages``
    (interleaved pipeline chunks per rank) >= 1. ``world_size`` is dp x tp x pp x cp (ep
    reuses dp's ranks, or a stage's)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    virtual_stages: int = 1
    etp: int = 0  # expert tensor parallelism of folded experts (0: ep carved out of dp)

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "cp", "ep", "virtual_stages"):
            object.__setattr__(self, f, _v.count(f, getattr(self, f), minimum=1))
        if _v.count("etp", self.etp, minimum=0):
            stage = self.tp * self.cp * self.dp
            if stage % (self.ep * self.etp):
                raise ValueError(
                    f"ep = {self.ep}, etp = {self.etp}: expected ep x etp to divide tp x cp x "
                    f"dp = {stage} (the ranks of a stage the experts fold over)"
                )
        elif self.dp % self.ep:
            ok = [d for d in range(1, self.dp + 1) if self.dp % d == 0]
            raise ValueError(
                f"ep = {self.ep}: expected a divisor of dp = {self.dp}: one of "
                f"{', '.join(map(str, ok))}"
            )

    @classmethod
    def of(cls, value: Any, name: str = "dims") -> ParallelDims:
        """``value`` if it is a ParallelDims, else its ``.dims`` (a ``plan.Layout``'s)."""
        found = getattr(value, "dims", value)
        if not isinstance(found, ParallelDims):
            raise TypeError(
                f"{name} = {_v.describe(value)}: expected a course_lib.dims.ParallelDims or "
                "a plan.Layout"
            )
        return found

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def size(self, axis: Axis) -> int:
        """Ranks along ``axis``."""
        return int(getattr(self, _v.choice("axis", axis, AXES)))

    def sizes(self) -> dict[str, int]:
        """``{"pp": .., "dp": .., "cp": .., "tp": ..}``: the grid, outermost first."""
        return {a: self.size(a) for a in RANK_ORDER}

    def check_world_size(self, world_size: int) -> int:
        """``world_size`` if it is dp x tp x pp x cp, else a ValueError naming the product."""
        n = _v.count("world_size", world_size, minimum=1)
        if n != self.world_size:
            cp = f" × cp {self.cp}" if self.cp > 1 else ""
            raise ValueError(
                f"world_size = {n}: expected dp {self.dp} × tp {self.tp} × pp {self.pp}{cp} = "
                f"{self.world_size} ranks"
            )
        return n

    def stride(self, axis: Axis) -> int:
        """Distance in ranks between neighbours along ``axis`` (tp 1, cp tp, dp tp cp, pp
        tp cp dp; ep, the innermost part of dp, that of dp; folded, etp)."""
        axis = _v.choice("axis", axis, AXES)
        if axis == "ep" and self.etp:
            return self.etp
        inner = RANK_ORDER[RANK_ORDER.index("dp" if axis == "ep" else axis) + 1 :]
        return math.prod(self.size(a) for a in inner)

    def coords(self, rank: int) -> Coords:
        """The position of ``rank`` along every axis."""
        r = _v.count("rank", rank, minimum=0, maximum=self.world_size - 1)
        at = {a: r // self.stride(a) % self.size(a) for a in RANK_ORDER}
        ep = r // self.etp % self.ep if self.etp else at["dp"] % self.ep
        return Coords(at["pp"], at["dp"], at["cp"], at["tp"], ep)

    def rank(self, *, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        """The global rank at these coordinates (the inverse of :meth:`coords`)."""
        at: dict[Axis, int] = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        for a, v in at.items():
            _v.count(a, v, minimum=0, maximum=self.size(a) - 1)
        return sum(v * self.stride(a) for a, v in at.items())

    def groups(self, axis: Axis) -> list[list[int]]:
        """Every group along ``axis``: the ranks that differ only in their ``axis`` coordinate,
        each ordered by it, groups ordered by their lowest rank. ``ep``: the ep consecutive dp
        ranks of one expert group."""
        axis = _v.choice("axis", axis, AXES)
        out: dict[tuple[int, ...], list[int]] = {}
        stage = self.tp * self.cp * self.dp
        for r in range(self.world_size):
            c = self.coords(r)._asdict()
            if axis == "ep" and self.etp:  # folded: the stage, its expert-data and etp place
                key = (r // stage, r % stage // (self.ep * self.etp), r % self.etp)
                out.setdefault(key, []).append(r)
                continue
            if axis == "ep":
                c["dp"] //= self.ep  # the expert group, not the place in it
            key = tuple(v for a, v in c.items() if a not in (axis, "ep"))
            out.setdefault(key, []).append(r)
        return sorted(out.values())

    def group_of(self, rank: int, axis: Axis) -> list[int]:
        """The group along ``axis`` that ``rank`` belongs to."""
        return next(g for g in self.groups(axis) if rank in g)

    def mesh_axes(self, keep: tuple[str, ...] = ("pp", "dp", "tp")) -> tuple[Axis, ...]:
        """Names of a device mesh's dimensions, outermost first: the axes in ``keep`` and every
        other grid axis larger than 1 (``torch.distributed.device_mesh.init_device_mesh``)."""
        return tuple(a for a in RANK_ORDER if a in keep or self.size(a) > 1)

    def mesh_shape(self, keep: tuple[str, ...] = ("pp", "dp", "tp")) -> tuple[int, ...]:
        """The sizes of :meth:`mesh_axes`, in the same order."""
        return tuple(self.size(a) for a in self.mesh_axes(keep))

    def require(self, axes: tuple[Axis, ...], user: str) -> ParallelDims:
        """``self`` if every axis outside ``axes`` (and virtual_stages) is 1, else a ValueError
        saying what ``user`` (e.g. "the 3-D run") cannot split."""
        for a in AXES:
            if a not in axes and self.size(a) > 1:
                raise ValueError(
                    f"{a} = {self.size(a)}: expected 1 ({user} splits {', '.join(axes)} only)"
                )
        if self.virtual_stages > 1:
            raise ValueError(
                f"virtual_stages = {self.virtual_stages}: expected 1 ({user} does not "
                "interleave pipeline stages)"
            )
        return self

    def replace(self, **changes: int) -> ParallelDims:
        return dataclasses.replace(self, **changes)
