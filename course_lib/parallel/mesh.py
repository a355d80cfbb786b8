"""Where each rank sits when data, tensor and pipeline parallelism are combined.

Used in notebooks/09_data_parallelism.ipynb, 10 (ZeRO/FSDP), 11 (tensor parallelism) and 12
(pipeline parallelism), and in their tests. A :class:`Mesh` is made once inside the rank function
and passed explicitly to whatever needs a group; nothing here is stored globally::

    def fn(rank, world_size):
        mesh = Mesh(dp=2, tp=2)                 # 4 ranks: 2 replicas of a 2-way tensor split
        shard = (mesh.dp_rank, mesh.dp)         # which slice of the batch this rank trains on
        dist.all_reduce(grad, group=mesh.group("dp"))   # sum over the replicas only
        ...
    course_lib.launch(fn, 4)

The layout. The ``world_size = pp × dp × tp`` ranks are laid out in a 3-D grid of shape
``(pp, dp, tp)``, in row-major order, so the last dimension varies fastest::

    rank = (pp_rank × dp + dp_rank) × tp + tp_rank

``tp`` is innermost, so the ranks of one tensor-parallel group are consecutive (Megatron-LM's
order; why: ``course_lib.dims``, the one place that computes it, with cp between dp and tp and
ep folded into dp). For dp=2, tp=2, pp=2::

    >>> print(format_layout(dp=2, tp=2, pp=2))
                tp 0  tp 1
    pp 0  dp 0     0     1
    pp 0  dp 1     2     3
    pp 1  dp 0     4     5
    pp 1  dp 1     6     7

A row is a TP group, a column within one ``pp`` block is a DP group ({0, 2}, {1, 3}, ...), and
ranks with the same ``(dp, tp)`` in every block form a PP group ({0, 4}, {1, 5}, ...).

Pure functions (no process group: a notebook prints the grid, a test checks it without ranks):
:func:`check_sizes`, :func:`layout` (rank -> :class:`Coord`), :func:`rank_groups` (every group
along one dimension) and :func:`format_layout`.

:class:`Mesh` is built on ``torch.distributed.device_mesh.init_device_mesh``, which creates one
process group per row along each dimension (every rank takes part in creating all of them, so
every rank must build the same Mesh, in the same order). ``mesh["tp"]`` is the 1-D
``DeviceMesh`` that torch's own APIs take (``fully_shard(mesh=...)``, ``parallelize_module``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch.distributed as dist

from course_lib import validate
from course_lib.dims import AXES, Axis, ParallelDims
from course_lib.runtime.groups import group_info

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DIMS", "Coord", "Mesh", "check_sizes", "layout", "rank_groups", "format_layout"]

#: mesh dimensions, outermost first (the order of the grid and of :class:`Coord`)
DIMS = ("pp", "dp", "tp")
Dim = Literal["pp", "dp", "tp"]


class Coord(NamedTuple):
    """Where one rank sits: its index along each dimension of the mesh."""

    pp: int
    dp: int
    tp: int


def check_sizes(
    *, dp: int = 1, tp: int = 1, pp: int = 1, world_size: int | None = None
) -> dict[str, int]:
    """The sizes as ``{"pp": .., "dp": .., "tp": ..}`` (outermost first), checked.

    Each size must be an int >= 1; when ``world_size`` is given it must equal their product.

    Raises:
        TypeError / ValueError: naming the bad value, e.g.
            ``world_size = 6: expected dp 2 × tp 2 × pp 2 = 8 ranks``.
    """
    dims = ParallelDims(
        pp=validate.count("pp", pp, minimum=1),
        dp=validate.count("dp", dp, minimum=1),
        tp=validate.count("tp", tp, minimum=1),
    )
    if world_size is not None:
        dims.check_world_size(world_size)
    return {d: dims.sizes()[d] for d in DIMS}


def layout(*, dp: int = 1, tp: int = 1, pp: int = 1) -> list[Coord]:
    """The coordinates of every rank: ``layout(...)[rank]`` is the :class:`Coord` of ``rank``."""
    dims = ParallelDims(**check_sizes(dp=dp, tp=tp, pp=pp))
    return [Coord(c.pp, c.dp, c.tp) for c in map(dims.coords, range(dims.world_size))]


def rank_groups(dim: Dim, *, dp: int = 1, tp: int = 1, pp: int = 1) -> list[list[int]]:
    """Every group along ``dim``: the lists of global ranks that differ only in their ``dim``
    coordinate, each ordered by that coordinate; groups ordered by their lowest rank.

    ``rank_groups("tp", dp=2, tp=2) == [[0, 1], [2, 3]]``,
    ``rank_groups("dp", dp=2, tp=2) == [[0, 2], [1, 3]]``.
    """
    dim = validate.choice("dim", dim, DIMS)
    return ParallelDims(**check_sizes(dp=dp, tp=tp, pp=pp)).groups(dim)


def format_layout(*, dp: int = 1, tp: int = 1, pp: int = 1) -> str:
    """The grid as text: one line per (pp, dp) pair, one column per tp index (see the module
    docstring)."""
    table = layout(dp=dp, tp=tp, pp=pp)
    labels = [f"pp {c.pp}  dp {c.dp}" for c in table[::tp]]  # one per row
    left = max(map(len, labels))
    cell = max(len(f"tp {tp - 1}"), len(str(len(table) - 1))) + 2
    lines = [" " * left + "".join(f"tp {t}".rjust(cell) for t in range(tp))]
    for row, label in enumerate(labels):
        lines.append(
            label.ljust(left) + "".join(str(r).rjust(cell) for r in range(row * tp, (row + 1) * tp))
        )
    return "\n".join(line.rstrip() for line in lines)


class Mesh:
    """The grid of ranks (dp × tp × pp, and cp and ep when asked), with one process group per
    dimension for this rank.

    Build it inside every rank (after ``course_lib.launch`` or torchrun has set up the default
    process group), with the same sizes everywhere::

        mesh = Mesh(dp=2, tp=2, pp=1)
        mesh.coords                  # Coord(pp=0, dp=1, tp=0) on rank 2
        mesh.dp_rank, mesh.tp_rank   # 1, 0
        mesh.group("dp")             # the process group of rank 2's DP replicas: ranks [0, 2]
        mesh.ranks("dp")             # [0, 2]
        Mesh(layout)                 # a plan.Layout's ParallelDims (its rank order)

    Args:
        dims: a :class:`~course_lib.dims.ParallelDims` (or anything with a ``.dims`` that is
            one, such as a ``plan.Layout``), instead of the sizes.
        dp, tp, pp, cp, ep: sizes of the data-, tensor-, pipeline-, context- and
            expert-parallel dimensions, ints >= 1 (keyword-only, so the order of the grid cannot
            be mixed up with the order of the arguments); ep divides dp.
        world_size: the number of ranks you expect; checked against the sizes before anything
            starts. By default, the size of the default process group.
        device_type: what ``DeviceMesh`` places its tensors on: "cuda" under NCCL, else "cpu"
            (the default picks from the default group's backend).

    Raises:
        TypeError / ValueError: bad sizes, or sizes whose product is not the world size.
        RuntimeError: no default process group (build the Mesh inside a rank).
    """

    def __init__(
        self,
        dims: Any = None,
        /,
        *,
        dp: int = 1,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
        world_size: int | None = None,
        device_type: str | None = None,
    ) -> None:
        self.dims = _dims(dims, dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep))
        self.sizes = dict(zip(self.dims.mesh_axes(), self.dims.mesh_shape()))
        if world_size is not None:
            self.dims.check_world_size(world_size)
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "Mesh needs the default process group: build it inside a rank "
                "started by course_lib.launch (or torchrun); layout() and "
                "format_layout() give the grid without ranks"
            )
        actual = group_info(needs="Mesh").world_size
        if world_size is not None and world_size != actual:
            raise ValueError(
                f"world_size = {world_size}: expected the {actual} ranks of the "
                "default process group"
            )
        self.dims.check_world_size(actual)
        if device_type is None:
            from course_lib.runtime.device import rank_device

            device_type = rank_device().type
        # imported here: torch.distributed.device_mesh pulls in DTensor machinery
        from torch.distributed.device_mesh import init_device_mesh

        self.device_mesh = init_device_mesh(
            device_type, self.dims.mesh_shape(), mesh_dim_names=self.dims.mesh_axes()
        )
        self.rank = group_info().rank
        self.world_size = actual
        self.at = self.dims.coords(self.rank)  # every axis, cp and ep included
        self.coords = Coord(self.at.pp, self.at.dp, self.at.tp)
        assert list(self.device_mesh.get_coordinate() or ()) == [
            getattr(self.at, a) for a in self.dims.mesh_axes()
        ], "torch's device mesh lays the grid out as ParallelDims does"
        self._ep = _ep_groups(self.dims, self.rank) if self.dims.ep > 1 else None

    def size(self, dim: Axis) -> int:
        """Number of ranks along ``dim`` ("pp", "dp", "tp", "cp" or "ep")."""
        return self.dims.size(validate.choice("dim", dim, AXES))

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def cp(self) -> int:
        return self.dims.cp

    @property
    def ep(self) -> int:
        return self.dims.ep

    # ---- where am I ----------------------------------------------------------------------
    def coord(self, dim: Axis) -> int:
        """This rank's index along ``dim``: its rank inside ``group(dim)``."""
        return int(getattr(self.at, validate.choice("dim", dim, AXES)))

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def tp_rank(self) -> int:
        return self.coords.tp

    @property
    def pp_rank(self) -> int:
        return self.coords.pp

    @property
    def cp_rank(self) -> int:
        return self.at.cp

    @property
    def ep_rank(self) -> int:
        return self.at.ep

    def group(self, dim: Axis) -> dist.ProcessGroup:
        """The process group of the ranks that share this rank's coordinates except along
        ``dim`` (pass it as ``group=`` to any collective)."""
        dim = validate.choice("dim", dim, AXES)
        if dim in (self.device_mesh.mesh_dim_names or ()):
            return self.device_mesh.get_group(dim)
        if dim == "ep" and self._ep is not None:
            return self._ep
        raise ValueError(f"dim = {dim!r}: expected an axis of this mesh ({dim} = 1 has no group)")

    def ranks(self, dim: Axis) -> list[int]:
        """The global ranks of ``group(dim)``, ordered by their coordinate along ``dim``."""
        return self.dims.group_of(self.rank, validate.choice("dim", dim, AXES))

    def __getitem__(self, dim: Axis) -> DeviceMesh:
        """The 1-D ``DeviceMesh`` along ``dim`` (pp, dp, tp; cp when cp > 1), for torch APIs."""
        names = self.device_mesh.mesh_dim_names or ()
        return self.device_mesh[validate.choice("dim", dim, names)]

    def __repr__(self) -> str:
        extra = "".join(f", {a}={self.size(a)}" for a in ("cp", "ep") if self.size(a) > 1)
        where = "".join(f", {a}={self.coord(a)}" for a in ("cp", "ep") if self.size(a) > 1)
        return (
            f"Mesh(dp={self.dp}, tp={self.tp}, pp={self.pp}{extra}; rank {self.rank} at "
            f"pp={self.pp_rank}, dp={self.dp_rank}, tp={self.tp_rank}{where})"
        )


def _dims(dims: Any, sizes: dict[str, int]) -> ParallelDims:
    """The ParallelDims a Mesh is built from: ``dims`` (or its ``.dims``) or the sizes."""
    if dims is not None:
        if any(v != 1 for v in sizes.values()):
            raise ValueError(f"dims = {dims}: expected the sizes once, as dims or as dp=, tp=, ...")
        return ParallelDims.of(dims)
    for name in ("cp", "ep"):
        validate.count(name, sizes[name], minimum=1)
    check_sizes(dp=sizes["dp"], tp=sizes["tp"], pp=sizes["pp"])  # the 3-D messages first
    return ParallelDims(**sizes)


def _ep_groups(dims: ParallelDims, rank: int) -> dist.ProcessGroup:
    """Every expert-parallel group (each rank takes part in making all of them); this rank's."""
    mine: dist.ProcessGroup | None = None
    for ranks in dims.groups("ep"):
        group: dist.ProcessGroup = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    assert mine is not None
    return mine
