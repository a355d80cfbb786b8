"""The attention kernel as a stated choice of the layout (``Layout.attention``: flash or eager),
independent of recomputation: one layer's FLOPs run again, the bytes its products and kernels
move, and the activations it keeps, under each of the six combinations, against hand-derived
values; None keeps the pairing the planner searches (flash with selective, eager with none and
full), priced exactly as a layout that names it. Formulas only."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from course_lib import plan as P
from course_lib.plan import compute_time, gemm_time, memory
from course_lib.plan.specs import ATTENTION, ModelSpec, attention_kernel, recompute_flops

# a small GPT (multi-head attention of hidden / heads, GeLU MLP of 4h, dropout): every count below
# by hand from these
L, H, A, S, V = 4, 512, 8, 1024, 32000
GPT = ModelSpec(
    "gpt", L, H, A, A, 4 * H, V, S, dropout=True, gated_mlp=False, bias=False,
    norm="layernorm", tied_embeddings=True,
)  # fmt: skip
COMBOS = [(r, k) for r in ("none", "selective", "full") for k in ATTENTION]


def test_the_kernel_is_named_or_paired_and_bad_names_are_refused():
    assert ATTENTION == ("flash", "eager")
    assert [P.Layout(1, recompute=r).kernel for r in ("none", "selective", "full")] == [
        "eager",
        "flash",
        "eager",
    ]
    assert all(P.Layout(1, recompute=r, attention=k).kernel == k for r, k in COMBOS)
    assert attention_kernel("full", "flash") == "flash"
    with pytest.raises(ValueError, match="attention = 'sdpa': expected one of flash, eager"):
        P.Layout(1, attention="sdpa")


def test_flops_run_again_per_token_by_hand():
    """P = 12 h^2 per layer (no biases; two norms of h weights), w = h: eager runs again what recompute
    says (0, 4 s h, 2 P + 4 s h); flash's backward recomputes the core (4 s h, the course's
    count) and with full the layer's forward too."""
    p = 12 * H * H + 2 * H
    assert GPT.layer_params()["dense"] == p and GPT.attention_width == H
    core, layer = 4 * S * H, 2 * p + 4 * S * H
    want = {
        ("none", "eager"): 0,
        ("selective", "eager"): core,
        ("full", "eager"): layer,
        ("none", "flash"): core,
        ("selective", "flash"): core,
        ("full", "flash"): layer + core,
    }
    for (rec, kernel), per_layer in want.items():
        assert recompute_flops(p, L, H, S, rec, kernel) == L * per_layer, (rec, kernel)
        model, hardware = GPT.flops_per_token(rec, kernel)  # type: ignore[arg-type]
        assert hardware - model == L * per_layer
        # the stage's recomputed FLOPs (a middle stage of all L layers)
        lay = P.Layout(1, recompute=rec, attention=kernel)  # type: ignore[arg-type]
        assert compute_time.stage_flops(GPT, lay, L, output=False)[2] == L * per_layer
    assert GPT.flops_per_token("full") == GPT.flops_per_token("full", "eager")
    assert GPT.flops_per_token("selective") == GPT.flops_per_token("selective", "flash")


def test_bytes_one_layer_moves_by_hand():
    """Eager: the score products write and read each score (2 + 2 bytes: queries x keys x
    heads x sequences), the softmax and dropout move 2 x 2 + 2 x 2 + 1 bytes per score; flash
    moves none of them. tp splits the heads."""
    tp, b = 2, 2
    tokens = b * S
    flash = gemm_time.layer_gemms(GPT, tp, 1, tokens, S, True)["core"][0]
    eager = gemm_time.layer_gemms(GPT, tp, 1, tokens, S, False)["core"][0]
    assert (flash.m, flash.n, flash.k, flash.batch) == (S, S, 2 * H // A, (A // tp) * b)
    assert flash[:4] == eager[:4] and flash.extra_bytes == 0
    assert eager.extra_bytes == 4 * S * S * (A // tp) * b
    per_token = gemm_time.elementwise_bytes(GPT, tp, True, False)
    per_token -= gemm_time.elementwise_bytes(GPT, tp, True, True)
    assert per_token == A * S * (4 + 5) / tp


def test_one_layers_time_and_what_runs_again_by_shape():
    """compute_s by shape from the layer's parts (``shape_layer``): the kernel picks the parts,
    recomputation what runs again: eager none 0, selective the eager core, full the eager layer;
    flash none and selective its core, full its layer and its core."""
    cl = P.cluster("8xH100 + 400G IB", gpus=8)
    how = P.DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape")
    for rec, kernel in COMBOS:
        lay = P.Layout(8, recompute=rec, attention=kernel)  # type: ignore[arg-type]
        lt = compute_time.shape_layer(GPT, cl, lay, how)
        ref = gemm_time.layer_time(GPT, cl, 1, 1, S, S, kernel == "flash", True, False)
        assert lt[:4] == ref[:4]  # the expert efficiency: nan, a dense layer
        layer = lt.weights + lt.core + lt.elementwise
        again = {"none": 0.0, "selective": lt.core, "full": layer}[rec]
        if kernel == "flash":
            again = lt.core + (layer if rec == "full" else 0.0)
        compute, recompute = compute_time.compute_s(GPT, cl, lay, (L, L), how)
        assert compute == pytest.approx(3 * (L * layer + lt.output), rel=1e-15)
        assert recompute == pytest.approx(L * again, rel=1e-15)
    flash, eager = (
        compute_time.shape_layer(GPT, cl, P.Layout(8, attention=k), how) for k in ATTENTION
    )
    assert flash.weights == eager.weights and flash.core < eager.core
    assert flash.elementwise < eager.elementwise


def test_one_layers_activations_by_hand():
    """Korthikanti et al.'s Eq. 1 at tp 1: s b h (34 + 5 a s / h) bytes with the eager kernel and
    nothing recomputed; flash keeps no scores (34 s b h, selective's); full keeps the input
    (2 s b h) with either kernel."""
    b, sbh = 1, S * H
    want = {
        ("none", "eager"): 34 * sbh + 5 * A * S * S * b,
        ("none", "flash"): 34 * sbh,
        ("selective", "eager"): 34 * sbh,
        ("selective", "flash"): 34 * sbh,
        ("full", "eager"): 2 * sbh,
        ("full", "flash"): 2 * sbh,
    }
    for (rec, kernel), bytes_ in want.items():
        lay = P.Layout(1, recompute=rec, sequence_parallel=False)  # type: ignore[arg-type]
        assert memory._layer_activations(GPT, lay, rec, kernel) == bytes_, (rec, kernel)  # type: ignore[arg-type]
        # a stage of L layers, one micro-batch in flight each (pp 1): L x the layer, and with
        # full recomputation the layer rebuilt for its backward (without scores)
        lay = dataclasses.replace(lay, attention=kernel)
        acts = P.predict_memory(GPT, lay, global_batch_tokens=S)["activations"]
        assert acts == L * bytes_ + (34 * sbh if rec == "full" else 0)


def test_a_named_kernel_prices_as_its_pairing():
    """Layouts that name the kernel their recomputation implied are priced exactly as before it
    could be named (plan()'s search and the recorded reference keep the pairing)."""
    cl = P.cluster("8xH100 + 400G IB", gpus=64)
    m = P.model("Llama-2-7B")
    for how in (P.DEFAULT_ASSUMPTIONS, P.DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape")):
        for rec in ("none", "selective", "full"):
            lay = P.Layout(8, 8, 1, 1, rec, 1)  # type: ignore[arg-type]
            named = dataclasses.replace(lay, attention=lay.kernel)
            kw = dict(global_batch_tokens=512 * 4096, assumptions=how)
            a, b = (P.evaluate(m, cl, x, **kw) for x in (lay, named))
            assert pd.Series(a).equals(pd.Series(b))  # every field, nan where both are nan
    # flash with nothing recomputed: selective's price and memory (nothing left to drop)
    kw = dict(global_batch_tokens=512 * 4096)
    none = P.evaluate(m, cl, P.Layout(8, 8, 1, 1, "none", 1, attention="flash"), **kw)
    sel = P.evaluate(m, cl, P.Layout(8, 8, 1, 1, "selective", 1), **kw)
    assert {k: none[k] for k in ("memory_GB", "step_s", "hfu")} == {
        k: sel[k] for k in ("memory_GB", "step_s", "hfu")
    }


def test_every_published_run_names_its_kernel_and_where_it_comes_from():
    from course_lib.plan import published as PB

    for name, run in PB.RUNS.items():
        assert run.layout.attention in ATTENTION, name
        assert run.attention_source, name
    kernels = PB.published_table().set_index("run")["attention"]
    assert set(kernels[kernels == "eager"].index) == {
        "BLOOM-176B", "MT-NLG 530B", "OPT-175B", "PaLM 540B",
        *(n for n in PB.RUNS if n.startswith("Korthikanti")),
    }  # fmt: skip
