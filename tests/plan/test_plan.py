"""The planner's mechanics: memory by category counted by hand, the plan and its explanation,
refusals of bad input, uneven stages, the launch command. The published runs are in
test_published.py, the communication terms in test_comm_model.py."""

from __future__ import annotations

import pytest

from course_lib import plan as P

H100 = "8xH100 + 400G IB"
A100 = "8xA100-80GB + 200G IB"


def test_predict_memory_categories_by_hand():
    # Llama-2-7B on 8 GPUs, DDP (ZeRO-0), no recomputation, micro-batch 1, s 4096
    m = P.model("Llama-2-7B")
    mem = P.predict_memory(m, P.Layout(8, 1, 1, 0, "none", 1))
    n = 6_738_415_616
    assert (mem["params"], mem["grads"], mem["optimizer"]) == (2 * n, 2 * n, 12 * n)
    s, h, a, f = 4096, 4096, 32, 11008
    layer = (
        2 * s * h
        + 2 * s * h
        + 4 * s * h
        + 2 * s * h
        + 2 * s * h
        + 4 * s * h
        + 6 * s * f
        + 2 * a * s * s
    )
    assert mem["activations"] == 32 * layer
    assert mem["logits"] == 4 * s * 32000
    assert mem["total"] == sum(mem[k] for k in P.MEMORY_CATEGORIES)
    # ZeRO-3 over 8 shards all three states and keeps two gathered layers
    z3 = P.predict_memory(m, P.Layout(8, 1, 1, 3, "none", 1))
    assert z3["params"] == 2 * n // 8 and z3["optimizer"] == 12 * n // 8
    assert z3["buffers"] == 4 * m.params()["per_layer"]


def test_zero3_gathers_only_a_ranks_own_experts():
    """ZeRO-3 on a MoE: each of the two gathered layers is its dense part over tp and the
    routed experts over tp x ep, the experts a rank computes with; never all of them."""
    mix = P.model("Mixtral-8x7B")  # 8 experts of 3 x 4,096 x 14,336, top 2
    experts = 8 * 3 * 4096 * 14336
    layer = mix.layer_params()
    assert layer["routed"] == experts
    dense = layer["moe"] - experts  # attention, norms, the router
    for dp, tp, ep in ((8, 1, 8), (8, 1, 1), (4, 2, 4), (8, 1, 2)):
        mem = P.predict_memory(mix, P.Layout(dp, tp, 1, 3, "selective", 1, ep=ep))
        assert mem["buffers"] == pytest.approx(2 * 2 * (dense / tp + experts / (tp * ep)))
    # EP 8: one expert a rank, about an eighth of the whole layer's 2 x 2 x 176M bytes
    ep8 = P.predict_memory(mix, P.Layout(8, 1, 1, 3, "selective", 1, ep=8))["buffers"]
    assert ep8 < 0.2 * 2 * 2 * layer["moe"]


def test_plan_seven_b_on_one_node_explains_itself():
    result = P.plan(
        P.model("Llama-2-7B"), P.cluster(H100), global_batch_tokens=4 * 2**20, total_tokens=2e12
    )
    top = result.iloc[0]
    assert top.memory_GB <= 76 and top.tp * top.pp * top.dp == 8
    assert list(result["rank"]) == list(range(1, len(result) + 1))
    assert result["step_s"].is_monotonic_increasing
    text = P.explain(result)
    assert text.startswith("Winner: TP") and "doesn't fit" in text and "+" in text
    # plain DDP of a 7B model needs 112 GB of model state alone: rejected
    rej = result.attrs["rejected"]
    assert not rej[(rej.zero == 0) & (rej.tp == 1) & (rej.pp == 1)].empty


def test_nothing_fits_says_so():
    result = P.plan(P.model("Llama-2-70B"), P.cluster(H100, gpus=1), global_batch_tokens=4 * 2**20)
    assert result.empty and P.explain(result).startswith("Nothing fits")


@pytest.mark.parametrize(
    "layout, kwargs, message",
    [
        (
            P.Layout(8, tp=3),
            {},
            r"tp = 3: expected a divisor of heads = 32 and kv_heads = 32: one of 1, 2, 4, 8, 16, 32",
        ),
        (
            P.Layout(1, pp=5),
            {},
            r"pp = 5: expected a divisor of layers = 32: one of 1, 2, 4, 8, 16, 32",
        ),
        (
            P.Layout(4, pp=4, virtual_stages=3),
            {},
            r"virtual_stages = 3: expected a divisor of the 8 layers",
        ),
        (
            P.Layout(3, tp=8),
            {"global_batch_tokens": 1024 * 4096},
            r"global batch = 1024 sequences: expected a multiple of dp x micro_batch = 3 x 1",
        ),
        (
            P.Layout(4, pp=8, virtual_stages=2),
            {"global_batch_tokens": 16 * 4096},
            r"virtual_stages = 2: expected 1 with 4 micro-batches < pp = 8",
        ),
    ],
)
def test_bad_layouts_are_refused_with_the_valid_choices(layout, kwargs, message):
    with pytest.raises(ValueError, match=message):
        P.check_layout(P.model("Llama-2-7B"), layout, **kwargs)


def test_more_gpus_than_the_cluster_is_refused():
    with pytest.raises(
        ValueError, match=r"dp x tp x pp = 4 x 4 x 1 = 16 GPUs: expected at most the cluster's 8"
    ):
        P.step_time(
            P.model("Llama-2-7B"), P.cluster(H100), P.Layout(4, 4), global_batch_tokens=1024 * 4096
        )
    with pytest.raises(ValueError, match="gpus = 16: expected an int in 1..8"):
        P.plan(P.model("Llama-2-7B"), P.cluster(H100), global_batch_tokens=1024 * 4096, gpus=16)


def test_specs_validate():
    with pytest.raises(ValueError, match="model = 'GPT-5': expected one of Llama-2-7B"):
        P.model("GPT-5")
    with pytest.raises(ValueError, match="zero = 4: expected one of 0, 1, 2, 3"):
        P.Layout(1, zero=4)
    with pytest.raises(ValueError, match="kv_heads = 5: expected a divisor of heads = 32"):
        P.model("Llama-2-7B").replace(kv_heads=5)
    with pytest.raises(ValueError, match="gpus = 12: expected a multiple of gpus_per_node = 8"):
        P.cluster(H100, gpus=12)
    assert P.cluster(H100, gpus=64).nodes == 8
    import dataclasses

    base = P.cluster(H100)
    for field in ("peak_flops", "intra_GBps", "inter_GBps"):  # once ranked at 0.0 utilisation
        with pytest.raises(ValueError) as info:
            dataclasses.replace(base, **{field: float("inf")})
        assert str(info.value) == f"{field} = inf: expected a finite number > 0"


def test_explain_refuses_what_plan_did_not_return():
    import pandas as pd

    for value, shown in ((42, "42"), (None, "None"), (pd.DataFrame({"tp": [1]}), "DataFrame")):
        with pytest.raises(TypeError) as info:
            P.explain(value)
        assert str(info.value) == (
            f"result = {shown}: expected the DataFrame plan.plan() returned "
            "(its attrs hold the inputs)"
        )


def test_uneven_stages_balance_the_output_layer():
    assert P.stage_layers(P.model("BLOOM-176B"), 12, uneven_stages=True) == (6, 4)
    assert P.stage_layers(P.model("Llama-3-405B"), 16, uneven_stages=True) == (8, 6)
    assert P.stage_layers(P.model("Llama-2-7B"), 4) == (8, 8)


def test_this_machine_is_a_one_device_cluster():
    c = P.cluster("this machine")
    assert c.gpus == 1 and c.memory_bytes > 2**30 and c.peak_flops > 1e8


def test_the_plan_gives_the_torchrun_command_that_starts_its_layout():
    import pandas as pd

    from course_lib import cluster
    from course_lib.cluster.runner import _parser

    result = P.plan(
        P.model("Llama-2-70B"),
        P.cluster("8xH100 + 400G IB", gpus=512),
        global_batch_tokens=4096 * 1024,
    )
    best = result.iloc[0]
    cmd = P.launch_command(result, script="train.py")
    nodes = int(best.dp * best.tp * best.pp) // 8
    assert cmd.startswith(f"torchrun --nnodes {nodes} --nproc-per-node 8 --rdzv-backend c10d ")
    assert f"train.py --dp {best.dp} --tp {best.tp} --pp {best.pp} --zero {best.zero}" in cmd
    job = P.launch_command(result, 2, slurm=True)
    assert f"#SBATCH --nodes={nodes}" in job and "srun torchrun" in job
    # an exported 3-D run accepts the layout the planner passes it
    short = P.launch_command(result, script="three_d.py", args=("dp", "tp", "pp"))
    exp = cluster.get("u14.run_3d")
    argv = short.split("three_d.py ", 1)[1].split()
    parsed = vars(_parser(exp, exp.settings()).parse_args(argv))
    assert (int(parsed["dp"]), int(parsed["tp"]), int(parsed["pp"])) == (best.dp, best.tp, best.pp)
    with pytest.raises(ValueError, match="args"):
        P.launch_command(result, args=("dp", "gpus"))
    with pytest.raises(TypeError, match="expected the DataFrame plan.plan"):
        P.launch_command(pd.DataFrame({"dp": [1], "tp": [1], "pp": [1]}))
