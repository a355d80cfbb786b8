"""Unit 03 explorer widget (driven from Python) and the unit's plots."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from course_lib.models import GPTConfig
from course_lib.units.u03_mixed_precision import plots as p3
from course_lib.units.u03_mixed_precision import run as E
from course_lib.units.u03_mixed_precision.widgets import PrecisionExplorer

SMALL = GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=32)


def test_explorer_runs_a_real_measurement_on_click():
    ex = PrecisionExplorer(device="cpu", config=SMALL)
    assert ex.result is None  # nothing runs before Run
    ex.modes.value = ("fp32", "bf16-true")
    ex.batch.value = 2
    ex.seq.value = 8
    ex.run_button.click()
    df = ex.result
    assert set(df["mode"]) == {"fp32", "bf16-true"}
    m = df.set_index(["mode", "category"])["measured"]
    res = df.set_index(["mode", "category"])["residual"]
    assert (
        res[("bf16-true", "optimizer")] == res[("fp32", "optimizer")] == 0
    )  # exact, bf16 state half
    assert m[("bf16-true", "optimizer")] < m[("fp32", "optimizer")]
    assert "measured peak" in ex.status.value and not ex.run_button.disabled
    # a bigger batch means more activations, measured again on the next click
    ex.batch.value = 4
    ex.run_button.click()
    m4 = ex.result.set_index(["mode", "category"])["measured"]
    assert m4[("fp32", "activations")] > m[("fp32", "activations")]
    ex.modes.value = ()
    with pytest.raises(ValueError, match="modes is empty"):
        ex.run()


def test_plots_return_figures_and_reject_bad_input():
    assert len(p3.plot_bit_layouts(E.format_table()).axes) == 1
    g = torch.tensor([1e-9, 1e-6, 1e-3])
    assert len(p3.plot_gradient_histogram(g, scale=2.0**16).axes) == 1
    with pytest.raises(ValueError, match="scale"):
        p3.plot_gradient_histogram(g, scale=0)
    mem = pd.DataFrame(
        [
            {"mode": "fp32", "category": c, "measured": 10, "predicted": 9, "residual": 1}
            for c in ("params", "grads", "optimizer", "activations", "peak")
        ]
    )
    assert len(p3.plot_memory_by_mode(mem).axes) == 1
    speed = pd.DataFrame({"n": [8, 8], "dtype": ["fp32", "bf16"], "gflops": [1.0, 2.0]})
    assert p3.plot_matmul_speed(speed).axes[0].get_yscale() == "log"
    curves = pd.DataFrame(
        {
            "mode": ["fp16-mixed"] * 2,
            "step": [0, 1],
            "loss": [2.0, 1.0],
            "skipped": [True, False],
            "scale": [4.0, 2.0],
        }
    )
    assert len(p3.plot_loss_curves(curves).axes) == 2
    with pytest.raises(ValueError, match="missing columns"):
        p3.plot_loss_curves(curves.drop(columns="scale"))
    with pytest.raises(TypeError, match="DataFrame"):
        p3.plot_matmul_speed({"n": [1]})
