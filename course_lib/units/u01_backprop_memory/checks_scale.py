"""Unit 01's check of task 5 (scale it up): parameters, fp32 Adam model state and activations
of GPT-shaped 7B and 70B models at 4,096 tokens, and a shape drawn per grading, against estimate.
Re-exported by :mod:`.checks`."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check

UNIT = "u01_backprop_memory"

# ---------------------------------------------------------------------------------- task 5
_SCALE_REFERENCES = (
    "course_lib.measure.estimate.activations:activation_bytes_gpt",
    "course_lib.measure.estimate.activations:activation_bytes_transformer_layer",
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.training:gpt_param_count",
    "course_lib.models:count_params",
)
#: GPT-shaped models (our architecture, GPT-2 vocabulary) at the sizes people train; the check
#: adds a shape drawn from the grading seed (:func:`_drawn_scale_case`)
SCALE_CASES = {
    "7B": dict(n_layer=32, n_embd=4096, n_head=32, vocab_size=50257, seq=4096),
    "70B": dict(n_layer=80, n_embd=8192, n_head=64, vocab_size=50257, seq=4096),
}


def _drawn_scale_case(task: int) -> dict:
    """A GPT shape between the tiny and the 70B, drawn from the grading seed."""
    rng = case_rng(task, UNIT)
    n_head = rng.choice((4, 8, 16, 24, 40))
    return dict(
        n_layer=rng.randint(2, 60),
        n_embd=n_head * rng.choice((64, 96, 128)),
        n_head=n_head,
        vocab_size=rng.randint(256, 128_000),
        seq=rng.choice((512, 1024, 2048, 8192)),
    )


def _scale_expected(n_layer, n_embd, n_head, vocab_size, seq) -> dict:
    from course_lib.measure import estimate
    from course_lib.models import GPTConfig

    n = estimate.gpt_param_count(
        n_layer=n_layer, n_embd=n_embd, vocab_size=vocab_size, block_size=seq
    )
    config = GPTConfig(
        vocab_size=vocab_size, block_size=seq, n_layer=n_layer, n_head=n_head, n_embd=n_embd
    )
    return {
        "params": n,
        "model_state": estimate.model_state_bytes(n, precision="fp32", optimizer="adam")["total"],
        "activations": estimate.activation_bytes_gpt(config, 1, seq),
    }


def _scale_shapes(task: int) -> dict[str, dict]:
    return {"drawn": _drawn_scale_case(task), **SCALE_CASES}


def collect_scale_up(scale_up, task: int = 5) -> dict[str, Any]:
    """Task (scale it up): parameters, fp32 Adam model state and activations (batch 1) of our
    GPT at 7B and 70B shapes, 4,096 tokens, against estimate (exact)."""
    return {
        # a shape's values in order: n_layer, n_embd, n_head, vocab_size, seq
        name: run_learner(task, scale_up, *shape.values(), forbid=_SCALE_REFERENCES)
        for name, shape in _scale_shapes(task).items()
    }


def judge_scale_up(data: Any, task: int = 5) -> None:
    for name, shape in _scale_shapes(task).items():
        expected = _scale_expected(**shape)
        got = data.get(name) if isinstance(data, dict) else None
        if not isinstance(got, dict) or any(k not in got for k in expected):
            fail(task, f"expected a dict with keys {list(expected)}, got {got!r:.80}")
        for key, value in expected.items():
            expect_int(task, f"{key} of the {name} model", got[key])
            if got[key] != value:
                hint = ""
                if key == "params" and got[key] == 12 * shape["n_layer"] * shape["n_embd"] ** 2:
                    hint = " (12 L C^2 is the blocks' weight matrices only: add biases, norms, embeddings)"
                fail(
                    task,
                    f"{name} ({shape}): {key}: {got[key]!r} is not estimate's{hint}",
                )
    s7, s70 = (_scale_expected(**SCALE_CASES[name]) for name in ("7B", "70B"))
    passed(
        task,
        f"7B-shaped: {s7['params'] / 1e9:.2f}B params, {s7['model_state'] / 1e9:.0f} GB state, "
        f"{s7['activations'] / 1e9:.0f} GB activations at 4k tokens; 70B-shaped: "
        f"{s70['model_state'] / 1e12:.2f} TB, {s70['activations'] / 1e9:.0f} GB",
    )


check_scale_up = split_check(collect_scale_up, judge_scale_up)
