"""Unit 04's check of task 5 (find the bug): the master-weights class whose master copy is
overwritten by the rounded weights. Re-exported by :mod:`.checks`.

The check is split (:mod:`course_lib.grading.split`): ``collect_master_bug`` trains with the
learner's class and hands back its master copy and the model's weights; ``judge_master_bug`` runs
the recipe done right and compares."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import type_name
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, split_check

UNIT = "u04_optimizer_memory"

# ---------------------------------------------------------------------------------- task 5
#: task 5's run: steps, learning rate (small: Adam moves each weight by about lr per step, below
#: half of bf16's spacing for most weights) and tolerance on the master copy (same ops in fp32:
#: equal to a few ulps)
MASTER_STEPS, MASTER_LR, MASTER_RTOL, MASTER_ATOL = 12, 1e-4, 1e-5, 1e-7
#: the course's own answer, out of reach while the learner's class runs
_FORBID_5 = ("course_lib.techniques.optim:MasterWeights",)


def _master_task(task: int):
    """A bf16 MLP and its batches, sizes and data drawn from the grading seed."""
    import torch

    from course_lib.models import MLP, MLPConfig

    rng = case_rng(task, UNIT)
    d_in, hidden, d_out = rng.randint(16, 48), rng.randint(32, 96), rng.randint(4, 12)
    torch.manual_seed(rng.getrandbits(31))
    model = MLP(MLPConfig(d_in, (hidden,), d_out)).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(rng.getrandbits(63))
    batches = [
        (
            torch.randn(16, d_in, generator=gen).to(torch.bfloat16),
            torch.randn(16, d_out, generator=gen),
        )
        for _ in range(MASTER_STEPS)
    ]
    return model, batches


def _master_reference(task: int):
    """The recipe done right, written out (not the learner's code)."""
    import torch

    model, batches = _master_task(task)
    params = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adam(master, lr=MASTER_LR)
    for x, y in batches:
        for p in params:
            p.grad = None
        (model(x).float() - y).pow(2).mean().backward()
        with torch.no_grad():
            for p, m in zip(params, master):
                m.grad = p.grad.float()
            opt.step()
            for p, m in zip(params, master):
                p.copy_(m)
    return [p.detach().clone() for p in params], [m.detach().clone() for m in master]


def _same_as_reference(task: int, master: list, ref_m: list, weights: list) -> None:
    """✗ unless the master equals the recipe done right and the weights are it rounded to bf16."""
    import torch

    for i, (m, r) in enumerate(zip(master, ref_m)):
        if tuple(m.shape) != tuple(r.shape) or not torch.allclose(
            m, r, rtol=MASTER_RTOL, atol=MASTER_ATOL
        ):
            fail(
                task,
                f"master tensor {i}: differs from the recipe done right after {MASTER_STEPS} steps, "
                f"max abs error {float((m - r).abs().max()):.3g} (rtol={MASTER_RTOL:g}, atol={MASTER_ATOL:g})",
            )
    for i, (w, m) in enumerate(zip(weights, master)):
        if w.dtype != torch.bfloat16 or not torch.equal(w, m.to(torch.bfloat16)):
            fail(
                task,
                f"parameter {i}: the bf16 weights are not the master rounded to bf16 after the last step",
            )


def collect_master_bug(MyMaster, task: int = 5) -> dict[str, Any]:
    """The fixed master-weights class: same fp32 master and bf16 weights as the recipe done right."""
    import torch

    model, batches = _master_task(task)
    mw = run_learner(task, MyMaster, model, lr=MASTER_LR, forbid=_FORBID_5)
    for x, y in batches:
        run_learner(task, mw.zero_grad, forbid=_FORBID_5)
        (model(x).float() - y).pow(2).mean().backward()
        run_learner(task, mw.step, forbid=_FORBID_5)
    master = run_learner(task, lambda: list(getattr(mw, "master", None) or []))
    return {
        # the learner's tensors as plain data (their values, no autograd history)
        "master": [m.detach().clone() if isinstance(m, torch.Tensor) else m for m in master],
        "weights": [p.detach().clone() for p in model.parameters()],
    }


def judge_master_bug(data: Any, task: int = 5) -> None:
    import torch

    ref_w, ref_m = _master_reference(task)
    start = [p.detach().clone() for p in _master_task(task)[0].parameters()]
    master = need(task, data, "master", list, "master copy")
    if len(master) != len(ref_m) or any(
        not isinstance(m, torch.Tensor) or m.dtype != torch.float32 for m in master
    ):
        fail(
            task,
            f"expected .master to be the {len(ref_m)} fp32 master tensors, got "
            f"{[str(getattr(m, 'dtype', type_name(m))) for m in master]}",
        )
    weights = need(task, data, "weights", list, "model's weights")
    if len(weights) != len(start) or any(
        not isinstance(w, torch.Tensor) or w.shape != s.shape for w, s in zip(weights, start)
    ):
        fail(task, f"the run handed back {len(weights)} weights, not the model's {len(start)}")
    if all(torch.equal(w, s) for w, s in zip(weights, start)):
        fail(
            task,
            f"after {MASTER_STEPS} steps at lr={MASTER_LR:g} the bf16 weights never changed: "
            "does the updated master reach the model?",
        )
    if all(torch.equal(m, m.to(torch.bfloat16).float()) for m in master):
        fail(
            task,
            "every master value is a bf16 number: the master copy keeps nothing finer than the "
            "16-bit weights. Something overwrites it with the rounded weights",
        )
    _same_as_reference(task, master, ref_m, weights)
    passed(
        task,
        f"the master copy accumulates what bf16 cannot hold: {MASTER_STEPS} steps at lr={MASTER_LR:g} "
        "match the recipe done right on an unseen bf16 MLP",
    )


check_master_bug = split_check(collect_master_bug, judge_master_bug)
