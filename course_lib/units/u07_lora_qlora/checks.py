"""Checks for the exercises of unit 07 (solutions/07_lora_qlora.ipynb).

Task 1: count LoRA's trainable parameters for Mistral-7B (grouped-query attention: k and v are
1024 wide), all seven linears, as ``count_lora_params(r) -> int``.
Task 2: ``MyQVLoRA.forward``: LoRA on q and v only of GPT-2's fused ``c_attn`` (one
:class:`Conv1D`, d -> 3d, output [q | k | v]), as the LoRA paper adapts W_q and W_v: unchanged at
step 0; once B is trained, q and v get their low-rank updates and k is the base's.
Task 3: ``MyLoRALinear.merge`` (its forward is given) into an ``nn.Linear`` (the lecture's layout)
and into a :class:`Conv1D` (transposed), after which forward skips the adapter.
Task 4: find the bug: ``init_adapter(d_in, d_out, r) -> (A, B)`` must leave the model unchanged
at step 0 (B = 0) and still learn (A random, so B gets a gradient).

Tasks 2 and 3 live in :mod:`.checks_layers` (re-exported here). Each check is split
(:mod:`course_lib.grading.split`): ``collect_*`` calls the learner's code and hands back what it
returned; ``judge_*`` computes what is expected and decides.

The learner's classes are built as ``MyQVLoRA(c_attn, r=..., alpha=...)`` (``base``, ``A_q``
and ``A_v`` (r, d_in), ``B_q`` and ``B_v`` (d, r), ``scaling``) and ``MyLoRALinear(base, r=...,
alpha=...)`` (``base``, ``lora_A`` (r, d_in), ``lora_B`` (d_out, r), ``scaling``, ``merged``);
their ``__init__`` is given in the notebook. Layer sizes, rank, alpha and the ranks of task 1 are drawn from the grading
seed (:func:`course_lib.grading.seeds.case_rng`); alpha is never r, so a missing scaling shows.
Tolerances: the expected values are computed in float64; the learner's fp32 sums, in another order,
differ by rounding that grows with the largest term, so an element may differ by 1e-5 of itself
plus 1e-5 of the tensor's largest magnitude. A missing or doubled scaling (off by 2x or more)
is far outside that.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe, type_name
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need_list, split_check
from course_lib.units.u07_lora_qlora.checks_layers import (  # noqa: F401 (re-exported)
    _FORBID_LAYER,
    _conv1d_class,
    check_lora_merge,
    check_qv_forward,
)

UNIT = "u07_lora_qlora"

__all__ = [
    "MISTRAL_7B",
    "check_count_lora",
    "check_qv_forward",
    "check_lora_merge",
    "check_init_adapter",
]

#: the model of task 1 (Jiang et al. 2023, arXiv:2310.06825, Table 1)
MISTRAL_7B = {
    "hidden": 4096,
    "n_layer": 32,
    "n_head": 32,
    "n_kv_head": 8,
    "head_dim": 128,
    "ffn_hidden": 14336,
}
_FORBID_COUNT = [
    "course_lib.measure.estimate.lora:lora_params",
    "course_lib.measure.estimate.lora:transformer_lora_params",
    "course_lib.measure.estimate.lora:llama_linear_shapes",
    "course_lib.techniques.lora:add_lora",
    "course_lib.techniques.lora:trainable_params",
]


def _mistral_count(r: int) -> int:
    h, f, kv = (
        MISTRAL_7B["hidden"],
        MISTRAL_7B["ffn_hidden"],
        MISTRAL_7B["n_kv_head"] * MISTRAL_7B["head_dim"],
    )
    per_layer = (
        (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + f) + (f + h)
    )  # q, k, v, o, gate, up, down
    return r * per_layer * MISTRAL_7B["n_layer"]


def _count_ranks(task: int) -> tuple[int, ...]:
    rng = case_rng(task, UNIT)
    return (1, rng.randint(2, 12), 16, rng.randint(17, 256))


def collect_count_lora(count_lora_params: Any, task: int = 1) -> list[Any]:
    """Task 1: the learner's counts at r = 1, 16 and two ranks drawn from the grading seed."""
    return [
        run_learner(task, count_lora_params, r, forbid=_FORBID_COUNT) for r in _count_ranks(task)
    ]


def judge_count_lora(data: Any, task: int = 1) -> None:
    """Exact counts at each rank; an int is required."""
    ranks = _count_ranks(task)
    need_list(task, data, len(ranks), "count", "ranks")
    for r, got in zip(ranks, data):
        if isinstance(got, bool) or not isinstance(got, int):
            fail(task, f"count_lora_params({r}) returned {describe(got)}: expected an int")
        if got != _mistral_count(r):
            no_gqa = r * 32 * (4 * (4096 + 4096) + 3 * (4096 + 14336))
            hint = (
                " (k and v map 4096 -> 1024 here: 8 key/value heads of 128)"
                if got == no_gqa
                else ""
            )
            fail(task, f"count_lora_params({r}): {got:,} is not Mistral-7B's count{hint}")
    passed(
        task,
        "Mistral-7B, all seven linears, k and v grouped-query: exact at r = 1, 16 and 2 unseen "
        "ranks",
    )


check_count_lora = split_check(collect_count_lora, judge_count_lora)


def __getattr__(name: str) -> Any:
    """``Conv1D``, the base of tasks 2 and 3, built on first use (this module imports no torch
    at import time)."""
    if name == "Conv1D":
        return _conv1d_class()
    raise AttributeError(name)


def _init_case(task: int) -> tuple[int, int, int, int, Any]:
    """Task 4's seed for the learner's init, d_in, d_out, r, and the rng that draws the rest."""
    rng = case_rng(task, UNIT)
    seed = rng.getrandbits(31)
    d_in, d_out, r = rng.randint(16, 48), rng.randint(8, 32), rng.choice((2, 4, 8))
    return seed, d_in, d_out, r, rng


def collect_init_adapter(init_adapter: Any, task: int = 4) -> dict[str, Any]:
    """Task 4: the (A, B) the learner's fixed init returns."""
    import torch

    seed, d_in, d_out, r, _ = _init_case(task)
    torch.manual_seed(seed)
    return {"adapter": run_learner(task, init_adapter, d_in, d_out, r, forbid=_FORBID_LAYER)}


def judge_init_adapter(data: Any, task: int = 4) -> None:
    """The fixed init: shapes (r, d_in) and (d_out, r); a layer adapted with it computes exactly
    what the base computes (B = 0); one SGD step changes the output (A is not zero)."""
    import torch

    _, d_in, d_out, r, rng = _init_case(task)
    got = data.get("adapter") if isinstance(data, dict) else None
    if not (
        isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
    ):
        kind = type_name(got)
        fail(task, f"init_adapter must return a tuple (A, B) of two tensors, got {kind}")
    A, B = (t.detach().clone().float().requires_grad_(True) for t in got)
    if tuple(A.shape) != (r, d_in) or tuple(B.shape) != (d_out, r):
        fail(
            task,
            f"shapes: expected A {(r, d_in)} and B {(d_out, r)}, got {tuple(A.shape)} and {tuple(B.shape)}",
        )
    g = torch.Generator().manual_seed(rng.getrandbits(63))
    W = torch.randn(d_out, d_in, generator=g)
    x = torch.randn(8, d_in, generator=g)
    y = x @ (W + 2.0 * B @ A).T
    change = float((y - x @ W.T).detach().abs().max())
    if change != 0.0:
        fail(
            task,
            f"the adapted layer changes the pre-trained output at step 0 by up to {change:.3g}: "
            "B A must be exactly zero at initialisation",
        )
    y.pow(2).mean().backward()
    with torch.no_grad():
        A -= 0.1 * A.grad
        B -= 0.1 * B.grad
        moved = float((x @ (W + 2.0 * B @ A).T - x @ W.T).abs().max())
    if moved == 0.0:
        fail(
            task,
            "after one SGD step the adapter still changes nothing: with A and B both zero no "
            "gradient reaches either (dL/dB = g (A x)^T, dL/dA = B^T g x^T); keep A random",
        )
    passed(task, "B A = 0 at step 0 (the model is unchanged) and one SGD step moves the output")


check_init_adapter = split_check(collect_init_adapter, judge_init_adapter)
