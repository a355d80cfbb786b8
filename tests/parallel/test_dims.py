"""course_lib.dims.ParallelDims: rank order computed in one place, checked by hand, and read by
the pure mesh layout, the planner's strides, ``Mesh`` on real ranks (cp and ep included) and the
virtual cluster's device mesh."""

from __future__ import annotations

import itertools
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import course_lib
from course_lib import plan as P
from course_lib.dims import ParallelDims
from course_lib.parallel import mesh as M

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.timeout(120)


def test_rank_order_by_hand():
    d = ParallelDims(dp=2, tp=2, pp=2, cp=2, ep=2)
    assert d.world_size == 16 and d.sizes() == {"pp": 2, "dp": 2, "cp": 2, "tp": 2}
    # rank = ((pp * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
    assert d.coords(13) == (1, 1, 0, 1, 1)  # 13 = ((1*2 + 1)*2 + 0)*2 + 1
    assert d.rank(pp=1, dp=1, cp=0, tp=1) == 13
    assert [d.stride(a) for a in ("tp", "cp", "dp", "ep", "pp")] == [1, 2, 4, 4, 8]
    assert d.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert d.groups("cp")[:2] == [[0, 2], [1, 3]]
    assert d.groups("dp")[:2] == [[0, 4], [1, 5]]
    assert d.groups("pp")[0] == [0, 8]
    e = ParallelDims(dp=4, ep=2)  # the expert groups: consecutive dp ranks
    assert e.groups("ep") == [[0, 1], [2, 3]] and e.groups("dp") == [[0, 1, 2, 3]]
    assert [e.coords(r).ep for r in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize("dp, tp, pp", [(2, 2, 2), (1, 4, 2), (3, 1, 2), (2, 3, 1)])
def test_the_mesh_functions_read_rank_order_from_parallel_dims(dp, tp, pp):
    d = ParallelDims(dp=dp, tp=tp, pp=pp)
    table = M.layout(dp=dp, tp=tp, pp=pp)
    assert [(c.pp, c.dp, c.tp) for c in table] == [
        (c.pp, c.dp, c.tp) for c in map(d.coords, range(d.world_size))
    ]
    for dim in M.DIMS:
        assert M.rank_groups(dim, dp=dp, tp=tp, pp=pp) == d.groups(dim)
    for r in range(d.world_size):  # every rank once, at the place the coordinates say
        assert d.rank(**{k: v for k, v in d.coords(r)._asdict().items() if k != "ep"}) == r


def test_every_group_partitions_the_ranks():
    for sizes in itertools.product((1, 2, 3), repeat=4):
        dp, tp, pp, cp = sizes
        d = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp)
        for axis in ("dp", "tp", "pp", "cp", "ep"):
            groups = d.groups(axis)
            assert sorted(r for g in groups for r in g) == list(range(d.world_size))
            assert all(len(g) == d.size(axis) for g in groups)


def test_the_layout_holds_one_and_the_planner_prices_its_strides():
    layout = P.Layout(dp=4, tp=8, pp=2, cp=2, ep=2, virtual_stages=2)
    assert layout.dims == ParallelDims(dp=4, tp=8, pp=2, cp=2, ep=2, virtual_stages=2)
    assert layout.gpus == layout.dims.world_size == 128
    assert P.Layout.from_dims(layout.dims, zero=3) == P.Layout(
        4, 8, 2, 3, cp=2, ep=2, virtual_stages=2
    )
    assert layout.dims.stride("pp") == layout.tp * layout.cp * layout.dp  # p2p_s's "inner"


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(dp=0), ValueError, "dp = 0: expected an int >= 1"),
        (dict(cp=True), TypeError, "cp = True: expected an int, not a bool"),
        (dict(dp=6, ep=4), ValueError, "ep = 4: expected a divisor of dp = 6: one of 1, 2, 3, 6"),
        (dict(virtual_stages=0), ValueError, "virtual_stages = 0: expected an int >= 1"),
    ],
)
def test_bad_dims_are_refused_naming_the_value(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ParallelDims(**kwargs)
    with pytest.raises(exc, match=words):
        P.Layout(**{"dp": 1, **kwargs})


def test_what_a_run_cannot_split_is_named():
    with pytest.raises(ValueError, match=r"cp = 2: expected 1 \(the 3-D run splits dp, tp, pp"):
        ParallelDims(cp=2).require(("dp", "tp", "pp"), "the 3-D run")
    with pytest.raises(ValueError, match="virtual_stages = 2: expected 1"):
        ParallelDims(pp=2, virtual_stages=2).require(("dp", "tp", "pp"), "the 3-D run")
    with pytest.raises(ValueError, match="world_size = 6: expected dp 2 × tp 2 × pp 1 × cp 2 = 8"):
        ParallelDims(dp=2, tp=2, cp=2).check_world_size(6)
    with pytest.raises(TypeError, match="dims = 3: expected a course_lib.dims.ParallelDims"):
        ParallelDims.of(3)
    with pytest.raises(ValueError, match="expected the sizes once"):
        M.Mesh(ParallelDims(dp=2), dp=2)


# ---- real ranks -------------------------------------------------------------------------------
def _mesh_report(rank, world_size, dims):
    mesh = M.Mesh(dims)
    seen = {"repr": repr(mesh), "at": tuple(mesh.dims.coords(rank))}
    for axis in ("dp", "tp", "cp", "ep"):
        if mesh.size(axis) == 1:
            continue
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=mesh.group(axis))  # the sum of the ranks of my group
        seen[axis] = (mesh.ranks(axis), t.item(), mesh.coord(axis))
    return seen


@pytest.mark.slow  # 4 ranks started on 2 cores: about 5-10 s
def test_a_mesh_with_context_and_expert_parallelism_on_real_ranks():
    dims = ParallelDims(dp=2, cp=2, ep=2)  # 4 ranks: (dp, cp), ep = the 2 dp ranks
    reports = course_lib.launch(_mesh_report, 4, dims, timeout=60)
    for rank, seen in enumerate(reports):
        assert seen["at"] == tuple(dims.coords(rank))
        for axis in ("dp", "cp", "ep"):
            group = dims.group_of(rank, axis)
            assert seen[axis] == (group, float(sum(group)), group.index(rank))
    assert (
        reports[3]["repr"]
        == "Mesh(dp=2, tp=1, pp=1, cp=2, ep=2; rank 3 at pp=0, dp=1, tp=0, cp=1, ep=1)"
    )
