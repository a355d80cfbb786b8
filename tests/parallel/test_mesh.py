"""course_lib.parallel.mesh: the pure layout without ranks, then real meshes on 1, 2 and 4 ranks.

Each world size is launched once; the rank function builds every mesh shape that fits and
reports what it sees (coordinates, group ranks, an all-reduce of the global ranks over each
group). The parent checks those reports against the pure layout functions.
"""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
import torch
import torch.distributed as dist

import course_lib
from course_lib.parallel import mesh as M

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.timeout(120)


def _shapes(world_size):
    """Every (dp, tp, pp) whose product is world_size."""
    return [
        (dp, tp, world_size // (dp * tp))
        for dp in range(1, world_size + 1)
        for tp in range(1, world_size + 1)
        if world_size % (dp * tp) == 0
    ]


# ---- pure layout ---------------------------------------------------------------------------
def test_layout_of_8_ranks_puts_tp_innermost_and_pp_outermost():
    table = M.layout(dp=2, tp=2, pp=2)
    assert table == [M.Coord(pp=r // 4, dp=r // 2 % 2, tp=r % 2) for r in range(8)]
    assert table[5] == M.Coord(pp=1, dp=0, tp=1)
    assert M.rank_groups("tp", dp=2, tp=2, pp=2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert M.rank_groups("dp", dp=2, tp=2, pp=2) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert M.rank_groups("pp", dp=2, tp=2, pp=2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert M.format_layout(dp=2, tp=2, pp=2).splitlines() == [
        "            tp 0  tp 1",
        "pp 0  dp 0     0     1",
        "pp 0  dp 1     2     3",
        "pp 1  dp 0     4     5",
        "pp 1  dp 1     6     7",
    ]


@pytest.mark.parametrize("dp, tp, pp", _shapes(8) + [(3, 2, 1), (1, 3, 2)])
def test_layout_is_a_bijection_and_groups_partition_the_ranks(dp, tp, pp):
    table = M.layout(dp=dp, tp=tp, pp=pp)
    world = dp * tp * pp
    assert len(set(table)) == world  # every coordinate once
    assert all(0 <= c.pp < pp and 0 <= c.dp < dp and 0 <= c.tp < tp for c in table)
    # row-major over (pp, dp, tp), which is what init_device_mesh does with arange(world)
    grid = np.arange(world).reshape(pp, dp, tp)
    assert all(grid[c.pp, c.dp, c.tp] == r for r, c in enumerate(table))
    for axis, dim in enumerate(M.DIMS):
        groups = M.rank_groups(dim, dp=dp, tp=tp, pp=pp)
        size = (pp, dp, tp)[axis]
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert len(groups) == world // size and all(len(g) == size for g in groups)
        for g in groups:  # members differ only along `dim`, ordered by it
            assert [getattr(table[r], dim) for r in g] == list(range(size))
            others = {tuple(v for d, v in table[r]._asdict().items() if d != dim) for r in g}
            assert len(others) == 1


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (
            dict(dp=2, tp=2, pp=2, world_size=6),
            ValueError,
            "world_size = 6: expected dp 2 × tp 2 × pp 2 = 8 ranks",
        ),
        (dict(dp=0), ValueError, "dp = 0: expected an int >= 1"),
        (dict(tp=-2), ValueError, "tp = -2: expected an int >= 1"),
        (dict(pp=1.5), TypeError, "pp = 1.5: expected an int"),
        (dict(dp=True), TypeError, "dp = True: expected an int, not a bool"),
        (dict(tp="2"), TypeError, "tp = '2': expected an int"),
        (dict(world_size=0), ValueError, "world_size = 0: expected an int >= 1"),
    ],
)
def test_bad_sizes_are_refused_naming_the_values(kwargs, exc, words):
    with pytest.raises(exc) as info:
        M.check_sizes(**kwargs)
    assert words in str(info.value)
    with pytest.raises(exc):  # the Mesh checks before it looks for a process group
        M.Mesh(**kwargs)


def test_sizes_accept_numpy_ints_and_bad_dims_are_named():
    assert M.check_sizes(dp=np.int64(2), tp=2.0) == {"pp": 1, "dp": 2, "tp": 2}
    with pytest.raises(ValueError, match="dim = 'ep': expected one of pp, dp, tp"):
        M.rank_groups("ep", dp=2)


def test_mesh_outside_a_process_group_says_where_to_build_it():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="inside a rank started by course_lib.launch"):
        M.Mesh(dp=1)


# ---- real meshes ---------------------------------------------------------------------------
def _inspect_meshes(rank, world_size, shapes):
    reports = {}
    for dp, tp, pp in shapes:
        mesh = M.Mesh(dp=dp, tp=tp, pp=pp, world_size=world_size)
        seen = {
            "coords": tuple(mesh.coords),
            "repr": repr(mesh),
            "props": (mesh.dp, mesh.tp, mesh.pp, mesh.dp_rank, mesh.tp_rank, mesh.pp_rank),
        }
        for dim in M.DIMS:
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=mesh.group(dim))  # the sum of the ranks of my group
            group = mesh.group(dim)
            seen[dim] = dict(
                sum=t.item(),
                ranks=mesh.ranks(dim),
                coord=mesh.coord(dim),
                size=mesh.size(dim),
                group_size=dist.get_world_size(group),
                group_rank=dist.get_rank(group),
                pg_ranks=dist.get_process_group_ranks(group),
                sub_mesh=mesh[dim].mesh.tolist(),
            )
        reports[(dp, tp, pp)] = seen
    errors = []
    for bad in [dict(dp=world_size + 1), dict(dp=world_size + 1, world_size=world_size + 1)]:
        try:
            M.Mesh(**bad)
        except ValueError as exc:
            errors.append(str(exc))
    return reports, errors


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda w: f"world{w}")
def launched(request):
    world_size = request.param
    shapes = _shapes(world_size)
    return world_size, shapes, course_lib.launch(_inspect_meshes, world_size, shapes, timeout=60)


def test_each_rank_sits_where_the_pure_layout_says(launched):
    world_size, shapes, results = launched
    for dp, tp, pp in shapes:
        table = M.layout(dp=dp, tp=tp, pp=pp)
        for rank, (reports, _) in enumerate(results):
            seen = reports[(dp, tp, pp)]
            c = table[rank]
            assert seen["coords"] == tuple(c)
            assert seen["props"] == (dp, tp, pp, c.dp, c.tp, c.pp)
            assert seen["repr"] == (
                f"Mesh(dp={dp}, tp={tp}, pp={pp}; rank {rank} at pp={c.pp}, dp={c.dp}, tp={c.tp})"
            )


def test_each_group_holds_exactly_the_expected_ranks(launched):
    world_size, shapes, results = launched
    for dp, tp, pp in shapes:
        for dim in M.DIMS:
            groups = M.rank_groups(dim, dp=dp, tp=tp, pp=pp)
            for rank, (reports, _) in enumerate(results):
                mine = next(g for g in groups if rank in g)
                seen = reports[(dp, tp, pp)][dim]
                assert seen["ranks"] == seen["pg_ranks"] == seen["sub_mesh"] == mine
                assert seen["sum"] == float(sum(mine))  # the all-reduce summed exactly these
                assert seen["size"] == seen["group_size"] == len(mine)
                assert seen["coord"] == seen["group_rank"] == mine.index(rank)
                assert seen["coord"] == getattr(M.layout(dp=dp, tp=tp, pp=pp)[rank], dim)


def test_a_mesh_that_does_not_fit_the_world_is_refused_in_the_ranks(launched):
    world_size, _, results = launched
    for _, errors in results:
        assert errors == [
            f"world_size = {world_size}: expected dp {world_size + 1} × tp 1 × pp 1 = "
            f"{world_size + 1} ranks",
            f"world_size = {world_size + 1}: expected the {world_size} ranks of the default "
            "process group",
        ]
