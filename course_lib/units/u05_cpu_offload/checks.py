"""Checks for the exercises of unit 05 (solutions/05_cpu_offload.ipynb).

Task 1 (predict, graded against a measurement): ``predict_step_time(parts, overlap)`` from the
measured parts of an offloaded step (seconds: ``compute``, ``to_host``, ``store_read``,
``host_adam``, ``store_write``, ``to_device``). With ``overlap=False`` it is compared with the
step's total, timed by its own clock around the whole step: the median over steps of
prediction / measurement must lie within 1 +- ``STEP_RTOL`` (the parts are timed inside the
same step, so the gap is the few microseconds between timers; a preempted step is an outlier the
median ignores). With ``overlap=True`` it must equal max(compute, to_host + to_device,
host_adam, store_read + store_write) to rtol 1e-9 (no synchronous step can measure that).
Task 2 (decide from a budget): ``choose_offload(n_params, budget_bytes, activation_bytes)``:
the least offloaded level of ``OFFLOAD_LEVELS`` whose device bytes (bf16-mixed AdamW) plus the
activations fit, or None; several cases, exact.
Task 3 (find the bug): ``MyOffloadAdamW``'s ``step``: bit for bit the same parameters as AdamW
on an fp32 model and as the master-weights recipe on a bf16 model after ``STEPS`` steps (the host
runs the same AdamW on the same fp32 numbers: the bits agree, so the tolerance is 0).
"""

from __future__ import annotations

from course_lib.grading.core import fail, passed, run_learner

__all__ = [
    "check_step_time",
    "check_choose_offload",
    "check_offload_step",
    "OFFLOAD_LEVELS",
    "STEP_RTOL",
    "STEPS",
]

OFFLOAD_LEVELS = ("none", "optimizer", "optimizer+grads", "all")
STEP_RTOL = 0.1
STEPS = 5
_PARTS = ("compute", "to_host", "store_read", "host_adam", "store_write", "to_device")
_FORBID_1 = [
    "course_lib.measure.estimate.offload:offload_step_time",
    "course_lib.units.u05_cpu_offload.run_bandwidth:predicted_step_times",
]
_FORBID_2 = ["course_lib.measure.estimate.offload:offload_split"]
# (not techniques.optim.MasterWeights: its step is decorated with @torch.no_grad(), whose wrapper
# code every decorated function shares, so forbidding it would refuse any learner's decorated step)
_FORBID_3 = ["course_lib.techniques.offload:OffloadAdamW"]


def _number(task, what, value):
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(task, f"{what}: expected a float (seconds), got {type(value).__name__} {value!r}")
    return float(value)


def check_step_time(predict_step_time, task: int = 1) -> None:
    """Measure offloaded steps (state in a file) and compare the learner's prediction."""
    import dataclasses
    import statistics

    from course_lib.units.u05_cpu_offload.run import CONFIG, step_breakdown

    df = step_breakdown(
        tier="file", steps=7, config=dataclasses.replace(CONFIG, n_layer=1), batch=2
    )
    ratios, unbalanced = [], 0
    for _, row in df.iterrows():
        parts = {k: float(row[k]) for k in _PARTS}
        got = _number(
            task,
            "predict_step_time(parts, overlap=False)",
            run_learner(task, predict_step_time, dict(parts), False, forbid=_FORBID_1),
        )
        ratios.append(got / float(row["total"]))
        over = _number(
            task,
            "predict_step_time(parts, overlap=True)",
            run_learner(task, predict_step_time, dict(parts), True, forbid=_FORBID_1),
        )
        expected = max(
            parts["compute"],
            parts["to_host"] + parts["to_device"],
            parts["host_adam"],
            parts["store_read"] + parts["store_write"],
        )
        if abs(over - expected) > 1e-9 * expected:
            fail(
                task,
                f"overlap=True: expected {expected * 1e3:.3f} ms (the slowest of compute, "
                f"to_host + to_device, host_adam, store_read + store_write), got {over * 1e3:.3f} ms",
            )
        unbalanced += max(parts.values()) > (1 - STEP_RTOL) * sum(parts.values())
    ratio = statistics.median(ratios)
    if not abs(ratio - 1) <= STEP_RTOL:
        fail(
            task,
            f"overlap=False: your prediction / the measured step = {ratio:.3f} (median of "
            f"{len(ratios)} steps), expected 1 +- {STEP_RTOL:g}: a synchronous step runs "
            "its parts one after the other",
        )
    passed(
        task,
        f"serial prediction matches the measured offloaded steps (median ratio within "
        f"1 +- {STEP_RTOL:g}); overlapped = the slowest part",
    )


def check_choose_offload(choose_offload, task: int = 2) -> None:
    """Exact choice on several budgets (bf16-mixed AdamW, device bytes from the unit's table)."""
    GB = 10**9
    cases = [  # (n_params, budget, activations, expected)
        (1_500_000_000, 80 * GB, 10 * GB, "none"),
        (7_000_000_000, 80 * GB, 10 * GB, "optimizer"),
        (7_000_000_000, 40 * GB, 12 * GB, "optimizer"),  # 28 + 12 = 40: exactly fits
        (7_000_000_000, 24 * GB, 8 * GB, "optimizer+grads"),
        (13_000_000_000, 24 * GB, 4 * GB, "all"),
        (70_000_000_000, 80 * GB, 90 * GB, None),  # activations alone do not fit
    ]
    for n, budget, act, expected in cases:
        got = run_learner(task, choose_offload, n, budget, act, forbid=_FORBID_2)
        if got is not None and not isinstance(got, str):
            fail(task, f"expected a level name (str) or None, got {type(got).__name__} {got!r}")
        if got != expected:
            fail(
                task,
                f"choose_offload({n / 1e9:g}e9 params, budget {budget / GB:g} GB, activations "
                f"{act / GB:g} GB): expected {expected!r}, got {got!r}",
            )
    passed(task, f"the least offload that fits, in all {len(cases)} cases")


def _run_offload(MyOffloadAdamW, dtype, task, *, learner: bool):
    import torch

    from course_lib.data import permutation_batch
    from course_lib.models import GPT, GPTConfig

    config = GPTConfig.tiny(n_layer=1, n_embd=32, block_size=16)
    torch.manual_seed(0)
    model = GPT(config).to(dtype)
    if learner:
        opt = run_learner(task, MyOffloadAdamW, model.parameters(), lr=1e-3, forbid=_FORBID_3)
        master = getattr(opt, "master", None)
        if not master or any(m.dtype != torch.float32 or m.device.type != "cpu" for m in master):
            fail(
                task,
                "opt.master must hold the fp32 host copies of the parameters (keep the given __init__)",
            )
    else:
        params = [p for p in model.parameters()]
        master = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
        inner = torch.optim.AdamW(master, lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        idx, tgt = permutation_batch(config, 4, 16, generator=gen)
        for p in model.parameters():
            p.grad = None
        model.loss(idx, tgt).backward()
        if learner:
            run_learner(task, opt.step, forbid=_FORBID_3)
        else:  # the master-weights recipe (Micikevicius et al. 2017), written out
            with torch.no_grad():
                for p, m in zip(params, master):
                    assert p.grad is not None, "backward gives every parameter a gradient"
                    m.grad = p.grad.float()
                inner.step()
                for p, m in zip(params, master):
                    p.copy_(m)
    return [p.detach().clone() for p in model.parameters()]


def check_offload_step(MyOffloadAdamW, task: int = 3) -> None:
    """Bit-for-bit parity on an fp32 and a bf16 model after STEPS steps."""
    import torch

    for dtype in (torch.float32, torch.bfloat16):
        expected = _run_offload(MyOffloadAdamW, dtype, task, learner=False)
        got = _run_offload(MyOffloadAdamW, dtype, task, learner=True)
        for i, (g, e) in enumerate(zip(got, expected)):
            if g.dtype != e.dtype or not torch.equal(g, e):
                n_diff = int((g.float() != e.float()).sum()) if g.shape == e.shape else -1
                fail(
                    task,
                    f"{str(dtype).removeprefix('torch.')} model: parameter {i} differs from the "
                    f"master-weights recipe after {STEPS} steps in {n_diff} of {e.numel()} "
                    "elements (which copy decides what the host updates?)",
                )
    passed(
        task,
        f"same bits as AdamW (fp32) and as the master-weights recipe (bf16) after {STEPS} steps",
    )
