"""Checks for the exercises of unit 07 (solutions/07_lora_qlora.ipynb).

Task 1: count LoRA's trainable parameters for Mistral-7B (grouped-query attention: k and v are
1024 wide), all seven linears, as ``count_lora_params(r) -> int``.
Task 2: ``MyLoRALinear.forward``: base(x) + (alpha / r) x A^T B^T, unchanged at step 0.
Task 3: ``MyLoRALinear.merge``: W0 += (alpha / r) B A, after which forward skips the adapter.
Task 4: find the bug: ``init_adapter(d_in, d_out, r) -> (A, B)`` must leave the model unchanged
at step 0 (B = 0) and still learn (A random, so B gets a gradient).

The learner's class is built as ``MyLoRALinear(base, r=..., alpha=...)`` and has ``base``,
``lora_A`` (r, d_in), ``lora_B`` (d_out, r), ``scaling`` and ``merged`` (its ``__init__`` is given
in the notebook). Tolerances: fp32 sums in a different order differ by a few ulps; 1e-5 relative
and 1e-6 absolute leave room for that and catch a missing or doubled scaling (off by 2x).
"""

from __future__ import annotations

from course_lib.grading.core import fail, fmt_int, passed, run_learner

__all__ = [
    "MISTRAL_7B",
    "check_count_lora",
    "check_lora_forward",
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
_FORBID_LAYER = ["course_lib.techniques.lora:LoRALinear", "course_lib.techniques.lora:add_lora"]
RTOL, ATOL = 1e-5, 1e-6


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


def check_count_lora(count_lora_params, task: int = 1) -> None:
    """Exact counts at r = 1, 8, 16 and 64; an int is required."""
    for r in (1, 8, 16, 64):
        got = run_learner(task, count_lora_params, r, forbid=_FORBID_COUNT)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(
                task,
                f"count_lora_params({r}) returned {type(got).__name__} {got!r}: expected an int",
            )
        if got != _mistral_count(r):
            no_gqa = r * 32 * (4 * (4096 + 4096) + 3 * (4096 + 14336))
            hint = (
                " (k and v map 4096 -> 1024 here: 8 key/value heads of 128)"
                if got == no_gqa
                else ""
            )
            fail(task, f"count_lora_params({r}): expected {_mistral_count(r):,}, got {got:,}{hint}")
    passed(
        task,
        f"Mistral-7B, all seven linears: {fmt_int(_mistral_count(1))} x r "
        f"({fmt_int(_mistral_count(16))} at r = 16), exact at r = 1, 8, 16, 64",
    )


def _layer(MyLoRALinear, task: int, seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    base = nn.Linear(24, 12)
    ref = nn.Linear(24, 12)
    ref.load_state_dict(base.state_dict())
    layer = run_learner(task, MyLoRALinear, base, r=4, alpha=8, forbid=_FORBID_LAYER)
    for name, shape in (("lora_A", (4, 24)), ("lora_B", (12, 4))):
        t = getattr(layer, name, None)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            fail(
                task,
                f"MyLoRALinear(nn.Linear(24, 12), r=4, alpha=8).{name}: expected a tensor of shape "
                f"{shape}, got {getattr(t, 'shape', t)!r}",
            )
    return layer, ref


def _close(task: int, what: str, got, expected) -> None:
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        fail(
            task,
            f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {getattr(got, 'shape', got)!r}",
        )
    if not torch.allclose(got, expected, rtol=RTOL, atol=ATOL):
        err = float((got - expected).detach().abs().max())
        fail(task, f"{what}: max abs error {err:.3g} (rtol={RTOL:g}, atol={ATOL:g})")


def check_lora_forward(MyLoRALinear, task: int = 2) -> None:
    """forward = base(x) at step 0; = base(x) + (alpha / r) x A^T B^T once B is trained, for 2-D
    and 3-D inputs; the base gets no gradient."""
    import torch

    layer, ref = _layer(MyLoRALinear, task)
    x = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _close(
            task,
            "output at step 0 (B = 0) vs the base layer",
            run_learner(task, layer, x, forbid=_FORBID_LAYER),
            ref(x),
        )
        layer.lora_B.copy_(torch.randn(12, 4, generator=torch.Generator().manual_seed(2)))
    for inp in (x, x[0]):
        expected = ref(inp) + 2.0 * (inp @ layer.lora_A.detach().T @ layer.lora_B.detach().T)
        got = run_learner(task, layer, inp, forbid=_FORBID_LAYER)
        _close(
            task,
            f"output for input shape {tuple(inp.shape)} with B != 0 (alpha / r = 2)",
            got,
            expected,
        )
    got.sum().backward()
    if layer.base.weight.grad is not None:
        fail(task, "the base weight got a gradient: it must stay frozen")
    if layer.lora_A.grad is None or layer.lora_B.grad is None:
        fail(
            task,
            "lora_A and lora_B need gradients: compute the output from them with torch operations",
        )
    passed(
        task,
        f"forward = base(x) + (alpha / r) B A x, unchanged at step 0, base frozen (rtol={RTOL:g}, atol={ATOL:g})",
    )


def check_lora_merge(MyLoRALinear, task: int = 3) -> None:
    """After merge: base.weight = W0 + (alpha / r) B A, and forward gives the same output as before
    (the update is not added twice)."""
    import torch

    layer, ref = _layer(MyLoRALinear, task, seed=3)
    x = torch.randn(6, 24, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(12, 4, generator=torch.Generator().manual_seed(5)))
        before = run_learner(task, layer, x, forbid=_FORBID_LAYER)
        run_learner(task, layer.merge, forbid=_FORBID_LAYER)
        expected_w = ref.weight + 2.0 * layer.lora_B @ layer.lora_A
        _close(
            task,
            "base.weight after merge() vs W0 + (alpha / r) B A",
            layer.base.weight.detach(),
            expected_w,
        )
        after = run_learner(task, layer, x, forbid=_FORBID_LAYER)
        if torch.allclose(after, before + (before - ref(x)), rtol=RTOL, atol=ATOL):
            fail(
                task,
                "after merge() the update is added twice: forward must skip the adapter once merged",
            )
        _close(task, "output after merge() vs before", after, before)
    passed(
        task,
        f"merge() folds (alpha / r) B A into W0 and the output is unchanged (rtol={RTOL:g}, atol={ATOL:g})",
    )


def check_init_adapter(init_adapter, task: int = 4) -> None:
    """The fixed init: shapes (r, d_in) and (d_out, r); a layer adapted with it computes exactly
    what the base computes (B = 0); one SGD step changes the output (A is not zero)."""
    import torch

    torch.manual_seed(0)
    d_in, d_out, r = 32, 16, 4
    got = run_learner(task, init_adapter, d_in, d_out, r, forbid=_FORBID_LAYER)
    if not (
        isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
    ):
        fail(
            task,
            f"init_adapter must return a tuple (A, B) of two tensors, got {type(got).__name__}",
        )
    A, B = (t.detach().clone().float().requires_grad_(True) for t in got)
    if tuple(A.shape) != (r, d_in) or tuple(B.shape) != (d_out, r):
        fail(
            task,
            f"shapes: expected A {(r, d_in)} and B {(d_out, r)}, got {tuple(A.shape)} and {tuple(B.shape)}",
        )
    W = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(1))
    x = torch.randn(8, d_in, generator=torch.Generator().manual_seed(2))
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
