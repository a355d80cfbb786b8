"""Checks for the exercises of unit 17 (solutions/17_fp8_training.ipynb).

Task 1: ``my_rowwise(x) -> (data, scale)``: rowwise E4M3 scaling of a 2-D tensor, one fp32
dequantisation scale per row (amax / 448), ``data`` in ``torch.float8_e4m3fn`` with
``data.float() * scale`` close to ``x``; graded on random tensors with outlier rows and columns
and an all-zero row.
Task 2: find the bug in a tensorwise E5M2 cast for gradients adapted from an E4M3 one (the
exercise's cell shows it); ``grad_cast(g) -> (data, scale)`` is graded on gradients spread over
nine decades: no value may come back as 0 that the course's E5M2 cast keeps, and the error must
be the course's.
Task 3: predict, for Llama-2-13B under FSDP with an FP8 all-gather (linear weights in E4M3,
everything else in bf16, gathered before forward and again before backward) on N GPUs, the bytes
each GPU sends in the all-gathers of one step and its model-state bytes (fp32 master, fp32
gradients, Adam's two fp32 moments, all sharded, plus the largest layer's gathered FP8 weights).

Task 4 (``checks_overlap``): the tokens per GPU above which FSDP's collectives hide, with bf16
and with FP8 matmuls and gathers, at drawn cluster sizes and links.

Tolerances: a cast is judged by its error against the course's own cast of the same tensor
(``x`` rebuilt from data and scale may differ from ours by rounding of the scale: 1 % of our
error plus 1e-6 of |x|); scales to 1e-6 relative; bytes to 1 byte (the (N-1)/N of a ring need
not be whole).

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's code on
the seeded cases and hands back what it returned; ``judge_X`` draws the same cases, casts them
with the course's own code or computes the bytes, and compares.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.plain import learner_value, type_name
from course_lib.grading.split import need_list, split_check
from course_lib.units.u17_fp8_training.checks_overlap import check_fp8_overlap

__all__ = [
    "LLAMA2_13B",
    "check_rowwise",
    "check_grad_cast",
    "check_fsdp_fp8",
    "check_fp8_overlap",
]

_FORBID_CAST = [
    "course_lib.techniques.fp8:to_float8",
    "course_lib.techniques.fp8:Float8Data.dequantize",
    "course_lib.techniques.fp8_linear:Float8Linear._cast",
]
_FORBID_BYTES = [
    "course_lib.measure.estimate.fp8:fsdp_allgather_bytes_sent",
    "course_lib.measure.estimate.fp8:fsdp_fp8_memory_per_gpu",
    "course_lib.measure.estimate.planning:transformer_param_count",
]

#: the model of task 3 (Touvron et al. 2023, arXiv:2307.09288; the released 13B shape): 40
#: layers, width 5120, 40 heads (no grouped-query attention), SwiGLU 13824, vocabulary 32000,
#: untied output head, RMSNorm
LLAMA2_13B = {"layers": 40, "hidden": 5120, "heads": 40, "ffn": 13824, "vocab": 32000}


UNIT = "u17_fp8_training"
#: cluster sizes task 3 draws three from (a non-power of two always among them)
FSDP_SIZES = (4, 16, 32, 64, 128, 256)
FSDP_ODD_SIZES = (6, 12, 24, 48, 96)


def _generator(task: int):
    import torch

    from course_lib.grading.seeds import case_rng

    return torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))


def _cases(task: int = 1):
    import torch

    gen = _generator(task)
    x = torch.randn(48, 256, generator=gen)
    x[:, 7] *= 300.0  # an outlier column: every row has it
    x[5] *= 2000.0  # an outlier row
    x[9] = 0.0  # an all-zero row: its scale must not be 0
    tiny = torch.randn(8, 64, generator=gen) * 1e-5
    return [("outliers", x), ("tiny values", tiny), ("normal", torch.randn(16, 32, generator=gen))]


def _unpack(task: int, got, x, dtype: Any = None):
    import torch

    dtype = torch.float8_e4m3fn if dtype is None else dtype
    if not (isinstance(got, tuple) and len(got) == 2):
        fail(task, f"expected a tuple (data, scale), got {type_name(got)}")
    data, scale = got
    if not isinstance(data, torch.Tensor) or data.dtype != dtype:
        fail(
            task,
            f"data: expected a {dtype} tensor, got {getattr(data, 'dtype', type_name(data))}",
        )
    if tuple(data.shape) != tuple(x.shape):
        fail(task, f"data: expected shape {tuple(x.shape)}, got {tuple(data.shape)}")
    if not isinstance(scale, torch.Tensor):
        fail(task, f"scale: expected a tensor, got {type_name(scale)}")
    return data, scale.float()


def _judge_cast(task: int, what: str, x, data, scale, ours) -> None:
    import torch

    back = data.float() * scale
    if not bool(torch.isfinite(back).all()):
        fail(
            task,
            f"{what}: data * scale has inf or NaN (a scale of 0, or an all-zero block divided by 0?)",
        )
    err = float((back - x).norm())
    ref = float((ours.dequantize() - x).norm())
    if err > 1.01 * ref + 1e-6 * float(x.abs().max()):
        fail(task, f"{what}: ||data * scale - x|| = {err:.4g}, the course's cast gets {ref:.4g}")


def _casts(task: int, data: Any, cases: list) -> list:
    """The learner's (data, scale) for each case, as handed back; a ✗ if there is not one per
    case."""
    return need_list(task, data, len(cases), "(data, scale)", "tensors")


def collect_rowwise(my_rowwise, task: int = 1) -> list[Any]:
    """Rowwise E4M3: one scale per row (M, 1) or (M,), amax / 448; data * scale close to x."""
    return [
        learner_value(run_learner(task, my_rowwise, x.clone(), forbid=_FORBID_CAST))
        for _, x in _cases(task)
    ]


def judge_rowwise(answers: Any, task: int = 1) -> None:
    import torch

    from course_lib.techniques.fp8 import to_float8

    cases = _cases(task)
    for (what, x), got in zip(cases, _casts(task, answers, cases)):
        data, scale = _unpack(task, got, x)
        if scale.numel() != x.shape[0]:
            fail(task, f"{what}: expected one scale per row ({x.shape[0]}), got {scale.numel()}")
        scale = scale.reshape(-1, 1)
        ours = to_float8(x, scaling="rowwise")
        amax = x.abs().amax(dim=1, keepdim=True)
        nonzero = amax[:, 0] > 0
        want = amax[nonzero] / 448.0
        if not torch.allclose(scale[nonzero], want, rtol=1e-6, atol=0.0):
            fail(
                task,
                f"{what}: scale must be each row's amax / 448 (the largest value lands on 448)",
            )
        _judge_cast(task, what, x, data, scale, ours)
    passed(
        task,
        "rowwise E4M3: one scale per row = amax / 448, outliers stay in their row, zeros stay 0",
    )


check_rowwise = split_check(collect_rowwise, judge_rowwise)


def _gradient_cases(task: int = 2) -> list:
    """Task 2's gradients: magnitudes log-uniform over nine decades below a drawn amax (random
    signs), as the gradients of a real step spread, and one with a few large entries."""
    import math

    import torch

    gen = _generator(task)
    cases = []
    for what, shape in (("gradient", (64, 128)), ("wider gradient", (32, 256))):
        logs = torch.empty(shape).uniform_(math.log(1e-9), 0.0, generator=gen)
        signs = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
        top = 10 ** float(torch.empty(()).uniform_(-6, -2, generator=gen))  # amax, 1e-6..1e-2
        cases.append((what, signs * torch.exp(logs) * top))
    spiky = cases[0][1].clone()
    spiky[0, :4] *= 1e3  # a few large entries: amax far above the rest
    return [*cases, ("gradient with a spike", spiky)]


def collect_grad_cast(grad_cast, task: int = 2) -> list[Any]:
    """``grad_cast(g) -> (data, scale)``: tensorwise E5M2 for gradients, one dequantisation
    scale, ``data.float() * scale`` close to ``g``."""
    return [
        learner_value(run_learner(task, grad_cast, g.clone(), forbid=_FORBID_CAST))
        for _, g in _gradient_cases(task)
    ]


def judge_grad_cast(answers: Any, task: int = 2) -> None:
    import torch

    from course_lib.techniques.fp8 import to_float8

    cases = _gradient_cases(task)
    for (what, g), got in zip(cases, _casts(task, answers, cases)):
        data, scale = _unpack(task, got, g, torch.float8_e5m2)
        if scale.numel() != 1:
            fail(task, f"{what}: a tensorwise cast has one scale, got {scale.numel()}")
        ours = to_float8(g, dtype="e5m2")
        back = data.float() * scale.reshape(1, 1)
        lost = int(((back == 0) & (g != 0)).sum())
        lost_ours = int(((ours.dequantize() == 0) & (g != 0)).sum())
        if lost > lost_ours:
            fail(
                task,
                f"{what}: {lost} of {g.numel()} nonzero values come back as 0 "
                f"(the course's cast of the same tensor loses {lost_ours})",
            )
        _judge_cast(task, what, g, data, scale.reshape(1, 1), ours)
    passed(task, "your gradient cast keeps what the course's E5M2 cast keeps, as accurately")


check_grad_cast = split_check(collect_grad_cast, judge_grad_cast)


def _fsdp_answer(world_size: int) -> tuple[float, float]:
    """(bytes each rank sends in the step's all-gathers, model-state bytes per GPU): the
    course's own estimate.fp8 functions on Llama-2-13B, FP8 linear weights, bf16 the rest."""
    from course_lib.measure import estimate

    h, f, L, V = (LLAMA2_13B[k] for k in ("hidden", "ffn", "layers", "vocab"))
    linear_layer = 4 * h * h + 3 * h * f
    other = 2 * V * h + (2 * L + 1) * h  # embedding, head, two norms per layer and a final one
    sent = estimate.fsdp_allgather_bytes_sent(
        linear_params=L * linear_layer, other_params=other, world_size=world_size
    )
    memory = estimate.fsdp_fp8_memory_per_gpu(
        L * linear_layer + other, world_size, largest_layer_params=linear_layer
    )["total"]
    return float(sent), float(memory)


def fsdp_sizes(task: int) -> list[int]:
    """Task 3's three cluster sizes, drawn from the grading seed: two powers of two, one not."""
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, UNIT)
    return sorted([*rng.sample(FSDP_SIZES, 2), rng.choice(FSDP_ODD_SIZES)])


def collect_fsdp_fp8(fsdp_fp8_step, task: int = 3) -> list[Any]:
    """``fsdp_fp8_step(world_size) -> (allgather_bytes_sent, model_state_bytes)``, ints, for
    Llama-2-13B at three cluster sizes drawn from the grading seed, each within 1 byte."""
    return [
        learner_value(run_learner(task, fsdp_fp8_step, n, forbid=_FORBID_BYTES))
        for n in fsdp_sizes(task)
    ]


def judge_fsdp_fp8(answers: Any, task: int = 3) -> None:
    sizes = fsdp_sizes(task)
    need_list(task, answers, len(sizes), "answer", "cluster sizes")
    for n, got in zip(sizes, answers):
        if not (isinstance(got, tuple) and len(got) == 2):
            fail(task, f"fsdp_fp8_step({n}): expected a tuple (allgather_bytes, memory_bytes)")
        sent, mem = (expect_int(task, f"fsdp_fp8_step({n})[{i}]", v) for i, v in enumerate(got))
        want_sent, want_mem = _fsdp_answer(n)
        for what, value, want in (
            ("all-gather bytes", sent, want_sent),
            ("model-state bytes", mem, want_mem),
        ):
            if abs(value - want) > 1:
                fail(
                    task,
                    f"fsdp_fp8_step({n}) {what}: you gave {value:,}, "
                    f"{'more' if value > want else 'less'} than an FP8 all-gather of Llama-2-13B",
                )
    passed(
        task,
        "Llama-2-13B, FP8 all-gather: bytes sent and model states per GPU exact at three drawn "
        "cluster sizes",
    )


check_fsdp_fp8 = split_check(collect_fsdp_fp8, judge_fsdp_fp8)
