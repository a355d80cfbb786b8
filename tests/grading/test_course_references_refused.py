"""Every graded task of units 00-04, 08 and 13 refuses a learner answer that calls the course's
own answer (or PyTorch's, where the check compares with it): the verdict is "uses the course's
own <name>", never a pass. One notebook is graded end to end the way a learner's would be."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

from course_lib import models
from course_lib.measure import estimate
from course_lib.parallel import collectives as C
from course_lib.techniques import accumulation, optim, precision
from course_lib.units import (
    u00_start_here as u00,
)
from course_lib.units import (
    u01_backprop_memory as u01,
)
from course_lib.units import (
    u02_batch_size_and_accumulation as u02,
)
from course_lib.units import (
    u03_mixed_precision as u03,
)
from course_lib.units import (
    u04_optimizer_memory as u04,
)
from course_lib.units import (
    u08_collectives as u08,
)
from course_lib.units import (
    u13_interconnects_and_backends as u13,
)

REPO = Path(__file__).resolve().parents[2]


class SubclassedScaler(precision.DynamicLossScaler):
    """A learner's "own" scaler that only renames the course's."""


class WrappedAdamW(torch.optim.AdamW):
    """PyTorch's AdamW behind the task's signature."""

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def _link_time(n_params, dtype, world_size, link):
    size = n_params * estimate.dtype_bytes(dtype)
    return estimate.allreduce_time_on_link(
        size, world_size, estimate.link_speed(link).per_direction_GBps
    )


def _cluster_time(n_params):
    size = 2 * n_params
    return {
        "node": estimate.allreduce_time_on_link(size, 8, 450),
        "cluster": estimate.hierarchical_allreduce_time(
            size, nodes=4, gpus_per_node=8, intra_GBps=450, inter_GBps=50
        ),
    }


def _predict_with_fit(sizes, times, size):
    alpha, beta = estimate.fit_alpha_beta(sizes, times, relative=True)
    return alpha + beta * size


def _measure_straggler(sleeps):
    return u08.run.straggler(sleeps)["in_all_reduce_s"].tolist()


def _average_with_the_course_ring(grad):
    import torch.distributed as dist

    return C.ring_all_reduce(grad.clone()) / dist.get_world_size()


def _metered_eval(model, batches):
    """A fixed loop that asks the course's meter how much it kept (the meter is out of reach)."""
    from course_lib.measure.memory import MemoryMeter

    with torch.no_grad(), MemoryMeter(model):
        return torch.cat([model(x) for x in batches])


def _scale_up(n_layer, n_embd, n_head, vocab_size, seq):
    n = estimate.gpt_param_count(
        n_layer=n_layer, n_embd=n_embd, vocab_size=vocab_size, block_size=seq
    )
    cfg = models.GPTConfig(
        vocab_size=vocab_size, block_size=seq, n_layer=n_layer, n_head=n_head, n_embd=n_embd
    )
    return {
        "params": n,
        "model_state": 16 * n,
        "activations": estimate.activation_bytes_gpt(cfg, 1, seq),
    }


CHEATS = {  # id: (check, the learner's answer that calls the reference, the name refused)
    "u00-1": (u00.checks.check_count_parameters, models.count_params, "count_params"),
    "u00-2": (
        u00.checks.check_parameter_bytes,
        lambda m, dt: models.count_params(m) * torch.finfo(dt).bits // 8,
        "count_params",
    ),
    "u00-3": (
        u00.checks.check_adam_training_bytes,
        lambda n: estimate.model_state_bytes(n)["total"],
        "model_state_bytes",
    ),
    "u00-4": (
        u00.checks.check_predict_measured_state,
        lambda m: {
            k: estimate.model_state_bytes(models.count_params(m))[k]
            for k in ("params", "grads", "optimizer")
        },
        "count_params",
    ),
    "u00-5": (
        lambda fn: u00.checks.check_weight_bytes_bug("b", fn),
        lambda m, dt: models.count_params(m) * torch.finfo(dt).bits // 8,
        "count_params",
    ),
    "u01-1": (
        u01.checks.check_optimizer_state_bytes,
        lambda model, opt: (
            models.count_params(model) * estimate.optimizer_state_bytes_per_param(opt)
        ),
        "optimizer_state_bytes_per_param",
    ),
    "u01-2": (
        u01.checks.check_predict_step_memory,
        lambda model, shape, opt: estimate.model_state_bytes(models.count_params(model)),
        "model_state_bytes",
    ),
    "u01-3": (
        u01.checks.check_gpt_activation_bytes,
        estimate.activation_bytes_gpt,
        "activation_bytes_gpt",
    ),
    "u01-4": (
        lambda fn: u01.checks.check_eval_memory_bug("b", fn),
        _metered_eval,
        "MemoryMeter.__init__",
    ),
    "u01-5": (u01.checks.check_scale_up, _scale_up, "gpt_param_count"),
    "u02-1": (
        u02.checks.check_matmul_intensity,
        lambda m, n, k, b: estimate.matmul_arithmetic_intensity(m, n, k, dtype_bytes=b),
        "matmul_arithmetic_intensity",
    ),
    "u02-2": (
        u02.checks.check_plan_accumulation,
        lambda t, mx, w: (mx, t // accumulation.effective_batch(mx, 1, w)),
        "effective_batch",
    ),
    "u02-3": (
        u02.checks.check_accumulation_step,
        accumulation.accumulation_step,
        "accumulation_step",
    ),
    "u02-4": (
        u02.checks.check_largest_batch,
        lambda m, b: u02.run.largest_batch_that_fits(
            m,
            u02.run.MemoryBudget.for_device("cpu", simulated_bytes=b),
            multiple_of=1,
            device="cpu",
        )["batch"],
        "largest_batch_that_fits",
    ),
    "u02-5": (
        lambda fn: u02.checks.check_uneven_accumulation("b", fn),
        accumulation.accumulation_step,
        "accumulation_step",
    ),
    "u02-6": (
        u02.checks.check_gpus_needed,
        lambda n, t, d, p, u: estimate.gpus_for_training(n, t, days=d, peak_flops=p, mfu=u),
        "gpus_for_training",
    ),
    "u03-1": (
        u03.checks.check_underflow_recovery,
        precision.DynamicLossScaler,
        "DynamicLossScaler",
    ),
    "u03-2": (u03.checks.check_scale_schedule, SubclassedScaler, "DynamicLossScaler"),
    "u03-3": (u03.checks.check_fp16_training, precision.DynamicLossScaler, "DynamicLossScaler"),
    "u03-4": (
        u03.checks.check_predict_bf16_weight,
        lambda w, u, s: float(u03.run.tiny_updates(weight=w, update=u, steps=s).iloc[1]["final"]),
        "tiny_updates",
    ),
    "u03-5": (
        u03.checks.check_clip_bug,
        lambda model, opt, batches, scale, max_norm: precision.DynamicLossScaler(init_scale=scale),
        "DynamicLossScaler",
    ),
    "u03-6": (
        u03.checks.check_state_at_scale,
        lambda n, r: estimate.model_state_bytes(n, precision="fp32")["total"],
        "model_state_bytes",
    ),
    "u04-1": (u04.checks.check_adam, optim.Adam, "Adam"),
    "u04-2": (u04.checks.check_adamw, WrappedAdamW, "AdamW"),
    "u04-3": (u04.checks.check_adam_state_bytes, torch.optim.Adam, "Adam"),
    "u04-4": (
        u04.checks.check_predict_step_peak,
        lambda w: estimate.model_state_bytes(
            sum(a * b + b for a, b in zip(w[:-1], w[1:])), precision="bf16-mixed"
        )["total"],
        "model_state_bytes",
    ),
    "u04-5": (
        u04.checks.check_master_bug,
        lambda model, lr: optim.MasterWeights(model, "adam", lr=lr),
        "MasterWeights",
    ),
    "u04-6": (
        u04.checks.check_zero1_at_scale,
        lambda n, w, m: estimate.zero_bytes_per_rank(n, stage=1, world_size=w, k=12 if m else 8),
        "zero_bytes_per_rank",
    ),
    "u08-3": (
        u08.checks.check_composite_bytes,
        lambda s, n: estimate.ring_allreduce_bytes_sent(s, n),
        "ring_allreduce_bytes_sent",
    ),
    "u08-4": (u08.checks.check_straggler_prediction, _measure_straggler, "straggler"),
    "u08-5": (u08.checks.check_fixed_average, _average_with_the_course_ring, "ring_all_reduce"),
    "u08-6": (
        u08.checks.check_scale_bytes,
        lambda p, n, s: estimate.ring_allreduce_bytes_sent(2 * p, n),
        "ring_allreduce_bytes_sent",
    ),
    "u13-1": (
        u13.checks.check_alpha_beta_fit,
        lambda s, t: estimate.fit_alpha_beta(s, t, relative=True),
        "fit_alpha_beta",
    ),
    "u13-2": (
        u13.checks.check_bucket_choice,
        u13.checks.reference_bucket_bytes,
        "reference_bucket_bytes",
    ),
    "u13-3": (u13.checks.check_allreduce_prediction, _link_time, "allreduce_time_on_link"),
    "u13-4": (u13.checks.check_scale_up, _cluster_time, "allreduce_time_on_link"),
    "u13-5": (u13.checks.check_predict_heldout, _predict_with_fit, "fit_alpha_beta"),
}


@pytest.mark.parametrize("case", list(CHEATS))
def test_a_task_answered_by_the_course_is_refused(case):
    check, cheat, name = CHEATS[case]
    with pytest.raises(AssertionError) as info:
        check(cheat)
    assert f"uses the course's own {name}" in str(info.value)
    assert str(info.value).endswith("write it yourself")


def test_ring_tasks_refuse_the_course_rings_inside_the_ranks():
    # the learner's function runs on real ranks; the watch runs there too
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own ring_all_reduce"):
        u08.checks.check_ring_all_reduce(C.ring_all_reduce)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own ring_all_gather"):
        u08.checks.check_ring_all_gather(lambda out, x: C.ring_all_gather(out, x))


def test_a_notebook_that_imports_the_reference_scores_zero(tmp_path):
    from course_lib.grading import grade_notebook

    exercise = nbformat.read(REPO / "exercises" / "04_optimizer_memory.ipynb", as_version=4)
    cheats = {  # the answer cell of each task -> an answer that calls the course's own
        "class MyAdam": "from course_lib.techniques.optim import Adam as MyAdam",
        "def predict_step_peak": (
            "from course_lib.measure import estimate\n"
            "def predict_step_peak(w):\n"
            "    n = sum(a * b + b for a, b in zip(w[:-1], w[1:]))\n"
            "    return estimate.model_state_bytes(n, precision='bf16-mixed')['total']"
        ),
        "class MyMaster": (
            "from course_lib.techniques.optim import MasterWeights\n"
            "def MyMaster(model, lr):\n    return MasterWeights(model, 'adam', lr=lr)"
        ),
        "def zero1_bytes": (
            "from course_lib.measure import estimate\n"
            "def zero1_bytes(n, w, m):\n"
            "    return estimate.zero_bytes_per_rank(n, stage=1, world_size=w, k=12 if m else 8)"
        ),
    }
    for needle, source in cheats.items():
        answer = next(c for c in exercise.cells if c.cell_type == "code" and needle in c.source)
        answer.source = source
    path = tmp_path / "04_optimizer_memory.ipynb"
    nbformat.write(exercise, path)
    report = grade_notebook(path, solutions_dir=REPO / "solutions", timeout=120)
    assert report.score == 0 and report.total > 0
    assert all(
        "uses the course's own" in t.message and t.message.endswith("write it yourself")
        for t in report.tasks
    )
    assert len(report.tasks) == 6


FLOATS = {  # a right number as a float: the task says int, so it fails
    "u00-1": (
        u00.checks.check_count_parameters,
        lambda m: float(sum(p.numel() for p in m.parameters())),
    ),
    "u00-3": (u00.checks.check_adam_training_bytes, lambda n: 16.0 * n),
    "u01-1": (
        u01.checks.check_optimizer_state_bytes,
        lambda m, opt: (
            4.0
            * (
                {"sgd": 0, "momentum": 1, "adam": 2}[opt] * sum(p.numel() for p in m.parameters())
                + (len(list(m.parameters())) if opt == "adam" else 0)
            )
        ),
    ),
    "u02-2": (u02.checks.check_plan_accumulation, lambda t, mx, w: (float(mx), t / (mx * w))),
    "u02-6": (
        u02.checks.check_gpus_needed,
        lambda n, t, d, p, u: float(-(-6 * n * t // int(d * 86_400 * p * u))),
    ),
}


@pytest.mark.parametrize("case", list(FLOATS))
def test_a_float_where_the_task_says_int_is_refused(case):
    check, answer = FLOATS[case]
    with pytest.raises(AssertionError, match=r"must be an int, got float"):
        check(answer)
