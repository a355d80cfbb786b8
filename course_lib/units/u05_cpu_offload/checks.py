"""Checks for the exercises of unit 05 (solutions/05_cpu_offload.ipynb).

Task 1 (predict, graded against a measurement, then applied to a layout the lecture does not
print): ``predict_step_time(parts, overlap, micro_batches)`` from the parts of an offloaded step
(seconds: ``compute`` and ``to_host`` per micro-batch, ``store_read``, ``host_adam``,
``store_write``, ``to_device`` per step), in ZeRO-Offload's layout where each micro-batch's
gradients cross to the host (Ren et al. 2021). With one micro-batch and ``overlap=False`` it is
compared with measured steps, timed by their own clock around the whole step: the median over
steps of prediction / measurement must lie within 1 +- ``STEP_RTOL`` (the parts are timed inside
the same step, so the gap is the few microseconds between timers; a preempted step is an outlier
the median ignores). Then, on steps of 2 to 32 micro-batches drawn from the grading seed, each
with another resource the slowest, serial and overlapped predictions must equal the lecture's
model applied to that layout, rtol 1e-9 (no synchronous step can measure the overlapped one).
Task 2 (decide from a budget): ``choose_offload(n_params, budget_bytes, activation_bytes)``:
the least offloaded level of ``OFFLOAD_LEVELS`` whose device bytes (bf16-mixed AdamW) plus the
activations fit, or None; six cases drawn from the grading seed (each level once, an exact fit,
activations that alone exceed the budget), exact.
Task 3 (find the bug): ``MyOffloadAdamW``'s ``step``: bit for bit the same parameters as AdamW
on an fp32 model and as the master-weights recipe on a bf16 model after ``STEPS`` steps (the host
runs the same AdamW on the same fp32 numbers: the bits agree, so the tolerance is 0).
"""

from __future__ import annotations

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng

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
UNIT = "u05_cpu_offload"
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


def _layout_expected(parts: dict, k: int) -> tuple[float, float]:
    """(serial, overlapped) seconds of a step of ``k`` micro-batches whose gradients cross to the
    host every micro-batch: the lecture's sum and max over the device, the link (both
    directions), the host CPU and the disk, each resource's work added up over the step."""
    link = k * parts["to_host"] + parts["to_device"]
    disk = parts["store_read"] + parts["store_write"]
    serial = k * parts["compute"] + link + parts["host_adam"] + disk
    return serial, max(k * parts["compute"], link, parts["host_adam"], disk)


def _drawn_steps(task: int) -> list[tuple[dict, int]]:
    """Four steps of 2-32 micro-batches drawn from the grading seed; in step i the i-th resource
    (device, link, host, disk) is the slowest, by 10-50 %."""
    rng = case_rng(task, UNIT)
    out = []
    for slowest in range(4):
        k = rng.randint(2, 32)
        parts = {name: rng.randint(1, 40) / 1000 for name in _PARTS}
        _, top = _layout_expected(parts, k)
        target = top * (1 + rng.randint(1, 5) / 10)
        if slowest == 0:
            parts["compute"] = round(target / k, 6)
        elif slowest == 1:
            parts["to_host"] = round((target - parts["to_device"]) / k, 6)
        elif slowest == 2:
            parts["host_adam"] = round(target, 6)
        else:
            parts["store_read"] = round(target - parts["store_write"], 6)
        out.append((parts, k))
    return out


def _check_drawn_steps(predict_step_time, task: int) -> None:
    for parts, k in _drawn_steps(task):
        serial, overlapped = _layout_expected(parts, k)
        for overlap, expected in ((False, serial), (True, overlapped)):
            got = _number(
                task,
                f"predict_step_time(parts, overlap={overlap}, micro_batches={k})",
                run_learner(task, predict_step_time, dict(parts), overlap, k, forbid=_FORBID_1),
            )
            if abs(got - expected) > 1e-9 * expected:
                shown = ", ".join(f"{n} {v * 1e3:g} ms" for n, v in parts.items())
                fail(
                    task,
                    f"{k} micro-batches, overlap={overlap}, parts ({shown}): {got * 1e3:.3f} ms "
                    "is not the lecture's model for this layout (which parts happen once per "
                    "micro-batch, and which resource does each one use?)",
                )


def check_step_time(predict_step_time, task: int = 1) -> None:
    """Measure offloaded steps (state in a file) and compare the learner's prediction, then
    apply it to drawn steps of several micro-batches."""
    import dataclasses
    import statistics

    from course_lib.units.u05_cpu_offload.run import CONFIG, step_breakdown

    df = step_breakdown(
        tier="file", steps=7, config=dataclasses.replace(CONFIG, n_layer=1), batch=2
    )
    ratios = []
    for _, row in df.iterrows():
        parts = {k: float(row[k]) for k in _PARTS}
        got = _number(
            task,
            "predict_step_time(parts, overlap=False)",
            run_learner(task, predict_step_time, dict(parts), False, 1, forbid=_FORBID_1),
        )
        ratios.append(got / float(row["total"]))
        over = _number(
            task,
            "predict_step_time(parts, overlap=True)",
            run_learner(task, predict_step_time, dict(parts), True, 1, forbid=_FORBID_1),
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
                f"one micro-batch, overlap=True: {over * 1e3:.3f} ms is not the slowest resource's "
                "time (the device, the link both ways, the host CPU, the disk)",
            )
    ratio = statistics.median(ratios)
    if not abs(ratio - 1) <= STEP_RTOL:
        fail(
            task,
            f"overlap=False: your prediction / the measured step = {ratio:.3f} (median of "
            f"{len(ratios)} steps), expected 1 +- {STEP_RTOL:g}: a synchronous step runs "
            "its parts one after the other",
        )
    _check_drawn_steps(predict_step_time, task)
    passed(
        task,
        f"serial prediction matches the measured offloaded steps (median ratio within "
        f"1 +- {STEP_RTOL:g}); with gradients sent every micro-batch, serial and overlapped "
        "match on 4 unseen steps",
    )


def _offload_cases(task: int) -> list[tuple[int, int, int, str | None]]:
    """(n_params, budget, activations, the least level that fits) drawn from the grading seed:
    each level once, one budget that fits a level exactly, activations alone over budget."""
    GB = 10**9
    device = {"none": 16, "optimizer": 4, "optimizer+grads": 2, "all": 0}  # bytes per param
    rng = case_rng(task, UNIT)
    exact = rng.choice(("optimizer", "optimizer+grads", "all"))
    cases: list[tuple[int, int, int, str | None]] = []
    above = None
    for level in ("none", "optimizer", "optimizer+grads", "all"):
        n, act = rng.randint(5, 400) * GB // 10, rng.randint(1, 30) * GB
        need = device[level] * n + act
        upper = device[above] * n + act - 1 if above else need + 100 * GB
        cases.append((n, need if level == exact else rng.randint(need, upper), act, level))
        above = level
    n, act = rng.randint(5, 700) * GB // 10, rng.randint(40, 120) * GB
    cases.append((n, act - rng.randint(1, 20) * GB, act, None))  # activations alone do not fit
    n, act = rng.randint(5, 400) * GB // 10, rng.randint(1, 30) * GB
    cases.append((n, 4 * n + act + rng.randint(0, 2 * n), act, "optimizer"))
    rng.shuffle(cases)
    return cases


def check_choose_offload(choose_offload, task: int = 2) -> None:
    """Exact choice on several budgets (bf16-mixed AdamW, device bytes from the unit's table)."""
    GB = 10**9
    cases = _offload_cases(task)
    for n, budget, act, expected in cases:
        got = run_learner(task, choose_offload, n, budget, act, forbid=_FORBID_2)
        if got is not None and not isinstance(got, str):
            fail(task, f"expected a level name (str) or None, got {type(got).__name__} {got!r}")
        if got != expected:
            fail(
                task,
                f"choose_offload({n / 1e9:g}e9 params, budget {budget / GB:g} GB, activations "
                f"{act / GB:g} GB): {got!r} is not the least offload that fits",
            )
    passed(task, f"the least offload that fits, in all {len(cases)} cases")


def _run_offload(MyOffloadAdamW, dtype, task, *, learner: bool):
    import torch

    from course_lib.data import permutation_batch
    from course_lib.models import GPT, GPTConfig

    rng = case_rng(task, UNIT)
    config = GPTConfig.tiny(
        n_layer=rng.randint(1, 2), n_embd=rng.choice((16, 24, 32, 48)), block_size=16
    )
    torch.manual_seed(rng.getrandbits(31))
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
    gen = torch.Generator().manual_seed(rng.getrandbits(63))
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
