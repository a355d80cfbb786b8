"""Unit 01's check of task 4 (find the bug): an evaluation loop that keeps every batch's
activations alive; name the bug and fix it, graded by the measured peak. Re-exported by
:mod:`.checks`.

The peak is measured around the learner's loop by :func:`_peak_created`, the check's own meter:
``MemoryMeter`` is one of the answers the unit's tasks predict, so it is absent from the sandbox
that grades the unit. On these loops it reports what MemoryMeter files as activations plus
temporaries: the bytes of the tensors created inside the block, at their peak. The same meter
measures the bound (one batch's forward with autograd) on the judge's side.
"""

from __future__ import annotations

from typing import Any, Callable

from course_lib.grading.core import fail, fmt_int, passed, run_learner
from course_lib.grading.plain import bug_data, judge_bug
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, split_check

UNIT = "u01_backprop_memory"

#: diagnoses offered for the buggy evaluation loop of solutions/01_backprop_memory.ipynb
EVAL_BUG_CHOICES = {
    "a": "torch.cat copies the outputs, doubling their memory",
    "b": "each kept output holds its batch's autograd graph and every activation saved for backward",
    "c": "the model is in training mode, so it keeps dropout masks",
    "d": "the list keeps the input batches alive",
}
_N_EVAL_BATCHES = 6
#: the meter the lecture measures with: the learner's loop must not open a second one
_EVAL_REFERENCES = ("course_lib.measure.memory:MemoryMeter.__init__",)


def _eval_case(task: int):
    """An MLP and its evaluation batches, sizes drawn from the grading seed."""
    import torch

    from course_lib.models import MLP, MLPConfig

    rng = case_rng(task, UNIT)
    d_in, width = rng.randint(12, 40), rng.randint(64, 128)
    torch.manual_seed(rng.getrandbits(31))
    model = MLP(
        MLPConfig(
            in_features=d_in,
            hidden=(width,) * rng.randint(2, 4),
            out_features=rng.randint(3, 8),
            activation=rng.choice(("gelu", "silu")),
        )
    )
    g = torch.Generator().manual_seed(rng.getrandbits(63))
    batch = rng.randint(24, 48)
    batches = [torch.randn(batch, d_in, generator=g) for _ in range(_N_EVAL_BATCHES)]
    return model, batches


def _peak_created(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Peak bytes of the tensor storage created by torch operators while ``fn()`` runs (views
    and in-place results of tensors that existed already left out), and ``fn()``'s result.

    A ``TorchDispatchMode`` sees every operator's outputs; each new storage counts from its
    creation until it is freed (a weak reference's callback)."""
    import functools
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    count = {"live": 0, "peak": 0}
    known = WeakIdKeyDictionary()

    def freed(nbytes: int, _ref: Any) -> None:
        count["live"] -= nbytes

    class LiveBytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            given = {
                t.untyped_storage().data_ptr()
                for t in tree_flatten((args, kwargs))[0]
                if isinstance(t, torch.Tensor)
            }
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                if storage.data_ptr() in given or storage in known:
                    continue  # a view or an in-place result: no new memory
                nbytes = storage.nbytes()
                known[storage] = weakref.ref(storage, functools.partial(freed, nbytes))
                count["live"] += nbytes
                count["peak"] = max(count["peak"], count["live"])
            return out

    with LiveBytes():
        result = fn()
    return count["peak"], result


def collect_eval_memory_bug(bug: str, predict_all, task: int = 4) -> dict[str, Any]:
    """Task (find the bug): name why the evaluation loop's memory grows with the number of
    batches, and fix it; the fixed loop's measured peak must stay near one batch's."""
    data = bug_data(bug)
    if isinstance(bug, str) and bug.strip().lower() == "b":  # the fix is run only then
        model, batches = _eval_case(task)
        peak, got = _peak_created(
            lambda: run_learner(task, predict_all, model, batches, forbid=_EVAL_REFERENCES)
        )
        data.update(peak=peak, outputs=got)
    return data


def judge_eval_memory_bug(data: Any, task: int = 4) -> None:
    import torch

    judge_bug(
        task,
        data,
        EVAL_BUG_CHOICES,
        "b",
        "that is not what makes the memory grow with the number of batches; look at what each "
        "kept output still refers to",
    )
    model, batches = _eval_case(task)
    # what one batch costs with autograd on (its saved activations and transients), plus the
    # outputs the loop must return: the most a fixed loop may hold at once
    one_batch, _ = _peak_created(lambda: model(batches[0]))
    with torch.no_grad():
        expected = torch.cat([model(x) for x in batches])
    outputs = expected.numel() * expected.element_size()
    allowed = one_batch + outputs
    got = data.get("outputs")
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        fail(
            task,
            f"expected a tensor of shape {tuple(expected.shape)} (every batch's outputs, "
            f"concatenated), got {got!r:.80}",
        )
    if not torch.allclose(got.detach(), expected, rtol=1e-5, atol=1e-6):
        fail(task, "the outputs differ from the model's outputs on the batches")
    peak = need(task, data, "peak", int, "measured peak")
    if peak > allowed:
        fail(
            task,
            f"measured peak of {fmt_int(peak)} B over {_N_EVAL_BATCHES} batches; one batch's "
            f"forward with autograd plus the outputs is {fmt_int(allowed)} B: autograd still "
            f"records a graph for the batches (evaluate with autograd off)",
        )
    passed(
        task,
        f"bug named and the fixed loop's measured peak stays within one batch's forward "
        f"plus the outputs over {_N_EVAL_BATCHES} batches",
    )


check_eval_memory_bug = split_check(collect_eval_memory_bug, judge_eval_memory_bug)
