"""Activation checkpointing: bytes kept, peak while recomputing, FLOPs recomputed.

Introduced in notebooks/06_activation_checkpointing.ipynb. Two scales:

* our tiny GPT (``course_lib.models.GPT``, fp32, no dropout): :func:`checkpointed_activation_bytes_gpt`
  and :func:`gpt_step_matmul_flops` are *exact*, derived from what autograd and
  ``torch.utils.checkpoint`` keep, and checked to the byte against MemoryMeter and to the FLOP
  against ``torch.utils.flop_counter.FlopCounterMode`` (tests/techniques/test_checkpointing.py);
* papers' models: :func:`checkpointed_activation_bytes` and :func:`checkpoint_flops_ratio` build on
  Korthikanti et al. 2022 (arXiv:2205.05198) per-layer counts
  (:func:`~course_lib.measure.estimate.activations.activation_bytes_transformer_layer`): 34sbh + 5as^2b
  bytes per layer in 16-bit, 34sbh with their selective recomputation, 2sbh (the block input) with
  full recomputation.

Policies (the names of ``course_lib.techniques.checkpointing.POLICIES``): ``none``, ``full`` (every
block), ``every_k`` (blocks 0, k, 2k, ...), ``selective``, ``segments`` (k blocks per checkpoint,
Chen et al. 2016, arXiv:1604.06174).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

from course_lib import validate as _v
from course_lib.measure.estimate.activations import (
    RECOMPUTE,
    Recompute,
    activation_bytes_gpt,
    activation_bytes_transformer_layer,
)

__all__ = [
    "CHECKPOINT_POLICIES",
    "CheckpointPolicy",
    "checkpointed_groups",
    "checkpointed_activation_bytes_gpt",
    "gpt_step_matmul_flops",
    "checkpointed_activation_bytes",
    "checkpointed_peak_activation_bytes",
    "best_segment_length",
    "checkpoint_flops_ratio",
    "recompute_flops_per_token",
]

#: what gets checkpointed: the layer policies (:data:`Recompute`, the one spelling of "none",
#: "selective", "full" in the planner and the virtual cluster too) and two block policies
CheckpointPolicy = Literal[Recompute, "every_k", "segments"]
#: the policies (same names and order as ``techniques.checkpointing.POLICIES``)
CHECKPOINT_POLICIES: tuple[CheckpointPolicy, ...] = (
    "none",
    "full",
    "every_k",
    "selective",
    "segments",
)
_MATMULS = ("mm", "addmm", "bmm")


def checkpointed_groups(layers: int, policy: CheckpointPolicy, *, k: int = 1) -> tuple[int, int]:
    """(number of checkpoints, blocks in the largest one) for ``layers`` blocks under ``policy``.

    ``full``/``selective``: (L, 1); ``every_k``: (ceil(L/k), 1); ``segments``: (ceil(L/k), k);
    ``none``: (0, 0). ``k`` must be 1..L (and 1 for full and selective).
    """
    n = _v.count("layers", layers, minimum=1)
    policy = _v.choice("policy", policy, CHECKPOINT_POLICIES)
    k = _v.count("k", k, minimum=1, maximum=n)
    if policy in ("full", "selective") and k != 1:
        raise ValueError(
            f"k = {k}: expected 1 with policy = {policy!r} (every block is "
            "checkpointed; use policy 'every_k' or 'segments' with k > 1)"
        )
    if policy == "none":
        return 0, 0
    if policy == "segments":
        return -(-n // k), k
    return -(-n // k), 1


def _gpt_parts(config: Any, batch: int, seq: int | None) -> tuple[int, int, int, int, int, int]:
    """(values per plain block, values outside the blocks without logits, B, T, C, nh)."""
    one, two = (  # exact ints: tp = 1
        int(
            activation_bytes_gpt(
                dataclasses.replace(config, n_layer=n),
                batch,
                seq,
                dtype_bytes=1,
                include_logits=False,
            )
        )
        for n in (1, 2)
    )
    B = _v.count("batch", batch, minimum=1)
    T = config.block_size if seq is None else _v.count("seq", seq, minimum=1)
    C, nh = int(config.n_embd), int(config.n_head)
    return two - one, one - (two - one), B, int(T), C, nh


def checkpointed_activation_bytes_gpt(
    config: Any,
    batch: int,
    seq: int | None = None,
    *,
    policy: CheckpointPolicy = "none",
    k: int = 1,
    save_ops: str | Sequence[str] = _MATMULS,
    dtype_bytes: int = 4,
    include_logits: bool = True,
) -> int:
    """Exact bytes kept for backward when the forward of our GPT ends, under ``policy``.

    Per block, in values (B batch, T seq, C n_embd, nh n_head):

    * plain block: 16 BTC + 4 BT + nh B T^2 (``activation_bytes_gpt``: the block keeps its
      LayerNorm inputs, outputs and statistics, q/k/v copies, softmax output, merged heads,
      the MLP's 4C-wide GELU input and output);
    * checkpointed block (``full``, ``every_k``): its input only, 1 BTC -- Korthikanti et al.'s
      2sbh in 16-bit. The input is shared with whatever else holds it; the rest is freed;
    * a segment of k blocks (``segments``): one BTC for the whole segment;
    * ``selective`` with ``save_ops`` among mm, addmm, bmm: the input (1 BTC) plus every output of
      a saved op, whether or not autograd needs it: the four Linear layers are ``addmm`` with
      bias, ``mm`` without (qkv 3 BTC + attention projection 1 + MLP up 4 + MLP down 1 = 9 BTC),
      the two attention products are ``bmm`` (scores nh B T^2 + weighted values 1 BTC).

    Outside the blocks (never checkpointed): ln_f input, output, statistics (2 BTC + 2 BT) and the
    logits B T V (``include_logits``). Exact for ``course_lib.models.GPT`` with dropout 0.
    """
    n_ck, size = checkpointed_groups(config.n_layer, policy, k=k)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    plain, outside, B, T, C, nh = _gpt_parts(config, batch, seq)
    L = config.n_layer
    if policy == "selective":
        ops = set(_v.choices("save_ops", save_ops, _MATMULS))
        linear_op = "addmm" if getattr(config, "bias", True) else "mm"
        kept = B * T * C  # the block input
        kept += 9 * B * T * C if linear_op in ops else 0
        kept += nh * B * T * T + B * T * C if "bmm" in ops else 0
        per_block = [kept] * L
    elif policy == "none":
        per_block = [plain] * L
    elif policy == "segments":  # one input per segment of k blocks, nothing else inside
        per_block = [B * T * C if i % k == 0 else 0 for i in range(L)]
    else:  # full, every_k: blocks 0, k, 2k, ... keep their input only
        per_block = [B * T * C if i % k == 0 else plain for i in range(L)]
    values = sum(per_block) + outside
    if include_logits:
        values += B * T * config.vocab_size
    return p * values


def gpt_step_matmul_flops(
    config: Any,
    batch: int,
    seq: int | None = None,
    *,
    policy: CheckpointPolicy = "none",
    k: int = 1,
    save_ops: str | Sequence[str] = _MATMULS,
    early_stop: bool = True,
) -> dict[str, int]:
    """Matmul FLOPs of one training step (forward + backward) of our GPT, by phase.

    Returns ``{"forward", "backward", "recompute", "total"}`` (ints; a multiply-add counts 2,
    as ``torch.utils.flop_counter.FlopCounterMode`` counts). Forward: per block
    24 B T C^2 (qkv 6, projection 2, MLP up 8, MLP down 8) + 4 B T^2 C (scores and weighted
    values), plus the head 2 B T C V. Backward: twice the forward (each product has an input and
    a weight gradient, or two input gradients for the attention products). Recompute: each
    checkpoint's forward again, except

    * the products a selective policy kept (``save_ops``), and
    * with ``early_stop`` (PyTorch's default, ``torch.utils.checkpoint.set_checkpoint_early_stop``)
      the last block's MLP down-projection (8 B T C^2) of each checkpoint: nothing saved its output,
      so the rebuild stops before it, as soon as every tensor backward needs exists again.

    Elementwise work (LayerNorm, softmax, GELU) is not counted: cheap in FLOPs, not in time.
    """
    n_ck, size = checkpointed_groups(config.n_layer, policy, k=k)
    _, _, B, T, C, nh = _gpt_parts(config, batch, seq)
    linears, attention = 24 * B * T * C * C, 4 * B * T * T * C
    last = (
        8 * B * T * C * C if early_stop else 0
    )  # the MLP down-projection of a checkpoint's last block
    block = linears + attention
    forward = config.n_layer * block + 2 * B * T * C * config.vocab_size
    if policy == "selective":
        ops = set(_v.choices("save_ops", save_ops, _MATMULS))
        linear_op = "addmm" if getattr(config, "bias", True) else "mm"
        per = (0 if linear_op in ops else linears - last) + (0 if "bmm" in ops else attention)
        recompute = config.n_layer * per
    elif policy == "segments":
        recompute = config.n_layer * block - n_ck * last
    else:
        recompute = n_ck * (block - last)
    return {
        "forward": forward,
        "backward": 2 * forward,
        "recompute": recompute,
        "total": 3 * forward + recompute,
    }


def checkpointed_activation_bytes(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    layers: int,
    *,
    policy: CheckpointPolicy = "none",
    k: int = 1,
    dtype_bytes: int = 2,
    dropout: bool = True,
) -> int | float:
    """Activation bytes kept for backward by ``layers`` transformer layers (Korthikanti et al.).

    ``none``: L (34 sbh + 5 a s^2 b) in 16-bit with dropout; ``selective``: their selective
    recomputation (the attention core is recomputed), L * 34 sbh; ``full``: L * 2 sbh (each
    layer's input); ``every_k``: ceil(L/k) inputs plus the other layers in full; ``segments``:
    ceil(L/k) segment inputs. Per-layer counts from ``activation_bytes_transformer_layer``.
    What a *peak* adds while a checkpoint is rebuilt: :func:`checkpointed_peak_activation_bytes`.
    """
    n_ck, _ = checkpointed_groups(layers, policy, k=k)
    layer = {
        r: activation_bytes_transformer_layer(
            seq, batch, hidden, heads, dtype_bytes=dtype_bytes, dropout=dropout, recompute=r
        )
        for r in ("none", "selective", "full")
    }
    L = layers
    if policy == "none":
        return L * layer["none"]
    if policy == "selective":
        return L * layer["selective"]
    if policy == "full":
        return L * layer["full"]
    if policy == "every_k":
        return n_ck * layer["full"] + (L - n_ck) * layer["none"]
    return n_ck * layer["full"]  # segments


def checkpointed_peak_activation_bytes(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    layers: int,
    *,
    policy: CheckpointPolicy = "none",
    k: int = 1,
    dtype_bytes: int = 2,
    dropout: bool = True,
) -> int | float:
    """Kept bytes plus what one rebuilt checkpoint holds while its backward runs.

    Backward rebuilds one checkpoint at a time: a block (``full``, ``every_k``), a segment of k
    blocks (``segments``), or a block's recomputed elementwise outputs (``selective``); that
    checkpoint's activations exist until its backward is done. This is the O(sqrt L) argument of
    Chen et al. 2016: ceil(L/k) inputs + k layers, smallest near k = sqrt(L) when an input costs
    as much as a layer. Gradients of activations and scratch come on top (a few sbh).
    """
    kept = checkpointed_activation_bytes(
        seq,
        batch,
        hidden,
        heads,
        layers,
        policy=policy,
        k=k,
        dtype_bytes=dtype_bytes,
        dropout=dropout,
    )
    _, size = checkpointed_groups(layers, policy, k=k)
    full_layer = activation_bytes_transformer_layer(
        seq, batch, hidden, heads, dtype_bytes=dtype_bytes, dropout=dropout
    )
    if policy == "selective":
        sel = activation_bytes_transformer_layer(
            seq,
            batch,
            hidden,
            heads,
            dtype_bytes=dtype_bytes,
            dropout=dropout,
            recompute="selective",
        )
        return kept + full_layer - sel
    return kept + size * full_layer


def best_segment_length(layers: int, *, boundary_bytes: int = 1, layer_bytes: int = 1) -> int:
    """The segment length k (1..L) that minimises ceil(L/k) * boundary_bytes + k * layer_bytes.

    With boundary_bytes == layer_bytes (Chen et al.'s chain of equal layers) it is about sqrt(L);
    a transformer's block input is much smaller than its block (2sbh against 34sbh + 5as^2b), which
    pushes the best k down, to 1 for any real model. Ties go to the smaller k (less recompute).
    """
    n = _v.count("layers", layers, minimum=1)
    bb = _v.count("boundary_bytes", boundary_bytes, minimum=1)
    lb = _v.count("layer_bytes", layer_bytes, minimum=1)
    return min(range(1, n + 1), key=lambda k: (-(-n // k) * bb + k * lb, k))


def checkpoint_flops_ratio(
    seq: int, hidden: int, *, policy: CheckpointPolicy = "full", layers: int = 1, k: int = 1
) -> float:
    """Training FLOPs with recomputation / without, for a stack of transformer layers.

    Per layer forward matmul FLOPs (per sequence element and batch row): 24 h^2 + 4 s h
    (Narayanan et al. 2021, arXiv:2104.04473); a step is forward + backward = 3 forwards.
    ``full``/``segments``: one more forward of every layer: exactly 4/3 (+33 %); ``every_k``:
    ceil(L/k)/L of that; ``selective`` (Korthikanti et al.: recompute the attention core, whose
    products are 4 s h of the 24 h^2 + 4 s h): 1 + 4 s h / (3 (24 h^2 + 4 s h)).
    Logits and embeddings are left out (our GPT's exact count: :func:`gpt_step_matmul_flops`).
    """
    s, h = _v.count("seq", seq, minimum=1), _v.count("hidden", hidden, minimum=1)
    n_ck, _ = checkpointed_groups(layers, policy, k=k)
    layer = Fraction(24 * h * h + 4 * s * h)
    if policy == "none":
        extra = Fraction(0)
    elif policy == "selective":
        extra = Fraction(4 * s * h) / (3 * layer)
    elif policy == "every_k":
        extra = Fraction(n_ck, 3 * layers)
    else:
        extra = Fraction(1, 3)
    return float(1 + extra)


def recompute_flops_per_token(
    layer_params: int, *, layers: int, hidden: int, seq: int, recompute: Recompute = "none"
) -> int:
    """FLOPs per token that recomputation adds to ``layers`` transformer layers of
    ``layer_params`` parameters each (the model's own FLOPs: ``training_flops_per_token``):
    ``full`` runs each layer's forward again, 2 P + 4 s h; ``selective`` the attention products'
    forward, 4 s h (Korthikanti et al. 2022, Sec. 5); ``none`` 0.

    The accounting, against Korthikanti et al.'s Eq. 8: their hardware FLOPs with selective
    recomputation, 72 B s L h^2 (1 + s/(3h) + V/(12 h L)), exceed their model FLOPs (Eq. 7,
    s/(6h) in place of s/(3h)) by 12 s h per token and layer, three times the 4 s h here: Eq. 8
    adds the attention core's whole forward-and-backward term (4 s h forward + 8 s h backward)
    once more, where the recomputation itself runs only the core's forward (Q K^T and A V, 2 s h
    each). This function counts what the recomputation executes; 3x it is the paper's count
    (tests/measure/test_estimate_checkpointing.py derives both)."""
    P = _v.count("layer_params", layer_params)
    L, h, s = (_v.count("layers", layers), _v.count("hidden", hidden), _v.count("seq", seq))
    rec = _v.choice("recompute", recompute, RECOMPUTE, case_insensitive=True)
    return {"none": 0, "selective": L * 4 * s * h, "full": L * (2 * P + 4 * s * h)}[rec]
