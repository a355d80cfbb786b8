"""Unit 19's graded checks (solutions/19_inside_the_step.ipynb, exercises/19_inside_the_step.ipynb).

1. ``check_roofline``: ``roofline(ops, flops_per_s, bytes_per_s) -> [(bound, seconds), ...]``
   for operators drawn from the grading seed (matmuls from one token to thousands, elementwise
   operators) on three machines (an H100 and an A100 from their datasheets, a CPU): "memory" or
   "compute" and the roofline time of each, against ``run_roofline.roofline``;
2. ``check_merge_backward``: the backward of unit 15's online-softmax merge: given two partial
   attention results and the gradients of the merged output and log-sum-exp, the gradients of
   each part's output and log-sum-exp, against autograd through the course's merge (out of
   reach); random splits, some with scores large enough that exp overflows float32;
3. ``check_fixed_tiled``: the tiled attention of the exercise forgets to rescale its running
   output when a later key block raises the running maximum; the fixed one must equal softmax
   attention on drawn odd lengths and tile sizes, and must stay tiled (no score row over all
   keys at once, no ``scaled_dot_product_attention``). The ✗ line says which cases fail: the
   ones whose largest score lies in the first block, or the ones where a later block holds it.

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function
on the drawn inputs and hands back what it returned (task 3: with what a recorder of torch's
dispatched operators saw); ``judge_X`` draws the same inputs, computes the answer with the
course's reference and prints one deterministic line or raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value, type_name
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need_list, split_check

__all__ = ["MACHINES", "check_roofline", "check_merge_backward", "check_fixed_tiled"]

UNIT = "u19_inside_the_step"

ROOFLINE_REFERENCES = (
    "course_lib.units.u19_inside_the_step.run_roofline:roofline",
    "course_lib.units.u19_inside_the_step.run_roofline:op_cost",
    "course_lib.units.u19_inside_the_step.run_roofline:op_table",
)
MERGE_REFERENCES = ("course_lib.parallel.context.blocks:merge_attention",)
TILED_REFERENCES = (
    "course_lib.techniques.flash:flash_attention",
    "course_lib.techniques.flash:FlashAttention.forward",
    "course_lib.techniques.flash:naive_attention",
)

#: (name, dense FLOP/s, bytes/s, bytes per value): NVIDIA's H100 SXM and A100 SXM datasheets
#: (bf16), and a CPU of about this course's reference machine (fp32)
MACHINES = (
    ("H100 SXM, bf16", 989e12, 3.35e12, 2),
    ("A100 SXM, bf16", 312e12, 2.039e12, 2),
    ("2-core CPU, fp32", 3.0e11, 2.5e10, 4),
)
_ELEMENTWISE = {  # kind -> (inputs, flops per element)
    "add": (2, 1),
    "gelu": (1, 8),
    "softmax": (1, 5),
    "layernorm": (1, 8),
}
SECONDS_RTOL = 1e-9
MERGE_RTOL, MERGE_ATOL = 1e-6, 1e-9  # float64
TILED_RTOL, TILED_ATOL = 1e-9, 1e-10  # float64


def _generator(task: int):
    import torch

    return torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))


# ---- task 1 --------------------------------------------------------------------------------
def roofline_cases(task: int = 1) -> list[tuple[str, float, float, list[dict[str, Any]]]]:
    """(machine, flops_per_s, bytes_per_s, ops) for each machine: 4 matmuls (one with 1 to 16
    rows: a decode step) and 3 elementwise operators, shapes drawn from the grading seed."""
    rng = case_rng(task, UNIT)
    cases = []
    for name, peak, bw, b in MACHINES:
        ops: list[dict[str, Any]] = []
        for rows in (rng.choice((1, 2, 4, 8, 16)), *rng.sample((128, 512, 2048, 8192, 32768), 3)):
            k, n = rng.choice((1024, 4096, 8192, 16384)), rng.choice((1024, 4096, 14336, 53248))
            ops.append(dict(kind="matmul", m=rows, k=k, n=n, bytes_per_value=b))
        for kind in rng.sample(sorted(_ELEMENTWISE), 3):
            inputs, fpe = _ELEMENTWISE[kind]
            ops.append(
                dict(kind="elementwise", op=kind, numel=rng.choice((2**20, 3 * 2**22, 2**27)),
                     inputs=inputs, outputs=1, flops_per_element=fpe, bytes_per_value=b)
            )  # fmt: skip
        rng.shuffle(ops)
        cases.append((name, peak, bw, ops))
    return cases


def collect_roofline(roofline, task: int = 1) -> list[Any]:
    """Task: ``roofline(ops, flops_per_s, bytes_per_s)``: for each operator (a dict as in the
    exercise) ("memory" or "compute", seconds). Graded on three machines, 7 drawn operators
    each: the bound exact, the seconds to a relative 1e-9."""
    return [
        learner_value(
            run_learner(
                task, roofline, [dict(op) for op in ops], peak, bw, forbid=ROOFLINE_REFERENCES
            )
        )  # fmt: skip
        for _name, peak, bw, ops in roofline_cases(task)
    ]


def judge_roofline(data: Any, task: int = 1) -> None:
    from course_lib.units.u19_inside_the_step.run_roofline import op_cost, roofline

    cases = roofline_cases(task)
    for (name, peak, bw, ops), got in zip(cases, need_list(task, data, len(cases), "answer")):
        if not isinstance(got, (list, tuple)) or len(got) != len(ops):
            fail(
                task,
                f"{name}: expected a list of {len(ops)} (bound, seconds), "
                f"got {type_name(got, short=True)}",
            )
        for op, pair, (bound, seconds) in zip(ops, got, roofline(ops, peak, bw)):
            what = ", ".join(f"{k}={v}" for k, v in op.items() if k != "bytes_per_value")
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                fail(
                    task,
                    f"{name}, {what}: expected (bound, seconds), got {type_name(pair, short=True)}",
                )
            if pair[0] != bound:
                flops, nbytes = op_cost(op)
                fail(
                    task,
                    f"{name}, {what}: you said {pair[0]!r}; its intensity is "
                    f"{flops / nbytes:.3g} FLOP/B against a ridge of {peak / bw:.3g}",
                )
            if not isinstance(pair[1], (int, float)) or isinstance(pair[1], bool):
                fail(
                    task,
                    f"{name}, {what}: seconds must be a number, "
                    f"got {type_name(pair[1], short=True)}",
                )
            if abs(pair[1] - seconds) > SECONDS_RTOL * seconds:
                fail(task, f"{name}, {what}: {pair[1]:.6g} s is not the roofline time")
    passed(
        task,
        "memory- or compute-bound and the roofline time of 21 drawn operators on an H100, an "
        f"A100 and a CPU (seconds to rtol={SECONDS_RTOL})",
    )


check_roofline = split_check(collect_roofline, judge_roofline)


# ---- task 2 --------------------------------------------------------------------------------
MERGE_CASES = 6


def _merge_cases(task: int):
    """(q, k, v, na, dout, dlse) of each split: keys [:na] and [na:], the last two with scores
    scaled by 40; float64."""
    import torch

    g = _generator(task)
    for case in range(MERGE_CASES):
        scale = 40.0 if case >= 4 else 1.0
        m, na, nb = (int(x) for x in torch.randint(2, 9, (3,), generator=g))
        q = torch.randn(2, 3, m, 8, generator=g, dtype=torch.float64) * scale
        k, v = (torch.randn(2, 3, na + nb, 8, generator=g, dtype=torch.float64) for _ in "kv")
        dout = torch.randn(2, 3, m, 8, generator=g, dtype=torch.float64)
        dlse = torch.randn(2, 3, m, generator=g, dtype=torch.float64)
        yield q, k, v, na, dout, dlse


def _partials(q, k, v, na):
    from course_lib.parallel.context.blocks import attention_block

    a = attention_block(q, k[:, :, :na], v[:, :, :na])
    return (*a, *attention_block(q, k[:, :, na:], v[:, :, na:]))


def collect_merge_backward(merge_backward, task: int = 2) -> list[Any]:
    """Task: ``merge_backward(out_a, lse_a, out_b, lse_b, dout, dlse) -> (d_out_a, d_lse_a,
    d_out_b, d_lse_b)``: the gradients of the merge's inputs given those of its outputs.
    Graded on 6 random splits in float64, two with scores scaled by 40."""
    out = []
    for q, k, v, na, dout, dlse in _merge_cases(task):
        parts = _partials(q, k, v, na)
        got = run_learner(task, merge_backward, *parts, dout, dlse, forbid=MERGE_REFERENCES)
        out.append(learner_value(got))
    return out


def _merge_grads(parts, dout, dlse):
    """Autograd through the course's merge: (d_out_a, d_lse_a, d_out_b, d_lse_b)."""
    import torch

    from course_lib.parallel.context.blocks import merge_attention

    leaves = [p.detach().requires_grad_() for p in parts]
    out, lse = merge_attention(*leaves)
    return torch.autograd.grad((out, lse), leaves, (dout, dlse))


def judge_merge_backward(data: Any, task: int = 2) -> None:
    import torch

    names = ("d_out_a", "d_lse_a", "d_out_b", "d_lse_b")
    cases = list(_merge_cases(task))
    for case, ((q, k, v, na, dout, dlse), got) in enumerate(
        zip(cases, need_list(task, data, MERGE_CASES, "gradients"))
    ):
        if not isinstance(got, tuple) or len(got) != 4:
            fail(task, f"expected a tuple of 4 gradients {names}, got {type_name(got, short=True)}")
        for name, g, want in zip(names, got, _merge_grads(_partials(q, k, v, na), dout, dlse)):
            if not isinstance(g, torch.Tensor):
                fail(
                    task,
                    f"case {case + 1}: {name}: expected a tensor, got {type_name(g, short=True)}",
                )
            if tuple(g.shape) != tuple(want.shape):
                fail(
                    task,
                    f"case {case + 1}: {name} has shape {tuple(g.shape)}, expected {tuple(want.shape)}",
                )
            if not torch.allclose(g.double(), want, rtol=MERGE_RTOL, atol=MERGE_ATOL):
                worst = float((g.double() - want).abs().max())
                fail(
                    task,
                    f"case {case + 1}: {name} differs from the merge's gradient by up to {worst:.3g}",
                )
    passed(
        task,
        "your merge backward equals autograd through the merge on 6 random splits, large scores "
        f"included (rtol={MERGE_RTOL}, atol={MERGE_ATOL})",
    )


check_merge_backward = split_check(collect_merge_backward, judge_merge_backward)


# ---- task 3 --------------------------------------------------------------------------------
#: the kinds of case task 3 draws: where each row's largest score lies
TILED_KINDS = ("largest score in the first key block", "largest score in the last key block",
               "random scores")  # fmt: skip
_MATMULS = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "dot", "einsum")


def tiled_cases(task: int = 3):
    """(kind, q, k, v, block_size) of each case: float64, 1 x 3 heads x odd length x 8."""
    import torch

    rng, g = case_rng(task, UNIT), _generator(task)
    out = []
    for kind in TILED_KINDS:
        for _ in range(2):
            n, bs = rng.choice((29, 37, 45, 53)), rng.choice((4, 5, 7, 16))
            q, k, v = (torch.randn(1, 3, n, 8, generator=g, dtype=torch.float64) for _ in "qkv")
            if kind != "random scores":
                q = q.abs() + 0.1  # every query scores the constant key highest
                k = k * 0.3
                k[:, :, 0 if "first" in kind else n - 1] = 4.0
            out.append((kind, q, k, v, bs))
    return out


def _recorded(task: int, fn, *args) -> tuple[Any, list[str]]:
    """The learner's ``fn(*args)`` with every dispatched operator recorded: its result and, for
    each matmul whose output has a row over all the keys and each fused attention, a
    description."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    n_keys = args[1].shape[2]
    seen: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if "scaled_dot_product" in name or "attention" in name:
                seen.append(f"aten.{name}")
            elif name in _MATMULS and isinstance(out, torch.Tensor) and out.shape[-1] == n_keys:
                seen.append(f"aten.{name} made a {tuple(out.shape)} product")
            return out

    with Recorder():
        result = run_learner(task, fn, *args, forbid=TILED_REFERENCES)
    return result, seen[:3]


def collect_fixed_tiled(fixed_attention, task: int = 3) -> list[Any]:
    """Task: ``fixed_attention(q, k, v, block_size) -> out``: the exercise's tiled attention
    with its bug fixed. Graded on 6 cases (float64, odd lengths, drawn tiles): two whose largest
    score per row lies in the first key block, two in the last, two random."""
    out = []
    for _kind, q, k, v, bs in tiled_cases(task):
        got, seen = _recorded(task, fixed_attention, q, k, v, bs)
        out.append({"out": learner_value(got), "untiled": list(seen)})
    return out


def _wrong_cases(task: int, cases: list, data: list) -> list[tuple[str, float]]:
    """(kind, worst error) of every case the learner's output misses; ✗ on malformed data."""
    import torch

    from course_lib.parallel.context.blocks import attention_block

    wrong = []
    for (kind, q, k, v, _bs), got in zip(cases, data):
        got = got.get("out") if isinstance(got, dict) else got
        want = attention_block(q, k, v)[0]
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = (
                tuple(got.shape) if isinstance(got, torch.Tensor) else type_name(got, short=True)
            )
            fail(task, f"expected a tensor of shape {tuple(want.shape)}, got {shape}")
        if not torch.allclose(got.double(), want, rtol=TILED_RTOL, atol=TILED_ATOL):
            wrong.append((kind, float((got.double() - want).abs().max())))
    return wrong


def judge_fixed_tiled(data: Any, task: int = 3) -> None:
    cases = tiled_cases(task)
    data = need_list(task, data, len(cases), "output")
    for (_kind, _q, k, _v, bs), got in zip(cases, data):
        untiled = got.get("untiled") if isinstance(got, dict) else None
        if untiled:
            fail(
                task,
                f"with block_size={bs} and {k.shape[2]} keys your attention is not tiled: "
                f"{'; '.join(map(str, untiled))}: compute the scores one key block at a time",
            )
    wrong = _wrong_cases(task, cases, data)
    kinds = {kind for kind, _ in wrong}
    worst = max((err for _, err in wrong), default=0.0)
    if kinds == {TILED_KINDS[1], TILED_KINDS[2]} or kinds == {TILED_KINDS[1]}:
        fail(
            task,
            f"right when each row's largest score is in the first key block, wrong (by up to "
            f"{worst:.3g}) when a later block raises the running maximum: what else was computed "
            "under the old maximum?",
        )
    if wrong:
        fail(task, f"wrong even where {', '.join(sorted(kinds))} (by up to {worst:.3g})")
    passed(
        task,
        "your tiled attention equals softmax attention on 6 odd lengths and tile sizes, "
        f"whichever block holds the largest score (rtol={TILED_RTOL}, atol={TILED_ATOL})",
    )


check_fixed_tiled = split_check(collect_fixed_tiled, judge_fixed_tiled)
