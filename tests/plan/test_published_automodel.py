"""The bf16 runs of NVIDIA NeMo AutoModel's performance table (DGX-H100) in plan.published: each
row's printed step time against the page's own tokens/s/GPU, the residuals the rows and the
lecture state, and what they show about the two misses (DeepSeek-V3's FP8 row, Qwen3-30B-A3B's
16-GPU FP8 row). Formulas only: no ranks are launched."""

from __future__ import annotations

import pytest

from course_lib.plan import published as PB

QWEN8, DS256, DS1024 = (
    "Qwen3-30B-A3B, 8 H100, bf16",
    "DeepSeek-V3, 256 H100, bf16",
    "DeepSeek-V3, 1,024 H100, bf16",
)
#: (run, GPUs, global batch in sequences, seconds per global step, tokens/s/GPU): the page's rows
PAGE = [
    (QWEN8, 8, 512, 21.773, 12040),
    (DS256, 256, 512, 8.18, 1002),
    (DS1024, 1024, 8192, 37.87, 865),
]


@pytest.fixture(scope="module")
def table():
    return PB.published_table([run for run, *_ in PAGE]).set_index("run")


@pytest.mark.parametrize(("name", "gpus", "gbs", "step", "tokens"), PAGE)
def test_each_row_is_the_page_and_its_tokens_per_gpu_follow_from_its_step(
    name, gpus, gbs, step, tokens
):
    run = PB.RUNS[name]
    assert run.gpus == gpus and run.global_batch_tokens == gbs * 4096
    assert run.printed == {"step_s": step} and run.extra["tokens_per_gpu_s"] == tokens
    # GBS x seq / time / GPUs is the page's tokens/s/GPU, within the rounding of both: the step
    # as printed (half a unit of its last digit either way) and the tokens to a whole number
    half = 0.5 * 10.0 ** -len(str(step).split(".")[1])
    slow, fast = (gbs * 4096 / (step + d) / gpus for d in (half, -half))
    assert slow - 0.5 <= tokens <= fast + 0.5
    assert abs(gbs * 4096 / step / gpus - tokens) < 0.6
    assert PB.reported(run)["reported step_s"] == step
    assert "automodel" in run.source and "Precision: BF16" in run.source
    assert "2025-10-02" in run.source  # the date the page shows
    assert not run.assumptions.fp8 and run.layout.recompute == "full"
    # TE's attention (the configs' te_deepep): flash, with every layer recomputed besides
    assert run.layout.attention == "flash" and "TE" in run.attention_source
    # the page's FSDP column is the data-parallel ranks, its EP carved out of them
    lay = run.layout
    assert lay.dp * lay.pp == gpus and lay.dp == {8: 8, 256: 64, 1024: 256}[gpus]
    assert lay.ep == {8: 8, 256: 64, 1024: 64}[gpus] and lay.tp == lay.cp == 1


def test_the_two_pages_count_model_flops_per_token_alike():
    # Megatron-Bridge's 16-GPU FP8 row: 121 TFLOP/s at 5,275 tokens/s; AutoModel's bf16 row:
    # 277 TFLOP/s at 12,040: the same model FLOPs per token (within 0.5 %), 2.3x the throughput
    bridge, auto = PB.RUNS["Qwen3-30B-A3B, 16 H100"], PB.RUNS[QWEN8]
    assert "MBS 2" in bridge.source and bridge.layout.micro_batch == 2
    assert "121 model TFLOP/s" in bridge.source
    per_token = (121e12 / 5275, auto.extra["model_tflops_per_gpu"] * 1e12 / 12040)
    assert per_token[0] == pytest.approx(per_token[1], rel=0.005)
    assert 12040 / bridge.printed["tokens_per_gpu_s"] == pytest.approx(2.28, abs=0.01)


def test_the_residuals_are_the_ones_stated(table):
    res = table["residual"]
    assert res[QWEN8] == pytest.approx(-0.029, abs=0.005)
    assert res[DS256] == pytest.approx(0.19, abs=0.005)
    assert res[DS1024] == pytest.approx(-0.006, abs=0.005)
    assert (table.loc[[QWEN8, DS256, DS1024], "attention"] == "flash").all()
    assert DS256 in PB.MISSES and not {QWEN8, DS1024} & set(PB.MISSES)
    assert not table.loc[QWEN8, "large"] and not table.loc[QWEN8, "fits"]
    assert QWEN8 in PB.MEMORY_MISSES and table.loc[[DS256, DS1024], "fits"].all()


def test_full_recomputation_with_flash_attention_lies_between_eager_and_no_recomputation():
    """As run (full + flash) each row lies between the eager kernel (scores through memory,
    every layer again: the only 'full' before the kernel could be named, 23-64 % slow) and no
    layer recomputed (flash: 4 % slow to 21 % fast, and no longer fits)."""
    eager = {n: PB.what_if(n, layout={"attention": "eager"})["residual"] for n, *_ in PAGE}
    none = {n: PB.what_if(n, layout={"recompute": "none"}) for n, *_ in PAGE}
    assert eager[QWEN8] == pytest.approx(0.64, abs=0.01)
    assert eager[DS256] == pytest.approx(0.48, abs=0.01)
    assert eager[DS1024] == pytest.approx(0.23, abs=0.01)
    assert none[QWEN8]["residual"] == pytest.approx(-0.21, abs=0.01)
    assert none[DS256]["residual"] == pytest.approx(0.04, abs=0.01)
    assert none[DS1024]["residual"] == pytest.approx(-0.13, abs=0.01)
    for name, *_ in PAGE:
        assert none[name]["residual"] < PB.what_if(name)["residual"] < eager[name]
        assert not none[name]["fits"]  # recomputation is what makes the layout fit
        # with flash, selective recomputation has nothing left to drop: the price of none
        sel = PB.what_if(name, layout={"recompute": "selective"})
        assert sel["predicted step_s"] == none[name]["predicted step_s"]
    # ZeRO-2 (reshard_after_forward=False) or ZeRO-3: the same step, the traffic hides in both
    for name, *_ in PAGE:
        zero3 = PB.what_if(name, layout={"zero": 3})["predicted step_s"]
        assert zero3 == pytest.approx(PB.what_if(name)["predicted step_s"])
    # DeepSeek-V3 at 256 GPUs: 4.2 s of the 9.7 s exposed all-to-alls (the miss's term);
    # hidden behind the other micro-batch's attention (1F1B-overlapped), 11 % fast
    row = PB.as_published(DS256)
    assert row["ep_comm_s"] == pytest.approx(4.2, abs=0.05)
    assert row["step_s"] == pytest.approx(9.74, abs=0.01)
    overlapped = PB.what_if(DS256, ep_schedule="1F1B-overlapped")["residual"]
    assert overlapped == pytest.approx(-0.107, abs=0.005)


def test_the_planner_is_not_fast_on_these_models_in_bf16():
    """What the rows show about the two misses: priced in bf16 as run, neither model comes out
    more than 4 % fast (the planner's 32 % miss on DeepSeek-V3's FP8 row is not in its bf16
    products), and the planner's bf16 price of the 16-GPU Qwen3 layout is within 10 % of what
    AutoModel ran in bf16 (8 % above it)."""
    for name, *_ in PAGE:
        assert PB.what_if(name)["residual"] > -0.04
    assert abs(PB.what_if("DeepSeek-V3", fp8=False)["residual"]) < 0.05
    bridge = PB.RUNS["Qwen3-30B-A3B, 16 H100"]
    bf16 = PB.what_if(bridge, fp8=False)["predicted step_s"]
    tokens = bridge.global_batch_tokens / bf16 / bridge.gpus
    assert tokens / PB.RUNS[QWEN8].extra["tokens_per_gpu_s"] == pytest.approx(1.08, abs=0.01)
    # the run lost 14 % per GPU from 256 to 1,024 GPUs; the planner's rate rises 3 %
    assert 865 / 1002 == pytest.approx(0.86, abs=0.01)
    rate = {
        n: PB.RUNS[n].global_batch_tokens / PB.what_if(n)["predicted step_s"] / PB.RUNS[n].gpus
        for n in (DS256, DS1024)
    }
    assert rate[DS1024] / rate[DS256] == pytest.approx(1.035, abs=0.01)
