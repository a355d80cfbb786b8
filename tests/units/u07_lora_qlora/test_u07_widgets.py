"""Unit 07's explorer (driven from Python) and plots."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.models import GPTConfig
from course_lib.units.u07_lora_qlora import plots as P
from course_lib.units.u07_lora_qlora import run as R
from course_lib.units.u07_lora_qlora.widgets import LoRAExplorer

SMALL = GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=32)


def test_explorer_finetunes_on_click():
    ex = LoRAExplorer(config=SMALL)
    assert ex.result is None
    ex.rank.value = 2
    ex.steps.value = 10
    ex.targets.value = ("c_attn",)
    ex.run_button.click()
    df = ex.result
    assert list(df["method"].unique()) == ["full", "lora"]
    assert df[df["method"] == "lora"]["trainable"].iloc[0] == 2 * (
        32 + 96
    )  # r (d_in + d_out), one layer
    assert "final loss" in ex.status.value
    ex.methods.value = ()
    ex.run_button.click()
    assert "methods is empty" in ex.status.value


def test_plots_draw_and_check_columns():
    P.plot_finetune(
        pd.DataFrame(
            {"method": ["full", "full"], "step": [0, 1], "loss": [2.0, 1.0], "trainable": [10, 10]}
        )
    )
    P.plot_scale(R.scale_table())
    mem = pd.DataFrame(
        [
            {
                "method": m,
                **{
                    k: 1024
                    for k in (
                        "grads",
                        "grads_pred",
                        "optimizer",
                        "optimizer_pred",
                        "target_weights",
                        "target_weights_pred",
                    )
                },
            }
            for m in R.METHODS
        ]
    )
    P.plot_memory(mem)
    with pytest.raises(ValueError, match="missing"):
        P.plot_finetune(pd.DataFrame({"method": ["full"]}))
