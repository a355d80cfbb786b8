"""Unit 06's graded checks (solutions/06_activation_checkpointing.ipynb).

Task 1 (pick a policy): ``pick(config, batch, seq, budget)`` returns ``{"policy", "k"[, "save_ops"]}``
for ``apply_checkpointing``. Graded by measurement: the choice is applied to a GPT the lecture
never showed, its kept bytes are measured with MemoryMeter (must be <= budget) and its
recomputed matmul FLOPs with FlopCounterMode (must equal the least of every option in the menu
that fits, each measured the same way).
Task 2 (find the bug): ``checkpointed_forward(block, x)`` must checkpoint a block with dropout so
that gradients equal the unchanged model's under the same seed. Each block must run twice per
step (forward, then recomputation), so a function that does not checkpoint fails.
Task 3 (predict): ``predict_kept_bytes(config, batch, seq, policy, k)`` -> int, exact bytes kept when
the forward ends, for configurations not shown in the lecture; compared with MemoryMeter.

The course's own answers are out of reach during each check (``run_learner(..., forbid=...)``).
Each check is split (:mod:`course_lib.grading.split`): ``collect_*`` calls the learner's code and
hands back what it returned (choices, predictions) or measured around it (block calls,
gradients); ``judge_*`` measures what is expected (MemoryMeter, FlopCounterMode and
``apply_checkpointing``, all on the judge's side) and decides. Task 1's budgets come from the
measured menu, so ``prepare_pick_policy`` measures them on the judge's side.
Every GPT shape, batch, sequence length and k is drawn from the grading seed
(:func:`course_lib.grading.seeds.case_rng`): answers copied from one grading fail another.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, fmt_int, passed, run_learner
from course_lib.grading.plain import describe
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need_list, split_check

_RUN = "course_lib.units.u06_activation_checkpointing.run"
_CK = "course_lib.techniques.checkpointing"
_EST = "course_lib.measure.estimate"
#: gradient tolerance of task 2. The same ops on the same inputs give bitwise-equal gradients on
#: CPU; the tolerance only forgives a different but equivalent order of the sums. A different
#: dropout mask in the recomputation changes gradients by about 1e-2.
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7
UNIT = "u06_activation_checkpointing"
_MENU_CACHE: dict = {}  # per (config, batch, seq): every menu option measured
_PICK_FORBID = [f"{_RUN}:cheapest_fitting_policy", f"{_RUN}:policy_options"]
#: the estimates stay in the grade's sandbox, trapped but present: task 1's answer may use them
#: (the notebook's hint), task 3 refuses them by its trap alone (course_lib.grading.absent)
KEEP_IN_SANDBOX = (
    f"{_EST}.checkpointing:checkpointed_activation_bytes_gpt",
    f"{_EST}.activations:activation_bytes_gpt",
)


def _drawn_gpt(rng, *, n_layer: tuple[int, int], **extra):
    """A tiny GPT config drawn from ``rng``: layers in the range, 1-4 heads of 4 or 8."""
    from course_lib.models import GPTConfig

    n_head = rng.randint(1, 4)
    return GPTConfig.tiny(
        n_layer=rng.randint(*n_layer),
        n_embd=n_head * rng.choice((4, 8)),
        n_head=n_head,
        block_size=rng.choice((12, 16, 20, 24)),
        vocab_size=rng.randint(20, 60),
        **extra,
    )


def _gpt_and_batch(config, batch: int, seq: int, seed: int = 0):
    """The lecture's GPT (weights from ``seed``) and a batch of ``batch`` x ``seq`` tokens."""
    from course_lib.units.u06_activation_checkpointing.run import make_batch, make_model

    return (make_model(config, seed=seed), *make_batch(config, batch, seq))


def _measure(base, idx, tgt, policy: str, k: int, save_ops) -> tuple[int, int]:
    """(kept bytes when forward ends, matmul FLOPs of the step), both measured (judge side)."""
    import copy

    from course_lib.techniques.checkpointing import apply_checkpointing
    from course_lib.units.u06_activation_checkpointing.run import kept_and_flops

    model = apply_checkpointing(copy.deepcopy(base), policy, k=k, save_ops=save_ops)
    return kept_and_flops(model, idx, tgt)


def _choice_key(
    task: int, choice: Any, budget: int, measured: dict, base: Any, idx: Any, tgt: Any
) -> tuple[str, int, tuple[str, ...]]:
    """The learner's choice as a (policy, k, save_ops) key of ``measured``, measured on ``base``
    when it is new; ✗ when it is not a policy apply_checkpointing takes."""
    from course_lib.techniques.checkpointing import MATMUL_OPS

    if not isinstance(choice, dict) or "policy" not in choice:
        fail(
            task,
            f"pick(...) must return a dict with 'policy', 'k' (and optionally 'save_ops'), "
            f"got {describe(choice)}",
        )
    try:
        policy, k = choice["policy"], choice.get("k", 1)
        key = (policy, k, tuple(choice.get("save_ops", MATMUL_OPS)))
        if key not in measured:
            measured[key] = _measure(base, idx, tgt, *key)
    except (TypeError, ValueError) as exc:
        fail(
            task,
            f"budget {fmt_int(budget)} B: apply_checkpointing refused {choice!r}: {exc}",
        )
    return key


def _pick_case(task: int):
    """Task 1's GPT config, batch and sequence length, drawn from the grading seed."""
    rng = case_rng(task, UNIT)
    config = _drawn_gpt(rng, n_layer=(2, 4))
    return config, rng.randint(2, 4), config.block_size


def _pick_menu(task: int):
    """Task 1's GPT, its batch, every menu option (``run.policy_options``) measured on it and the
    three budgets: everything fits; only some selective and block policies fit; only the
    smallest fits."""
    from course_lib.units.u06_activation_checkpointing.run import policy_options

    config, batch, seq = _pick_case(task)
    base, idx, tgt = _gpt_and_batch(config, batch, seq)
    key = (config, batch, seq)
    if key not in _MENU_CACHE:  # deterministic: measured once per process and case
        _MENU_CACHE[key] = {
            (p, k, tuple(ops)): _measure(base, idx, tgt, p, k, ops)
            for p, k, ops in policy_options(config.n_layer)
        }
    measured = dict(_MENU_CACHE[key])
    kept = sorted({v[0] for v in measured.values()})
    return base, idx, tgt, measured, [kept[-1], kept[len(kept) // 2], kept[0]]


def prepare_pick_policy(task: int = 1) -> dict[str, Any]:
    """Judge side, before the learner's code runs: the budgets, from the measured menu."""
    return {"budgets": _pick_menu(task)[-1]}


def collect_pick_policy(pick, task: int = 1, inputs: Any = None) -> list[Any]:
    """Task 1: the learner's choice for each budget, on an unseen GPT."""
    budgets = inputs.get("budgets") if isinstance(inputs, dict) else None
    if not isinstance(budgets, list) or not all(type(b) is int for b in budgets):
        fail(task, "the budgets did not reach the check: run the check cell again")
    config, batch, seq = _pick_case(task)
    return [
        run_learner(task, pick, config, batch, seq, budget, forbid=_PICK_FORBID)
        for budget in budgets
    ]


def judge_pick_policy(data: Any, task: int = 1) -> None:
    """Three budgets: the choice fits (measured) with the least recompute (measured)."""
    from course_lib.techniques.checkpointing import MATMUL_OPS

    base, idx, tgt, measured, budgets = _pick_menu(task)
    base_flops = measured[("none", 1, tuple(MATMUL_OPS))][1]
    need_list(task, data, len(budgets), "choice", "budgets")
    for budget, choice in zip(budgets, data):
        key = _choice_key(task, choice, budget, measured, base, idx, tgt)
        got_kept, got_flops = measured[key]
        if got_kept > budget:
            fail(
                task,
                f"budget {fmt_int(budget)} B: {choice!r} keeps {fmt_int(got_kept)} B (measured), "
                "more than the budget",
            )
        best = min(f - base_flops for b, f in measured.values() if b <= budget)
        if got_flops - base_flops != best:
            fail(
                task,
                f"budget {fmt_int(budget)} B: {choice!r} fits but recomputes {fmt_int(got_flops - base_flops)} "
                f"matmul FLOPs; another option fits with {fmt_int(best)}",
            )
    passed(
        task,
        f"all {len(budgets)} budgets met with the least recomputation (measured on an unseen GPT)",
    )


check_pick_policy = split_check(collect_pick_policy, judge_pick_policy, prepare_pick_policy)

_RNG_FORBID = [f"{_CK}:Checkpointed", f"{_CK}:apply_checkpointing"]


def _seeded_grads(model, idx, tgt, *, task: int | None = None) -> list:
    """Gradients of one step from a fixed seed; the learner's code runs when ``task`` is given."""
    import torch

    torch.manual_seed(1234)
    if task is None:
        model.loss(idx, tgt).backward()
    else:
        loss = run_learner(task, model.loss, idx, tgt, forbid=_RNG_FORBID)
        run_learner(task, loss.backward)
    return [p.grad for p in model.parameters()]


def _same_grads(task: int, names: list[str], got: list, ref: list) -> None:
    """✗ on the first gradient missing or not close to the unchanged model's."""
    import torch

    for name, g, r in zip(names, got, ref):
        if g is None:
            fail(task, f"{name} has no gradient")
        if not isinstance(g, torch.Tensor) or g.shape != r.shape or g.dtype != r.dtype:
            fail(task, f"the run handed back no gradient of {name} ({describe(g)})")
        if not torch.allclose(g, r, rtol=GRAD_RTOL, atol=GRAD_ATOL):
            err = float((g - r).abs().max())
            fail(
                task,
                f"gradient of {name} differs from the unchanged model by up to {err:.3g} "
                f"(rtol={GRAD_RTOL:g}, atol={GRAD_ATOL:g}): does the recomputation draw the same "
                "dropout masks as the forward?",
            )


def _rng_case(task: int):
    """Task 2's GPT with dropout (its weights from the seed) and its batch."""
    rng = case_rng(task, UNIT)
    config = _drawn_gpt(rng, n_layer=(2, 3), dropout=0.2)
    seed = rng.getrandbits(31)
    base, idx, tgt = _gpt_and_batch(config, rng.randint(1, 3), config.block_size, seed=seed)
    return config, base, idx, tgt


def collect_rng_fix(checkpointed_forward, task: int = 2) -> dict[str, Any]:
    """Task 2: one step of the GPT with each block run through the learner's function: how
    many times each block ran, and the gradients."""
    import copy

    import torch
    from torch import nn

    config, base, idx, tgt = _rng_case(task)

    class Wrapped(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpointed_forward(self.block, x)

    model = copy.deepcopy(base)
    # one call on its own first, so that a missing answer is reported under its own name
    probe = torch.randn(2, config.block_size, config.n_embd, requires_grad=True)
    run_learner(task, checkpointed_forward, model.blocks[0], probe, forbid=_RNG_FORBID)
    calls = [0] * config.n_layer
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
    model.blocks = nn.ModuleList(Wrapped(b) for b in model.blocks)
    grads = _seeded_grads(model, idx, tgt, task=task)
    return {"calls": calls, "grads": grads}


def judge_rng_fix(data: Any, task: int = 2) -> None:
    """Gradients with dropout equal the unchanged model's; every block is recomputed."""
    import copy

    config, base, idx, tgt = _rng_case(task)
    ref = _seeded_grads(copy.deepcopy(base), idx, tgt)
    calls = data.get("calls") if isinstance(data, dict) else None
    if calls != [2] * config.n_layer:
        fail(
            task,
            f"each block should run twice per step (forward, then recomputation in backward); "
            f"the blocks ran {calls} times: is the block checkpointed?",
        )
    names = [n for n, _ in base.named_parameters()]
    got = data.get("grads")
    need_list(task, got, len(names), "gradient", "parameters")
    _same_grads(task, names, got, ref)
    passed(
        task,
        f"with dropout {config.dropout}, gradients equal the unchanged model's "
        f"(rtol={GRAD_RTOL:g}, atol={GRAD_ATOL:g}) and each block is recomputed once",
    )


check_rng_fix = split_check(collect_rng_fix, judge_rng_fix)


def _kept_cases(task: int) -> list[tuple[Any, int, int, str, int]]:
    """Task 3's cases: (config, batch, seq, policy, k) on two GPTs drawn from the grading seed,
    one at the full block size, one with a shorter sequence; every_k with k >= 2, segments with
    a k that leaves a shorter last segment."""
    rng = case_rng(task, UNIT)
    cases = []
    for short in (False, True):
        config = _drawn_gpt(rng, n_layer=(3, 5))
        seq = rng.randint(8, config.block_size - 4) if short else config.block_size
        k_every = rng.randint(2, config.n_layer - 1)
        k_seg = rng.choice([k for k in range(2, config.n_layer) if config.n_layer % k] or [2])
        batch = rng.randint(1, 4)
        for policy, k in (("none", 1), ("full", 1), ("every_k", k_every), ("segments", k_seg)):
            cases.append((config, batch, seq, policy, k))
    return cases


_KEPT_FORBID = [
    f"{_EST}.checkpointing:checkpointed_activation_bytes_gpt",
    f"{_EST}.activations:activation_bytes_gpt",
    f"{_RUN}:plain_block_bytes",
    f"{_RUN}:kept_bytes",
]


def collect_predict_kept_bytes(predict_kept_bytes, task: int = 3) -> list[Any]:
    """Task 3: the learner's predicted kept bytes for each unseen case."""
    return [
        run_learner(task, predict_kept_bytes, config, batch, seq, policy, k, forbid=_KEPT_FORBID)
        for config, batch, seq, policy, k in _kept_cases(task)
    ]


def judge_predict_kept_bytes(data: Any, task: int = 3) -> None:
    """Exact kept bytes for unseen configurations, against MemoryMeter."""
    from course_lib.techniques.checkpointing import MATMUL_OPS

    cases = _kept_cases(task)
    need_list(task, data, len(cases), "prediction")
    for (config, batch, seq, policy, k), got in zip(cases, data):
        if isinstance(got, bool) or not isinstance(got, int):
            fail(task, f"predict_kept_bytes must return an int (bytes), got {describe(got)}")
        base, idx, tgt = _gpt_and_batch(config, batch, seq)
        expected, _ = _measure(base, idx, tgt, policy, k, MATMUL_OPS)
        if got != expected:
            fail(
                task,
                f"n_layer={config.n_layer}, n_embd={config.n_embd}, n_head={config.n_head}, "
                f"vocab={config.vocab_size}, batch={batch}, seq={seq}, policy={policy!r}, k={k}: "
                f"predicted {fmt_int(got)} B, not what MemoryMeter measured",
            )
    passed(
        task,
        f"{len(cases)} predictions equal MemoryMeter's measurement to the byte (2 unseen configurations)",
    )


check_predict_kept_bytes = split_check(collect_predict_kept_bytes, judge_predict_kept_bytes)
