"""A 7B and a 70B shape, each one object, through estimate, the planner, the mesh's rank order
(and the 3-D run's checks) and the virtual cluster: nothing re-stated on the way. Then unit 14's
chosen 8-rank plan on real ranks, from its Layout alone."""

from __future__ import annotations

import inspect

import pytest

from course_lib import plan as P
from course_lib import virtual
from course_lib.dims import ParallelDims
from course_lib.measure import estimate as E
from course_lib.parallel import mesh as M
from course_lib.shape import ModelShape
from course_lib.virtual.simulate import check_arguments, simulate_step

CASES = {
    # shape, GPUs, the count the authors publish
    "Llama-2-7B": (8, 6_738_415_616),
    "Llama-2-70B": (64, 68_976_648_192),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def travelled(request):
    name = request.param
    gpus, published = CASES[name]
    shape = P.model(name)  # one object from here on
    result = P.plan(shape, P.cluster("8xH100 + 400G IB", gpus=gpus), global_batch_tokens=4 * 2**20)
    return shape, gpus, published, result


def _checked(**arguments):
    """What simulate_step would check before starting its process (its defaults filled in)."""
    params = inspect.signature(simulate_step).parameters.values()
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return check_arguments(**{**defaults, **arguments})


def test_estimate_takes_the_shape(travelled):
    shape, _, published, _ = travelled
    assert isinstance(shape, ModelShape)
    counted = E.transformer_param_count(**shape.dense())
    assert counted["total"] == published == shape.n_params
    tp = E.tp_comm_bytes_per_layer(shape.seq, 1, shape.hidden, 8)
    assert tp["payload"] == shape.seq * shape.hidden * 2


def test_the_planner_plans_it_and_its_layout_is_the_searched_one(travelled):
    shape, gpus, _, result = travelled
    layout = P.layout_of(result)
    assert result.attrs["inputs"]["model"] is shape
    assert layout.gpus == gpus and layout.dims.world_size == gpus
    again = P.evaluate(
        shape, result.attrs["inputs"]["cluster"], layout, global_batch_tokens=4 * 2**20
    )
    assert again["step_s"] == pytest.approx(result.iloc[0]["step_s"], rel=1e-12)
    with pytest.raises(
        ValueError, match=f"rank = {len(result) + 1}: expected an int in 1..{len(result)}"
    ):
        P.layout_of(result, len(result) + 1)
    with pytest.raises(TypeError, match="result = 3: expected the DataFrame plan.plan"):
        P.layout_of(3)


def test_the_mesh_lays_the_plan_out_as_the_planner_prices_it(travelled):
    shape, gpus, _, result = travelled
    d = P.layout_of(result).dims
    table = M.layout(dp=d.dp, tp=d.tp, pp=d.pp)  # cp = ep = 1 in these plans
    assert len(table) == gpus and (d.cp, d.ep) == (1, 1)
    for axis in M.DIMS:  # a group's neighbours sit stride(axis) apart, as comm_model.span assumes
        for group in M.rank_groups(axis, dp=d.dp, tp=d.tp, pp=d.pp):
            assert all(b - a == d.stride(axis) for a, b in zip(group, group[1:]))
    tp_group = d.groups("tp")[0]
    assert tp_group == list(range(d.tp)) and d.tp <= 8  # one node's consecutive ranks


def test_the_3d_run_takes_the_layout_and_refuses_what_it_cannot_split():
    from course_lib.plan import three_d

    with pytest.raises(ValueError, match=r"cp = 2: expected 1 \(the 3-D run"):
        three_d.run_3d(P.Layout(dp=1, cp=2))
    with pytest.raises(ValueError, match="pp = 3: expected a divisor of n_layer = 2"):
        three_d.run_3d(ParallelDims(pp=3))  # checked before any rank starts


def test_the_virtual_cluster_takes_the_shape_and_the_layout(travelled):
    shape, gpus, _, _ = travelled
    model = virtual.llama_like(shape)
    assert model.n_params == shape.n_params and model.name == shape.name
    assert model.shape(shape.seq) == shape.shape()  # and back: the same ModelShape
    layout = P.Layout(dp=gpus // 8, tp=8, zero=3, recompute="selective")
    spec = _checked(**virtual.layout_arguments(shape, layout, timeout=60))
    assert (spec.world_size, spec.tp, spec.strategy) == (gpus, 8, "tp" if gpus == 8 else "fsdp+tp")
    assert (spec.seq, spec.batch, spec.checkpoint, spec.vocab) == (4096, 1, "selective", 32000)
    fsdp = _checked(**virtual.layout_arguments(shape, ParallelDims(dp=gpus), zero=2))
    assert (fsdp.strategy, fsdp.world_size, fsdp.tp, fsdp.checkpoint) == (
        "fsdp_no_reshard",
        gpus,
        1,
        None,
    )


def test_the_virtual_cluster_refuses_what_it_cannot_lay_out():
    shape = P.model("Llama-2-7B")
    with pytest.raises(ValueError, match=r"pp = 2: expected 1 \(the virtual cluster splits dp, tp"):
        virtual.layout_arguments(shape, P.Layout(dp=4, pp=2))
    with pytest.raises(ValueError, match="zero = 1: expected 0, 2 or 3"):
        virtual.layout_arguments(shape, P.Layout(dp=8, zero=1))
    with pytest.raises(ValueError, match="expected a Llama-shaped model.*bias = True"):
        virtual.llama_like(P.model("GPT-3-175B"))


@pytest.mark.slow  # 8 ranks started on 2 cores: about 20-30 s
def test_unit_14s_chosen_8_rank_plan_runs_on_real_ranks_from_its_layout():
    from course_lib.plan import three_d
    from course_lib.plan.run_layout import run_layout
    from course_lib.units.u14_planning_a_run import run

    r7 = run.plan_run("Llama-2-7B", "8xH100 + 400G IB", gpus=8, global_batch_tokens=4 * 2**20)
    layout = P.layout_of(r7)  # the lecture's top plan: DP 8, ZeRO-3, no recomputation
    assert (layout.gpus, layout.zero) == (8, 3)
    res = run_layout(layout, steps=2)
    par = three_d.parity_3d(res)
    assert par["ok"], par
    assert [r.coords for r in res.ranks] == [(0, d, 0) for d in range(8)]
    assert res.plan_layout == layout and res.dims.world_size == 8
    full = sum(t.numel() for t in res.params.values())
    for r in res.ranks:  # ZeRO-3: each rank keeps its eighth of the parameters (+ padding)
        assert full / 8 <= r.params_numel < full / 8 + 8 * 64
