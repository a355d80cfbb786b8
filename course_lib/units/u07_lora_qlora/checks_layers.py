"""Unit 07's checks of the learner's adapter layers (re-exported by :mod:`.checks`):

Task 2: ``MyQVLoRA.forward``: LoRA on q and v only of GPT-2's fused ``c_attn`` (one
:class:`Conv1D`, d -> 3d, output [q | k | v]), as the LoRA paper adapts W_q and W_v: unchanged at
step 0; once B is trained, q and v get their low-rank updates and k is the base's.
Task 3: ``MyLoRALinear.merge`` (its forward is given) into an ``nn.Linear`` (the lecture's layout)
and into a :class:`Conv1D` (transposed), after which forward skips the adapter.

Each check is split (:mod:`course_lib.grading.split`): ``collect_*`` builds the learner's layer
around a base drawn from the grading seed, drives it (B set, merge called, a backward) and hands
back its outputs and its adapter tensors as they were used; ``judge_*`` rebuilds the same base
(it is made before the learner's class sees it), computes the exact outputs in float64 and
decides. Tolerances: see :mod:`.checks`.
"""

from __future__ import annotations

import functools
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, split_check

UNIT = "u07_lora_qlora"
_FORBID_LAYER = ["course_lib.techniques.lora:LoRALinear", "course_lib.techniques.lora:add_lora"]
RTOL, ATOL = 1e-5, 1e-5  # ATOL: of the expected tensor's largest magnitude
TOLERANCE = f"rtol={RTOL:g}, atol={ATOL:g} of the largest value"
_QV = ("A_q", "B_q", "A_v", "B_v")


@functools.cache
def _conv1d_class():
    import torch
    from torch import nn

    class Conv1D(nn.Module):
        """GPT-2's linear layer (Radford et al. 2019; Hugging Face's ``Conv1D``): the weight is
        stored transposed, (d_in, d_out), and the layer computes x @ weight + bias."""

        def __init__(self, in_features: int, out_features: int):
            super().__init__()
            self.in_features, self.out_features = in_features, out_features
            self.weight = nn.Parameter(torch.randn(in_features, out_features) * 0.02)
            self.bias = nn.Parameter(torch.zeros(out_features))

        def forward(self, x):
            return x @ self.weight + self.bias

    return Conv1D


def _build(task: int, cls, base, *, r: int, alpha: int, shapes: dict[str, tuple[int, int]]):
    """The learner's ``cls(base, r=r, alpha=alpha)``, its adapter tensors checked by shape (the
    check drives them: a layer without them cannot be run further)."""
    layer = run_learner(task, cls, base, r=r, alpha=alpha, forbid=_FORBID_LAYER)
    made = (
        f"{getattr(cls, '__name__', 'the class')}({type(base).__name__}({base.in_features}, "
        f"{base.out_features}), r={r}, alpha={alpha})"
    )
    for name, shape in shapes.items():
        _shaped(task, f"{made}.{name}", getattr(layer, name, None), shape)
    return layer


def _near(got, expected) -> bool:
    """``got`` within RTOL of each expected element plus ATOL of the largest one (float64)."""
    g, e = got.detach().double(), expected.detach().double()
    scale = max(float(e.abs().max()), 1.0) if e.numel() else 1.0
    return bool(((g - e).abs() <= ATOL * scale + RTOL * e.abs()).all())


def _shaped(task: int, what: str, got, shape) -> None:
    """✗ unless ``got`` is a tensor of ``shape``."""
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != shape:
        fail(
            task,
            f"{what}: expected a tensor of shape {tuple(shape)}, got {getattr(got, 'shape', got)!r}",
        )


def _close(task: int, what: str, got, expected) -> None:
    _shaped(task, what, got, expected.shape)
    if not _near(got, expected):
        err = float((got.detach().double() - expected.detach().double()).abs().max())
        fail(task, f"{what}: max abs error {err:.3g} ({TOLERANCE})")


def _adapter(task: int, run: Any, shapes: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The adapter tensors handed back, by name, each checked by shape."""
    import torch

    out = {}
    for name, shape in shapes.items():
        t = run.get(name) if isinstance(run, dict) else None
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            fail(task, f"the run handed back no {name} of shape {shape} ({describe(t)})")
        out[name] = t.detach().double()
    return out


def _drawn_base(rng, make) -> tuple[Any, int, int, Any]:
    """A rank r and an alpha (never r: a missing scaling shows) drawn from ``rng``, the base
    layer ``make()`` with its weights and a random bias from the grading seed, and the generator
    that draws the batch and sets B."""
    import torch

    r = rng.choice((2, 4, 8))
    alpha = rng.choice([a for a in (1, 4, 8, 16, 32) if a != r])
    torch.manual_seed(rng.getrandbits(31))
    base = make()
    with torch.no_grad():
        base.bias.normal_()
    return base, r, alpha, torch.Generator().manual_seed(rng.getrandbits(63))


# ---------------------------------------------------------------------------------- task 2
def _qv_case(task: int):
    """A GPT-2 ``c_attn`` (Conv1D d -> 3d) as it is before the learner's class sees it, with d,
    r and alpha drawn from the grading seed; the batch; the generator that sets B."""
    import torch

    rng = case_rng(task, UNIT)
    d = rng.randint(8, 24)
    base, r, alpha, g = _drawn_base(rng, lambda: _conv1d_class()(d, 3 * d))
    x = torch.randn(rng.randint(2, 4), rng.randint(3, 6), d, generator=g)
    return base, d, r, alpha, x, g


def _qv_shapes(d: int, r: int) -> dict[str, tuple[int, int]]:
    return {"A_q": (r, d), "B_q": (d, r), "A_v": (r, d), "B_v": (d, r)}


def collect_qv_forward(MyQVLoRA, task: int = 2) -> dict[str, Any]:
    """Task 2: the learner's q/v adapter around GPT-2's fused c_attn: its output at step 0, its
    adapter once B is set, its outputs then (3-D and 2-D input), which tensors got gradients."""
    import torch

    base, d, r, alpha, x, g = _qv_case(task)
    layer = _build(task, MyQVLoRA, base, r=r, alpha=alpha, shapes=_qv_shapes(d, r))
    with torch.no_grad():
        step0 = run_learner(task, layer, x, forbid=_FORBID_LAYER)
        for name in ("B_q", "B_v"):
            getattr(layer, name).copy_(torch.randn((d, layer.A_q.shape[0]), generator=g))
        adapter = {name: getattr(layer, name).detach().clone() for name in _QV}
    outputs = [run_learner(task, layer, inp, forbid=_FORBID_LAYER) for inp in (x, x[0])]
    if isinstance(outputs[-1], torch.Tensor) and outputs[-1].requires_grad:
        run_learner(task, outputs[-1].sum().backward)
    return {
        "step0": step0,
        **adapter,
        "outputs": outputs,
        "base_grads": [
            n for n, p in getattr(layer, "base", base).named_parameters() if p.grad is not None
        ],
        "adapter_grads": [n for n in _QV if getattr(layer, n).grad is not None],
    }


def judge_qv_forward(data: Any, task: int = 2) -> None:
    """On GPT-2's fused c_attn (Conv1D d -> 3d, [q | k | v]): forward = base(x) at step 0; once
    B_q and B_v are trained, the output of the base whose weight carries (alpha / r) B A in its
    q and v columns (k's untouched), for 3-D and 2-D inputs; only the adapter gets gradients."""
    import torch

    ref, d, r, alpha, x, _ = _qv_case(task)
    scaling = alpha / r
    step0 = data.get("step0") if isinstance(data, dict) else None
    with torch.no_grad():
        _close(task, "output at step 0 (B = 0) vs the base layer", step0, ref(x))
    adapter = _adapter(task, data, _qv_shapes(d, r))
    w = ref.weight.detach().double()  # (d, 3d): Conv1D's layout, columns [q | k | v]
    for name, cols in (("q", slice(0, d)), ("v", slice(2 * d, 3 * d))):
        w[:, cols] += scaling * (adapter[f"B_{name}"] @ adapter[f"A_{name}"]).T
    outputs = need(task, data, "outputs", list, "outputs once B is trained")
    if len(outputs) != 2:
        fail(task, "the run handed back no outputs once B is trained")
    for inp, got in zip((x, x[0]), outputs):
        expected = inp.double() @ w + ref.bias.detach().double()  # float64: the exact output
        what = f"c_attn = Conv1D({d}, {3 * d}), input shape {tuple(inp.shape)}, B != 0"
        if isinstance(got, torch.Tensor) and got.shape == expected.shape:
            base_out = inp.double() @ ref.weight.detach().double() + ref.bias.detach().double()
            _check_qkv_parts(task, what, got, expected, base_out, d, scaling)
        _close(task, what, got, expected)
    _judge_adapter_gradients(task, data)
    passed(
        task,
        f"LoRA on q and v of GPT-2's fused c_attn: unchanged at step 0, q and v updated by "
        f"(alpha / r) B A x once B is trained, k the base's, base frozen ({TOLERANCE})",
    )


def _check_qkv_parts(task: int, what: str, got, expected, base_out, d: int, scaling: float):
    """Name the part of the fused output that is wrong: k changed, or q or v not updated."""

    k = slice(d, 2 * d)
    if not _near(got[..., k], base_out[..., k]):
        fail(
            task,
            f"{what}: the k part of the output (columns {d}..{2 * d - 1}) differs from the "
            "base's: this adapter changes q and v only",
        )
    for part, first in (("q", 0), ("v", 2 * d)):
        cols = slice(first, first + d)
        if not _near(got[..., cols], expected[..., cols]):
            fail(
                task,
                f"{what}: the {part} part of the output (columns {first}..{first + d - 1}) is "
                f"not the base's plus (alpha / r = {scaling:g}) x A_{part}^T B_{part}^T",
            )


def _judge_adapter_gradients(task: int, data: dict) -> None:
    """The base stays frozen and each of the four adapter tensors got a gradient."""
    base_grads = need(task, data, "base_grads", list, "list of the base's gradients")
    got = need(task, data, "adapter_grads", list, "list of the adapter's gradients")
    if base_grads:
        fail(task, "the base got a gradient: it must stay frozen")
    missing = [n for n in _QV if n not in got]
    if missing:
        fail(
            task,
            f"{', '.join(missing)} got no gradient: compute the output from the adapter's "
            "tensors with torch operations",
        )


check_qv_forward = split_check(collect_qv_forward, judge_qv_forward)


# ---------------------------------------------------------------------------------- task 3
_KINDS = ("linear", "conv1d")


def _merge_case(task: int, kind: str):
    """A base layer as it is before the learner's class sees it (sizes, rank and alpha drawn
    from the grading seed), the batch and the generator that sets B."""
    import torch
    from torch import nn

    rng = case_rng(task, UNIT)
    d_in, d_out = rng.randint(12, 40), rng.randint(6, 30)
    d_out += d_out == d_in  # never square: the two layouts must differ
    make = nn.Linear if kind == "linear" else _conv1d_class()
    base, r, alpha, g = _drawn_base(rng, lambda: make(d_in, d_out))
    x = torch.randn(rng.randint(3, 8), d_in, generator=g)
    return base, r, alpha, x, g


def _merge_shapes(base, r: int) -> dict[str, tuple[int, int]]:
    return {"lora_A": (r, base.in_features), "lora_B": (base.out_features, r)}


def collect_lora_merge(MyLoRALinear, task: int = 3) -> dict[str, Any]:
    """Task 3: the learner's layer around an nn.Linear and a Conv1D, B set: its output before
    merge(), its adapter and base weight after, its output after."""
    import torch

    out = {}
    for kind in _KINDS:
        base, r, alpha, x, g = _merge_case(task, kind)
        layer = _build(task, MyLoRALinear, base, r=r, alpha=alpha, shapes=_merge_shapes(base, r))
        with torch.no_grad():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g))
            before = run_learner(task, layer, x, forbid=_FORBID_LAYER)
            run_learner(task, layer.merge, forbid=_FORBID_LAYER)
            run = {n: getattr(layer, n).detach().clone() for n in ("lora_A", "lora_B")}
            run.update(weight=layer.base.weight.detach().clone(), before=before)
            run["after"] = run_learner(task, layer, x, forbid=_FORBID_LAYER)
        out[kind] = run
    return out


def judge_lora_merge(data: Any, task: int = 3) -> None:
    """After merge, into an nn.Linear and into a Conv1D: base.weight is W0 plus the update in the
    base's own layout, and forward gives the same output as before (not added twice)."""
    for kind in _KINDS:
        _judge_merge_into(need(task, data, kind, dict, f"run on the {kind} base"), task, kind)
    passed(
        task,
        f"merge() folds (alpha / r) B A into W0 of an nn.Linear and of a GPT-2 Conv1D (stored "
        f"transposed) and the output is unchanged ({TOLERANCE})",
    )


def _judge_merge_into(run: dict, task: int, kind: str) -> None:
    import torch

    ref, r, alpha, x, _ = _merge_case(task, kind)
    name = type(ref).__name__
    adapter = _adapter(task, run, _merge_shapes(ref, r))
    with torch.no_grad():
        delta = alpha / r * adapter["lora_B"] @ adapter["lora_A"]  # nn.Linear's layout, float64
        expected_w = ref.weight.double() + (delta if kind == "linear" else delta.T)
        _close(
            task,
            f"{name} base: base.weight after merge() vs W0 plus (alpha / r) B A in its layout",
            run.get("weight"),
            expected_w,
        )
        base_out = ref(x)
        before, after = run.get("before"), run.get("after")
        _shaped(task, f"{name} base: output before merge()", before, base_out.shape)
        _shaped(task, f"{name} base: output after merge() vs before", after, base_out.shape)
        if _near(after, before + (before - base_out)):
            fail(
                task,
                f"{name} base: after merge() the update is added twice: forward must skip the "
                "adapter once merged",
            )
        _close(task, f"{name} base: output after merge() vs before", after, before)


check_lora_merge = split_check(collect_lora_merge, judge_lora_merge)
