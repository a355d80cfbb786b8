"""Unit 07, the single-device techniques of units 02-07 side by side, each measured here.

[S0 §5.4.9] closes the single-GPU part with a table of words: technique, what it buys, what it
costs. :func:`technique_summary` puts numbers in those cells. Every technique runs a few real
training steps of one tiny GPT (``GPTConfig.tiny()``, the same initial weights for every row)
through the course's own code -- ``techniques.accumulation``, ``techniques.precision``,
``techniques.optim``, ``techniques.offload``, ``techniques.checkpointing``, ``techniques.lora``,
``techniques.nf4`` -- and is compared with one baseline: fp32 weights, Adam, batch ``B``, every
parameter trained.

* memory: ``MemoryMeter`` over one optimizer step, after a first step that creates the optimizer
  state (CPU offload: over the device's part of the step only, as unit 05 counts it);
* time: the median over ``rounds`` of one optimizer step, every technique stepped in turn in each
  round (a slow moment of a shared machine hits them all), divided by the examples behind that
  step: seconds *per training example*, so that batch sizes compare fairly.

Used by notebooks/07_lora_qlora.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd
import torch
from torch.nn import functional as F

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.techniques import precision as P
from course_lib.techniques.accumulation import accumulation_step
from course_lib.techniques.checkpointing import apply_checkpointing
from course_lib.techniques.lora import add_lora, trainable_params
from course_lib.techniques.offload import OffloadAdamW
from course_lib.techniques.optim import make_optimizer
from course_lib.units.u07_lora_qlora.run_finetune import GPT_TARGETS

if TYPE_CHECKING:
    from course_lib.measure.memory import MemoryMeter

__all__ = ["TECHNIQUES", "WORDS", "technique_summary"]

#: what each technique buys and what it costs, in a few words (S0 §5.4.9, rephrased; at most 50
#: characters each, pandas' default column width, so that a displayed table shows them whole)
WORDS: dict[str, tuple[str, str]] = {
    "baseline": ("the reference every ratio divides by", "-"),
    "larger batch": ("busier hardware, less noisy gradients", "more activation memory; retune lr"),
    "smaller batch": ("less activation memory", "noisier gradients, idler hardware"),
    "gradient accumulation": (
        "k times the batch at one micro-batch's memory",
        "k passes per step: slower than one big batch",
    ),
    "reduced precision (bf16)": (
        "half the bytes for weights, gradients and moments",
        "small updates round away; quality can suffer",
    ),
    "mixed precision (bf16)": (
        "16-bit math, fp32 weights for the update",
        "a cast per op; stored state does not shrink",
    ),
    "less-stateful optimizer": (
        "less optimizer state per parameter",
        "may converge slower or worse",
    ),
    "CPU offload": (
        "master weights, optimizer state leave the device",
        "grads down, weights up over the link every step",
    ),
    "activation checkpointing": (
        "backward keeps block inputs only",
        "the forward runs again inside backward",
    ),
    "LoRA": (
        "few trainable params, so small grads and state",
        "low-rank update can fall short of full tuning",
    ),
    "QLoRA": (
        "LoRA, plus the frozen base stored in 4 bits",
        "dequantizing in every matmul; quantization error",
    ),
}

#: the rows of :func:`technique_summary`, in order (S0 §5.4.9's list; PEFT split in two)
TECHNIQUES = tuple(WORDS)


@dataclass
class _Case:
    """One row: a model, one optimizer step, and how many training examples that step uses."""

    technique: str
    setting: str
    model: torch.nn.Module
    step: Callable[[], Any]
    examples: int
    optimizer: Any = None
    metered: Callable[[], MemoryMeter] | None = None  # the default: the whole step under a meter
    host_bytes: Callable[[], int] | None = None
    note: str = ""


def _xent(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _adam_case(technique, setting, model, idx, tgt, *, note="", name="adam", opt=None) -> _Case:
    """``model`` trained by ``name`` (an optimizer of unit 04; or by ``opt``) over its trainable
    parameters, one plain forward/backward/step on (idx, tgt) per optimizer step."""
    if opt is None:
        opt = make_optimizer(name, [p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        model.loss(idx, tgt).backward()
        opt.step()

    return _Case(technique, setting, model, step, len(idx), opt, note=note)


def _batch_cases(base: GPT, batches: dict[int, tuple], batch: int, factor: int) -> list[_Case]:
    big, small = factor * batch, batch // factor
    cases = [
        _adam_case(technique, setting, copy.deepcopy(base), *batches[size], note=note)
        for technique, setting, size, note in (
            ("baseline", f"fp32, Adam, batch {batch}", batch, "every ratio divides by this row"),
            ("larger batch", f"batch {big} vs {batch}", big, ""),
            ("smaller batch", f"batch {small} vs {batch}", small, ""),
        )
    ]
    model = copy.deepcopy(base)
    opt = make_optimizer("adam", model.parameters(), lr=1e-3)
    idx, tgt = batches[big]

    def step():
        accumulation_step(model, opt, _xent, idx, tgt, micro_batches=factor)

    setting = f"{factor} micro-batches of {batch}: effective batch {big}"
    note = f"one optimizer step per {factor} micro-batches: {big} examples share its cost"
    cases.append(_Case("gradient accumulation", setting, model, step, big, opt, note=note))
    return cases


def _precision_cases(base: GPT, idx, tgt) -> list[_Case]:
    cases = []
    for technique, mode, setting in (
        ("reduced precision (bf16)", "bf16-true", "bf16 weights, grads and Adam state"),
        ("mixed precision (bf16)", "bf16-mixed", "autocast to bf16, fp32 weights and Adam"),
    ):
        model = P.prepare(copy.deepcopy(base), mode)
        opt = make_optimizer("adam", model.parameters(), lr=1e-3)

        def step(model=model, opt=opt, mode=mode):
            P.train_step(model, opt, lambda m: m.loss(idx, tgt), mode=mode)

        note = "the speed of bf16 depends on the hardware's bf16 units: here, this CPU's"
        cases.append(_Case(technique, setting, model, step, len(idx), opt, note=note))
    return cases


def _offload_case(base: GPT, idx, tgt) -> _Case:
    """``OffloadAdamW``; the meter wraps forward, backward and ``offload_grads`` (unit 05's
    ``memory_fit``): the host update and the copy back run outside it."""
    from course_lib.measure.memory import MemoryMeter

    model = copy.deepcopy(base)
    opt = OffloadAdamW(model.parameters(), lr=1e-3)

    def metered() -> MemoryMeter:
        opt.zero_grad(set_to_none=True)
        with MemoryMeter(model) as mem:
            model.loss(idx, tgt).backward()
            opt.offload_grads()
        opt.host_step()
        opt.load_params()
        return mem

    note = (
        "device memory as unit 05 counts it: forward, backward and offload_grads; master "
        "weights, fp32 grads and AdamW state are in host_B. On a CPU both sides are the same RAM: "
        "the time ratio measures RAM copies, not a PCIe link"
    )
    setting = "OffloadAdamW: master, grads, m, v on the host"
    case = _adam_case("CPU offload", setting, model, idx, tgt, note=note, opt=opt)
    case.metered, case.host_bytes = metered, lambda: opt.host_bytes()["total"]
    return case


def _lora_cases(base: GPT, idx, tgt, r: int) -> list[_Case]:
    model = add_lora(copy.deepcopy(base), r=r, alpha=2 * r, targets=GPT_TARGETS)
    targets = ", ".join(GPT_TARGETS)
    cases = [_adam_case("LoRA", f"r {r} on {targets}, base frozen", model, idx, tgt)]
    try:
        from course_lib.techniques.nf4 import quantize_linears_

        model = copy.deepcopy(base)
        quantize_linears_(model, GPT_TARGETS)
    except ImportError:  # bitsandbytes holds the NF4 layer
        note = "not measured: bitsandbytes is not installed"
        return [*cases, _Case("QLoRA", "-", base, lambda: None, len(idx), note=note)]
    add_lora(model, r=r, alpha=2 * r, targets=GPT_TARGETS)
    note = (
        "weights_B counts the NF4 codes; their block scales sit in each layer's quant_state, "
        "neither parameter nor buffer, which the meter does not see"
    )
    setting = f"NF4 base, r {r} on {targets}"
    cases.append(_adam_case("QLoRA", setting, model, idx, tgt, note=note))
    return cases


def _cases(config: GPTConfig, batch: int, seq: int, factor: int, r: int, seed: int):
    torch.manual_seed(seed)
    base = GPT(config)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = permutation_batch(config, factor * batch, seq, generator=gen)  # the larger batch
    batches = {n: (x[:n], y[:n]) for n in (factor * batch, batch, batch // factor)}
    idx, tgt = batches[batch]
    checkpointed = apply_checkpointing(copy.deepcopy(base), "full")
    return [
        *_batch_cases(base, batches, batch, factor),
        *_precision_cases(base, idx, tgt),
        _adam_case(
            "less-stateful optimizer",
            "SGD + momentum (1 state tensor) vs Adam (2)",
            copy.deepcopy(base),
            idx,
            tgt,
            name="momentum",
        ),
        _offload_case(base, idx, tgt),
        _adam_case("activation checkpointing", "every block, full", checkpointed, idx, tgt),
        *_lora_cases(base, idx, tgt, r),
    ]


def _measure(case: _Case) -> MemoryMeter | None:
    """The second step under a MemoryMeter (the first creates the optimizer state)."""
    from course_lib.measure.memory import MemoryMeter

    if case.optimizer is None and case.metered is None:
        return None  # not measured (see the note)
    case.step()
    if case.metered is not None:
        return case.metered()
    with MemoryMeter(case.model, case.optimizer) as mem:
        case.step()
    return mem


def _seconds_per_step(cases: list[_Case], rounds: int) -> list[float]:
    """Median seconds of one optimizer step per case, the cases interleaved in each round."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            case.step()
            times[i].append(time.perf_counter() - t0)
    return [float(pd.Series(t).median()) for t in times]


@dataclass(frozen=True)
class TechniqueRow:
    """One technique of :func:`technique_summary` (NaN where it was not measured)."""

    technique: str
    setting: str
    peak_vs_base: float
    time_per_example_vs_base: float
    peak_B: float
    activation_peak_B: float
    weights_B: float
    grads_B: float
    optimizer_B: float
    host_B: float
    seconds_per_example: float
    trainable: float
    trainable_pct: float
    benefit: str
    cost: str
    note: str


def _row(
    case: _Case, mem: MemoryMeter | None, seconds: float, n_base: int, base: tuple[float, float]
) -> TechniqueRow:
    """``base``: the baseline's peak bytes and seconds per example, which the ratios divide by."""
    buffers = sum(b.numel() * b.element_size() for b in case.model.buffers())
    benefit, cost = WORDS[case.technique]
    peak = act_peak = weights = grads = state = host = per_example = trainable = math.nan
    if mem is not None:  # else not measured: every number NaN
        end = mem.end_breakdown
        peak = mem.peak_bytes
        act_peak = int((mem.timeline["activations"] + mem.timeline["temporaries"]).max())
        weights, grads, state = end["params"] - buffers, end["grads"], end["optimizer"]
        host = case.host_bytes() if case.host_bytes else 0
        per_example, trainable = seconds / case.examples, trainable_params(case.model)
    return TechniqueRow(
        technique=case.technique,
        setting=case.setting,
        peak_vs_base=peak / base[0],
        time_per_example_vs_base=per_example / base[1],
        peak_B=peak,
        activation_peak_B=act_peak,
        weights_B=weights,
        grads_B=grads,
        optimizer_B=state,
        host_B=host,
        seconds_per_example=per_example,
        trainable=trainable,
        trainable_pct=100 * trainable / n_base,
        benefit=benefit,
        cost=cost,
        note=case.note,
    )


def technique_summary(
    *,
    config: GPTConfig | None = None,
    batch: int = 8,
    seq: int = 32,
    factor: int = 4,
    r: int = 8,
    rounds: int = 5,
    seed: int = 0,
) -> pd.DataFrame:
    """Each technique of :data:`TECHNIQUES` measured on the tiny GPT (CPU, one thread) against
    the baseline: fp32, Adam, batch ``batch``, full training. Larger / smaller batch: ``factor``
    times more / fewer examples; accumulation: ``factor`` micro-batches of ``batch``; LoRA and
    QLoRA: rank ``r`` on every linear of the blocks. About 3 s on 2 idle cores (and once, the
    import of bitsandbytes, 2-4 s).

    Columns: ``technique``, ``setting``; ``peak_vs_base`` (peak bytes of one step / the
    baseline's) and ``time_per_example_vs_base`` (median seconds of one optimizer step / the
    examples behind it, over the baseline's: noisy, shown, never checked tightly); the bytes
    behind them, all measured: ``peak_B``, ``activation_peak_B`` (the most activations +
    temporaries alive at a recorded moment), ``weights_B`` (parameters, buffers left out),
    ``grads_B``, ``optimizer_B`` (alive when the step ends), ``host_B`` (what CPU offload keeps
    off the device); ``seconds_per_example``; ``trainable`` and ``trainable_pct`` (of the tiny
    GPT's parameters); ``benefit`` and ``cost`` (:data:`WORDS`); ``note``.
    """
    config = config or GPTConfig.tiny()
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config = {validate.describe(config)}: expected a GPTConfig or None")
    factor = validate.count("factor", factor, minimum=2)
    batch = validate.divisible(
        "batch",
        validate.count("batch", batch, minimum=2),
        "factor",
        factor,
        note="the smaller batch is batch / factor",
    )
    seq = validate.count("seq", seq, minimum=1, maximum=config.block_size)
    r = validate.count("r", r, minimum=1, maximum=config.n_embd)
    rounds = validate.count("rounds", rounds, minimum=1)
    with kit.one_thread():  # the tiny GPT's matmuls gain nothing from a second thread
        cases = _cases(config, batch, seq, factor, r, seed)
        meters = [_measure(case) for case in cases]
        seconds = _seconds_per_step(cases, rounds)
    n_base = count_params(cases[0].model)
    assert meters[0] is not None  # the baseline is always measured
    base = (meters[0].peak_bytes, seconds[0] / cases[0].examples)
    rows = [_row(c, m, s, n_base, base) for c, m, s in zip(cases, meters, seconds)]
    df = kit.frame(rows, TechniqueRow)
    df.attrs.update(config=config, batch=batch, seq=seq, factor=factor, r=r, device="cpu")
    return df
