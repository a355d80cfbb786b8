"""Unit 04's checks of tasks 4 and 6, byte accounting: the peak of a 16-byte-recipe step,
predicted (against MemoryMeter), and ZeRO-1 model state per GPU at 7B and 70B (against
``estimate.zero_bytes_per_rank``). Re-exported by :mod:`.checks`.

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function
on the drawn cases and hands back its answers; ``judge_X`` measures or computes what is expected
and prints the verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need_list, split_check

UNIT = "u04_optimizer_memory"

# ---------------------------------------------------------------------------------- task 4
#: task 4's MLPs of the default seed (widths in, hidden..., out; every Linear has a bias):
#: configurations the lecture never showed; :func:`peak_widths` draws them per seed
PEAK_WIDTHS = ((300, 1000, 700, 50), (96, 2048, 128))


def peak_widths(task: int = 4) -> tuple[tuple[int, ...], ...]:
    """Two MLPs drawn from the grading seed: a deep one and a wide one (its largest layer the
    largest scratch tensor)."""
    rng = case_rng(task, UNIT)
    deep = (
        rng.randint(100, 400),
        rng.randint(500, 1200),
        rng.randint(300, 900),
        rng.randint(8, 64),
    )
    wide = (rng.randint(48, 160), rng.randint(1500, 2500), rng.randint(64, 256))
    return deep, wide


#: task 4's tolerance on the predicted peak, relative. The step counters (4 B per tensor) and the
#: one small tensor torch.optim's loop still holds from the previous parameter stay far below it;
#: forgetting the fp32 gradients, or one of the two scratch tensors, does not.
PEAK_RTOL = 0.01
_FORBID_4 = (
    "course_lib.measure.memory:MemoryMeter",
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
    "course_lib.units.u04_optimizer_memory.run:mixed_precision_accounting",
)


def _measured_master_step_peak(widths: Sequence[int]) -> int:
    """MemoryMeter's peak around the second step of the 16-byte recipe: a bf16 MLP, an fp32 master
    copy, torch.optim.Adam on the master (course_lib.techniques.optim.MasterWeights)."""
    import torch

    from course_lib.measure.memory import MemoryMeter
    from course_lib.models import MLP, MLPConfig
    from course_lib.techniques.optim import MasterWeights

    torch.manual_seed(0)
    model = MLP(MLPConfig(widths[0], tuple(widths[1:-1]), widths[-1])).to(torch.bfloat16)
    mw = MasterWeights(model, "adam", lr=1e-3)
    x = torch.randn(4, widths[0], dtype=torch.bfloat16)
    for step in range(2):  # the first step creates Adam's state; the second is measured
        mw.zero_grad()
        model(x).float().pow(2).mean().backward()
        if step == 0:
            mw.step()
            continue
        with MemoryMeter(model, mw.optimizer, track=mw.master) as mem:
            mw.step()
    return int(mem.peak_bytes)


def collect_predict_step_peak(predict_step_peak: Any, task: int = 4) -> list[Any]:
    """The peak of one step of the 16-byte recipe, predicted, against MemoryMeter (within 1 %)."""
    return [
        run_learner(task, predict_step_peak, list(widths), forbid=_FORBID_4)
        for widths in peak_widths(task)
    ]


def judge_predict_step_peak(data: Any, task: int = 4) -> None:
    from course_lib.grading.core import expect_int

    widths_drawn = peak_widths(task)
    for widths, answer in zip(widths_drawn, need_list(task, data, len(widths_drawn), "answer")):
        got = expect_int(task, f"predict_step_peak({list(widths)})", answer)
        measured = _measured_master_step_peak(widths)
        if not abs(got - measured) <= PEAK_RTOL * measured:
            n = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
            fail(
                task,
                f"widths {list(widths)} ({n:,} parameters): you predicted {got:,} B "
                f"({got / n:.2f} B/param), not within {PEAK_RTOL:.0%} of the peak MemoryMeter "
                "measured during the step. At rest the recipe holds 16 B/param: "
                "what does the step add, and how large is the largest single piece of scratch?",
            )
    passed(
        task,
        f"the step's peak predicted within {PEAK_RTOL:.0%} of MemoryMeter's for "
        f"{len(widths_drawn)} MLPs the lecture did not show",
    )


check_predict_step_peak = split_check(collect_predict_step_peak, judge_predict_step_peak)


# ---------------------------------------------------------------------------------- task 6
#: task 6's models: Llama-2-7B's and Llama-2-70B's parameter counts (Touvron et al. 2023)
SCALE_MODELS = {"7B": 6_738_415_616, "70B": 68_976_648_192}
SCALE_WORLDS = (1, 8, 64)
_FORBID_6 = (
    "course_lib.measure.estimate.zero:zero_bytes_per_rank",
    "course_lib.measure.estimate.zero:zero_state_breakdown_per_rank",
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
)


def _zero1_cases(task: int) -> list[tuple[str, int, bool, int]]:
    """(model, parameters, master, world size) of task 6: a drawn size and world size join the
    fixed ones; every world size divides every size, as with the Llama counts."""
    rng = case_rng(task, UNIT)
    models = {**SCALE_MODELS, "drawn": 256 * rng.randint(4_000_000, 1_500_000_000)}
    worlds = (*SCALE_WORLDS, rng.choice((2, 4, 16, 32, 128, 256)))
    return [
        (name, n, master, world)
        for name, n in models.items()
        for master in (True, False)
        for world in worlds
    ]


def collect_zero1_at_scale(zero1_bytes: Any, task: int = 6) -> list[Any]:
    """Model state per GPU under ZeRO stage 1, 16-byte and 12-byte accountings, 7B and 70B, against
    ``estimate.zero_bytes_per_rank`` (k = 12 with the master copy, 8 without)."""
    return [
        run_learner(task, zero1_bytes, n, world, master, forbid=_FORBID_6)
        for _, n, master, world in _zero1_cases(task)
    ]


def judge_zero1_at_scale(data: Any, task: int = 6) -> None:
    from course_lib.grading.core import expect_int
    from course_lib.measure import estimate

    cases = _zero1_cases(task)
    for (name, n, master, world), answer in zip(cases, need_list(task, data, len(cases), "answer")):
        got = expect_int(task, f"zero1_bytes({n:,}, {world}, master={master})", answer)
        expected = estimate.zero_bytes_per_rank(n, stage=1, world_size=world, k=12 if master else 8)
        if got != expected:
            what = "16-byte (fp32 master)" if master else "12-byte (no master)"
            fail(
                task,
                f"{name} ({n:,} parameters), {what} accounting, ZeRO-1 over {world} GPU(s): "
                f"{got:,} B per GPU is not the ZeRO-1 model state. Which parts are sharded, "
                "and which stay whole on every GPU?",
            )
    seven = estimate.zero_bytes_per_rank(SCALE_MODELS["7B"], stage=1, world_size=1, k=12)
    seventy = estimate.zero_bytes_per_rank(SCALE_MODELS["70B"], stage=1, world_size=64, k=8)
    passed(
        task,
        f"{len(cases)} configurations equal estimate's ZeRO-1 bytes "
        f"(7B unsharded, 16 B/param: {seven / 1e9:.1f} GB; 70B over 64 GPUs, 12 B/param: "
        f"{seventy / 1e9:.1f} GB per GPU)",
    )


check_zero1_at_scale = split_check(collect_zero1_at_scale, judge_zero1_at_scale)
