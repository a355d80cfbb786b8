"""Unit 05's check of task 3 (find the bug): ``MyOffloadAdamW``'s ``step`` against AdamW (fp32)
and the master-weights recipe (bf16), bit for bit. Re-exported by :mod:`.checks`."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, split_check

UNIT = "u05_cpu_offload"
STEPS = 5
# (not techniques.optim.MasterWeights: its step is decorated with @torch.no_grad(), whose wrapper
# code every decorated function shares, so forbidding it would refuse any learner's decorated step)
_FORBID_3 = ["course_lib.techniques.offload:OffloadAdamW"]

# ---------------------------------------------------------------------------------- task 3
_DTYPES = ("float32", "bfloat16")


def _offload_run(dtype_name: str, task: int, step_fn):
    """A GPT drawn from the grading seed in ``dtype_name``, trained ``STEPS`` steps; after each
    backward, ``step_fn(model)`` (built once, on the model) steps it. Its parameters at the end."""
    import torch

    from course_lib.data import permutation_batch
    from course_lib.models import GPT, GPTConfig

    rng = case_rng(task, UNIT)
    config = GPTConfig.tiny(
        n_layer=rng.randint(1, 2), n_embd=rng.choice((16, 24, 32, 48)), block_size=16
    )
    torch.manual_seed(rng.getrandbits(31))
    model = GPT(config).to(getattr(torch, dtype_name))
    step = step_fn(model)
    gen = torch.Generator().manual_seed(rng.getrandbits(63))
    for _ in range(STEPS):
        idx, tgt = permutation_batch(config, 4, 16, generator=gen)
        for p in model.parameters():
            p.grad = None
        model.loss(idx, tgt).backward()
        step()
    return [p.detach().clone() for p in model.parameters()]


def _master_layout(opt) -> list | None:
    """``opt.master`` as [dtype, device type] per tensor (None for anything else in it), or None
    when it is not a sequence of tensors."""
    import torch

    master = getattr(opt, "master", None)
    if master is None or isinstance(master, torch.Tensor):
        return None
    try:
        return [[m.dtype, m.device.type] if isinstance(m, torch.Tensor) else None for m in master]
    except Exception:  # noqa: BLE001 - whatever the learner put there, the judge says what is wrong
        return None


def collect_offload_step(MyOffloadAdamW, task: int = 3) -> dict[str, Any]:
    """Task 3: the parameters after ``STEPS`` steps of the learner's optimizer, on an fp32 and a
    bf16 model, and the layout of its host copies (``opt.master``); also the number of threads
    torch ran them with (the judge's reference runs with as many: CPU matmuls split over another
    number of threads sum in another order, and the bits differ)."""
    import torch

    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    for dtype_name in _DTYPES:
        made: dict[str, Any] = {}

        def learner_step(model, made=made):
            opt = run_learner(task, MyOffloadAdamW, model.parameters(), lr=1e-3, forbid=_FORBID_3)
            made["master"] = _master_layout(opt)
            return lambda: run_learner(task, opt.step, forbid=_FORBID_3)

        params = _offload_run(dtype_name, task, learner_step)
        out[dtype_name] = {"master": made["master"], "params": params}
    return out


def _recipe_step(model):
    """The master-weights recipe (Micikevicius et al. 2017), written out: fp32 host copies
    stepped by AdamW, copied back into the model."""
    import torch

    params = list(model.parameters())
    master = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
    inner = torch.optim.AdamW(master, lr=1e-3)

    @torch.no_grad()
    def step():
        for p, m in zip(params, master):
            assert p.grad is not None, "backward gives every parameter a gradient"
            m.grad = p.grad.float()
        inner.step()
        for p, m in zip(params, master):
            p.copy_(m)

    return step


def _master_ok(layout: Any) -> bool:
    import torch

    return (
        isinstance(layout, list)
        and bool(layout)
        and all(
            isinstance(m, list) and len(m) == 2 and m[0] == torch.float32 and m[1] == "cpu"
            for m in layout
        )
    )


def _with_threads(threads: int, fn, *args):
    """``fn(*args)`` with torch's intra-op threads set to ``threads``, then set back."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


def judge_offload_step(data: Any, task: int = 3) -> None:
    """Bit-for-bit parity on an fp32 and a bf16 model after STEPS steps."""
    import torch

    threads = need(task, data, "threads", int, "number of threads")
    if not 1 <= threads <= 4096:
        fail(task, f"the run handed back {threads} threads")
    for dtype_name in _DTYPES:
        run = need(task, data, dtype_name, dict, f"run of the {dtype_name} model")
        if not _master_ok(run.get("master")):
            fail(
                task,
                "opt.master must hold the fp32 host copies of the parameters (keep the given __init__)",
            )
        expected = _with_threads(threads, _offload_run, dtype_name, task, _recipe_step)
        got_all = need(task, run, "params", list, f"parameters of the {dtype_name} model")
        if len(got_all) != len(expected) or not all(isinstance(g, torch.Tensor) for g in got_all):
            fail(task, f"the run handed back no parameters of the {dtype_name} model")
        for i, (g, e) in enumerate(zip(got_all, expected)):
            if g.dtype != e.dtype or not torch.equal(g, e):
                n_diff = int((g.float() != e.float()).sum()) if g.shape == e.shape else -1
                fail(
                    task,
                    f"{dtype_name} model: parameter {i} differs from the "
                    f"master-weights recipe after {STEPS} steps in {n_diff} of {e.numel()} "
                    "elements (which copy decides what the host updates?)",
                )
    passed(
        task,
        f"same bits as AdamW (fp32) and as the master-weights recipe (bf16) after {STEPS} steps",
    )


check_offload_step = split_check(collect_offload_step, judge_offload_step)
