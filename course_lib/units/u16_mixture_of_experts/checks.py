"""Unit 16's graded checks (solutions/16_mixture_of_experts.ipynb,
exercises/16_mixture_of_experts.ipynb).

1. ``check_dispatch``: the learner's dispatch plan for expert parallelism (the order that
   sorts this rank's assignments by expert, and the input and output split sizes of
   ``all_to_all_single``), graded on random routings of 2-4 ranks; the course's
   ``dispatch_splits`` and ``ExpertParallel`` are out of reach;
2. ``check_balance_loss``: the load-balancing loss with its bug fixed, graded on random router
   probabilities: its value and its gradient with respect to the probabilities;
3. ``check_mixtral_plan``: Mixtral 8x7B with the experts over a drawn ep on a drawn number of
   GPUs (the lecture prints ep 8 on 128): all-to-all bytes per token and layer, and model-state
   bytes per GPU, ints, against ``estimate`` (whose ``moe`` functions are out of reach);
4. ``check_ep_overlap`` (``checks_overlap``): the tokens per expert at which the experts' matmuls
   hide the all-to-all, at drawn layouts over NVLink and InfiniBand.
Cases come from the grading seed (``course_lib.grading.seeds``). Each check prints one deterministic line or raises AssertionError("✗ task N: ...").

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's code on
the seeded cases and hands back what it returned (and, task 2, the gradient its loss sends back
to the probabilities); ``judge_X`` draws the same cases, computes what is right, and compares.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.plain import learner_value, type_name
from course_lib.grading.split import need_list, split_check
from course_lib.units.u16_mixture_of_experts.checks_overlap import check_ep_overlap

__all__ = ["check_dispatch", "check_balance_loss", "check_mixtral_plan", "check_ep_overlap"]

DISPATCH_REFERENCES = (
    "course_lib.parallel.experts.dispatch:dispatch_splits",
    "course_lib.parallel.experts.dispatch:ExpertParallel.forward",
)
LOSS_REFERENCES = ("course_lib.parallel.experts.moe:load_balancing_loss",)
SCALE_REFERENCES = (
    "course_lib.measure.estimate.moe:ep_all_to_all_bytes_per_token",
    "course_lib.measure.estimate.moe:moe_model_state_bytes_per_rank",
    "course_lib.measure.estimate.moe:moe_param_count",
)


UNIT = "u16_mixture_of_experts"


# ---- task 1 --------------------------------------------------------------------------------
def _ints(task: int, what: str, got: Any, n: int) -> list[int]:
    if not isinstance(got, (list, tuple)) or len(got) != n:
        fail(task, f"{what}: expected a list of {n} ints, got {got!r}")
    return [expect_int(task, f"{what}[{i}]", x) for i, x in enumerate(got)]


#: routings task 1 grades on
DISPATCH_CASES = 12


def _dispatch_cases(task: int) -> list[tuple[int, int, list, int]]:
    """Task 1's routings, drawn from the grading seed: (ranks, experts, routed, rank) each."""
    import torch

    from course_lib.grading.seeds import case_rng

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    cases = []
    for case in range(DISPATCH_CASES):
        w = 2 + case % 3
        e = w * int(torch.randint(1, 4, (1,), generator=g))
        routed = [
            torch.randint(0, e, (int(torch.randint(0, 20, (1,), generator=g)),), generator=g)
            for _ in range(w)
        ]
        routed[0][routed[0] == 0] = 1 % e  # expert 0 gets nothing from rank 0
        cases.append((w, e, routed, case % w))
    return cases


def collect_dispatch(plan, task: int = 1) -> list[Any]:
    """Task: ``plan(routed, rank, n_experts) -> (order, input_splits, output_splits)``.
    ``routed``: one 1-D int64 tensor per rank, the experts of that rank's kept assignments;
    rank r holds experts r E/W .. (r+1) E/W - 1. ``order``: a tensor of indices that sorts
    ``routed[rank]`` by expert, keeping the original order among equal experts;
    ``input_splits``: rows this rank sends to each rank; ``output_splits``: rows it receives
    from each. Graded on 12 random routings of 2, 3 and 4 ranks (some experts empty)."""
    return [
        learner_value(run_learner(task, plan, routed, rank, e, forbid=DISPATCH_REFERENCES))
        for _, e, routed, rank in _dispatch_cases(task)
    ]


def judge_dispatch(data: Any, task: int = 1) -> None:
    import torch

    cases = _dispatch_cases(task)
    need_list(task, data, len(cases), "plan", "routings")
    for case, ((w, e, routed, rank), got) in enumerate(zip(cases, data)):
        if not isinstance(got, tuple) or len(got) != 3:
            fail(task, f"expected (order, input_splits, output_splits), got {type_name(got)}")
        order = got[0]
        want = torch.argsort(routed[rank], stable=True)
        if (
            not isinstance(order, torch.Tensor)
            or order.shape != want.shape
            or not torch.equal(order.long(), want)
        ):
            fail(task, f"case {case + 1} ({w} ranks, {e} experts): order is not the stable sort")
        counts = [torch.bincount(r, minlength=e).view(w, -1) for r in routed]
        send = counts[rank].sum(1).tolist()
        recv = [int(c[rank].sum()) for c in counts]
        for what, value, right in (("input_splits", got[1], send), ("output_splits", got[2], recv)):
            if _ints(task, what, value, w) != right:
                fail(task, f"case {case + 1} (rank {rank} of {w}): {what} = {value}, not right")
    passed(task, "your dispatch plan is right on 12 random routings of 2, 3 and 4 ranks")


check_dispatch = split_check(collect_dispatch, judge_dispatch)


# ---- task 2 --------------------------------------------------------------------------------
def _loss_cases(task: int) -> list[tuple[int, int, int, Any]]:
    """Task 2's batches, drawn from the grading seed: (tokens, experts, top-k, probs) each;
    ``probs`` a fresh leaf that requires grad."""
    import torch

    from course_lib.grading.seeds import case_rng

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    cases = []
    for case in range(6):
        t, e, k = 8 + 3 * case, 4 + case % 3, 1 + case % 2
        cases.append((t, e, k, torch.randn(t, e, generator=g).softmax(-1).requires_grad_()))
    return cases


def _learner_loss(task: int, loss, probs, k: int) -> dict[str, Any]:
    """The learner's loss on one batch: the value, whether it has a gradient, and the gradient
    it sends back to ``probs`` (None where there is none to take)."""
    import torch

    experts = probs.detach().topk(k, dim=-1).indices
    got = run_learner(task, loss, probs, experts, forbid=LOSS_REFERENCES)
    if not isinstance(got, torch.Tensor):
        return {"loss": got, "requires_grad": False, "grad": None}
    grad = None
    if got.numel() == 1 and got.requires_grad:
        (grad,) = torch.autograd.grad(got.reshape(()), probs, allow_unused=True)
    return {"loss": got.detach(), "requires_grad": bool(got.requires_grad), "grad": grad}


def collect_balance_loss(loss, task: int = 2) -> list[dict[str, Any]]:
    """Task: ``loss(probs, experts) -> scalar tensor``: Switch's load-balancing loss
    E sum_i f_i P_i (f_i: share of the assignments in ``experts`` (T, k) that chose expert i;
    P_i: mean of ``probs`` (T, E) over the tokens). Graded on 6 random batches: the value and
    its gradient with respect to ``probs``."""
    return [_learner_loss(task, loss, probs, k) for _, _, k, probs in _loss_cases(task)]


def judge_balance_loss(data: Any, task: int = 2) -> None:
    import torch

    cases = _loss_cases(task)
    need_list(task, data, len(cases), "loss", "batches")
    for case, ((t, e, k, probs), res) in enumerate(zip(cases, data)):
        got = res.get("loss") if isinstance(res, dict) else None
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            fail(task, f"expected a scalar tensor, got {got!r}")
        experts = probs.detach().topk(k, dim=-1).indices
        f = torch.bincount(experts.reshape(-1), minlength=e).float() / experts.numel()
        want = e * (f * probs.mean(0)).sum()
        if not torch.allclose(got.reshape(()).to(want.dtype), want.detach(), atol=1e-6):
            fail(
                task,
                f"case {case + 1} ({t} tokens, {e} experts, top-{k}): your loss is "
                f"{float(got):.6g}, {'below' if got < want else 'above'} E sum_i f_i P_i",
            )
        if res.get("requires_grad") is not True:
            fail(task, f"case {case + 1}: the loss has no gradient: the router would learn nothing")
        mine = res.get("grad")
        (right,) = torch.autograd.grad(want, probs)
        if (
            not isinstance(mine, torch.Tensor)
            or (mine.shape, mine.dtype) != (right.shape, right.dtype)
            or not torch.allclose(mine, right, atol=1e-6)
        ):
            fail(task, f"case {case + 1}: the gradient reaching the router probabilities differs")
    passed(task, "your balancing loss and its gradient are right on 6 random batches")


check_balance_loss = split_check(collect_balance_loss, judge_balance_loss)


# ---- task 3 --------------------------------------------------------------------------------
#: (ep, gpus) task 3 draws from: never the lecture's ep 8 on 128 GPUs
MIXTRAL_PLANS = tuple(
    (ep, gpus) for ep in (2, 4, 8) for gpus in (16, 32, 64, 256) if (ep, gpus) != (8, 128)
)


def _mixtral_plan(task: int) -> tuple[int, int]:
    from course_lib.grading.seeds import case_rng

    return case_rng(task, UNIT).choice(MIXTRAL_PLANS)


def collect_mixtral_plan(fn, task: int = 3) -> Any:
    """Task: ``fn(ep, gpus) -> (a2a_bytes, state_bytes)`` for Mixtral 8x7B (46,702,792,704
    parameters, of them 45,097,156,608 in the routed experts, 8 per layer x 32 layers; width
    4096, top-2) trained on ``gpus`` GPUs, experts over ``ep`` ranks, no pipeline, ZeRO-1, bf16
    weights and gradients with 12 B of fp32 optimizer state per parameter: the bytes one GPU
    sends per token of its own and MoE layer, forward + backward, bf16, uniform routing; and the
    model-state bytes per GPU. Two ints, for an (ep, gpus) drawn from the grading seed."""
    ep, gpus = _mixtral_plan(task)
    return learner_value(run_learner(task, fn, ep, gpus, forbid=SCALE_REFERENCES))


def judge_mixtral_plan(got: Any, task: int = 3) -> None:
    from course_lib.measure import estimate

    ep, gpus = _mixtral_plan(task)
    where = f"ep {ep} on {gpus} GPUs: "
    if not isinstance(got, tuple) or len(got) != 2:
        fail(task, f"{where}expected (a2a_bytes, state_bytes), got {got!r}")
    a2a = expect_int(task, "a2a_bytes", got[0])
    state = expect_int(task, "state_bytes", got[1])
    want_a2a = estimate.ep_all_to_all_bytes_per_token(4096, ep=ep, top_k=2)
    total, experts = 46_702_792_704, 45_097_156_608
    want_state = estimate.moe_model_state_bytes_per_rank(
        total - experts, experts, ep=ep, world_size=gpus, stage=1
    )["total"]
    for what, value, want in (("a2a_bytes", a2a, want_a2a), ("state_bytes", state, want_state)):
        if value != want:
            fail(task, f"{where}{what} = {value:,}: too {'large' if value > want else 'small'}")
    passed(
        task,
        "Mixtral 8x7B at a drawn ep and cluster: all-to-all bytes per token and memory per GPU",
    )


check_mixtral_plan = split_check(collect_mixtral_plan, judge_mixtral_plan)
