"""estimate.checkpointing at paper scale: the sources' figures, re-derived; bad input."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.models import GPTConfig


def test_gpt3_korthikanti_figures():
    s, b, h, a, L = 2048, 1, 12288, 96, 96
    per_layer = estimate.activation_bytes_transformer_layer(s, b, h, a)
    assert round(per_layer / 1e9, 2) == 2.87  # 34sbh + 5as^2b, 16-bit
    assert round(estimate.checkpointed_activation_bytes(s, b, h, a, L) / 1e9) == 275
    assert (
        round(estimate.checkpointed_activation_bytes(s, b, h, a, L, policy="selective") / 1e9) == 82
    )
    assert (
        round(estimate.checkpointed_activation_bytes(s, b, h, a, L, policy="full") / 1e9, 1) == 4.8
    )
    # the Playbook's "-70 % activations" for selective recomputation
    assert round(1 - 82.14 / 275.41, 2) == 0.70


def test_7b_figures_and_the_corrected_ones():
    s, b, h, a, L = 2048, 16, 4096, 32, 32
    full = estimate.checkpointed_activation_bytes(s, b, h, a, L, policy="full")
    assert full == 2 * s * b * h * L and round(full / 1e9, 1) == 8.6  # S4's residual stream
    assert (
        round(estimate.checkpointed_activation_bytes(32768, b, h, a, L, policy="full") / 1e9) == 137
    )
    assert (
        round(estimate.checkpointed_activation_bytes(s, b, h, a, L, policy="selective") / 1e9)
        == 146
    )
    assert (
        round(estimate.checkpointed_activation_bytes(s, b, h, a, L) / 1e9) == 490
    )  # not "~100 GB"


def test_every_k_segments_peak_and_flops():
    s, b, h, a, L = 2048, 1, 4096, 32, 8
    none = estimate.activation_bytes_transformer_layer(s, b, h, a)
    inp = estimate.activation_bytes_transformer_layer(s, b, h, a, recompute="full")
    assert (
        estimate.checkpointed_activation_bytes(s, b, h, a, L, policy="every_k", k=2)
        == 4 * inp + 4 * none
    )
    assert estimate.checkpointed_activation_bytes(s, b, h, a, L, policy="segments", k=3) == 3 * inp
    assert (
        estimate.checkpointed_peak_activation_bytes(s, b, h, a, L, policy="segments", k=3)
        == 3 * inp + 3 * none
    )
    assert estimate.checkpoint_flops_ratio(s, h, policy="full", layers=L) == pytest.approx(4 / 3)
    assert estimate.checkpoint_flops_ratio(s, h, policy="none", layers=L) == 1.0
    assert estimate.checkpoint_flops_ratio(s, h, policy="every_k", layers=L, k=2) == pytest.approx(
        1 + 4 / 24
    )
    sel = estimate.checkpoint_flops_ratio(s, h, policy="selective", layers=L)
    assert sel == pytest.approx(1 + 4 * s * h / (3 * (24 * h * h + 4 * s * h)))


def test_best_segment_length_is_sqrt_l_for_equal_costs():
    assert estimate.best_segment_length(16) == 4
    assert estimate.best_segment_length(100) == 10
    assert (
        estimate.best_segment_length(96, boundary_bytes=2, layer_bytes=114) == 1
    )  # GPT-3: per block


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda: estimate.checkpointed_activation_bytes(2048, 1, 4096, 32, 8, policy="all"),
            ValueError,
            r"policy = 'all': expected one of none, full, every_k, selective, segments",
        ),
        (
            lambda: estimate.checkpointed_activation_bytes(
                2048, 1, 4096, 32, 8, policy="every_k", k=0
            ),
            ValueError,
            r"k = 0: expected an int in 1\.\.8",
        ),
        (
            lambda: estimate.checkpointed_activation_bytes_gpt(
                GPTConfig.tiny(), 2, 8, policy="selective", save_ops=("gelu",)
            ),
            ValueError,
            r"save_ops = \['gelu'\]: expected each one of mm, addmm, bmm",
        ),
        (lambda: estimate.best_segment_length(0), ValueError, r"layers = 0: expected an int >= 1"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_selective_recompute_flops_against_korthikanti_eq8():
    # Korthikanti et al. 2022: model FLOPs 72 B s L h^2 (1 + s/(6h) + V/(12hL)) (Eq. 7), hardware
    # FLOPs with selective recomputation the same with s/(3h) (Eq. 8). Per token (B s tokens) the
    # difference is 72 L h^2 s/(6h) = 12 s h L; the recomputation runs the attention core's forward
    # only, Q K^T and A V at 2 s h FLOPs each per token and layer: 4 s h L, a third of Eq. 8's.
    s, h, L, V = 2048, 12288, 96, 51200  # GPT-3 175B's shape, as in their Table
    eq7 = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)) / s
    eq8 = 72 * s * L * h * h * (1 + s / (3 * h) + V / (12 * h * L)) / s
    ours = estimate.recompute_flops_per_token(
        12 * h * h, layers=L, hidden=h, seq=s, recompute="selective"
    )
    assert ours == 4 * s * h * L == 3_221_225_472 * 3
    assert eq8 - eq7 == pytest.approx(3 * ours, rel=1e-12)
