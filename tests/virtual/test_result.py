"""The virtual cluster's typed result: ``SimulatedStep.to_frame()`` is the frame ``simulate_step``
returned before it was typed (same columns, dtypes and values), and its fields hold what that
frame's attributes held. No process starts: the simulating process's answer (a ``StepResult``)
is written here by hand, for a 7B and a 70B shape, and turned into a result as simulate_step
does."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib import virtual
from course_lib.virtual import simulate
from course_lib.virtual._types import StepResult

# bytes at each moment, by hand: the optimizer's 250 at the peak is 200 of state (what it keeps
# after the step) + 50 of the step's own scratch, which the result counts as temporaries; a
# moment without "total" gets the sum of its rows
RAW = dict(
    at_peak={"params": 100, "optimizer": 250, "activations": 40, "total": 390},
    max={"params": 100, "unsharded_params": 30, "optimizer": 200},
    after_forward={"params": 100, "optimizer": 200, "activations": 40, "inputs": 8},
    after_backward={"params": 100, "grads": 100, "optimizer": 200, "total": 400},
    after_step={"params": 100, "grads": 100, "optimizer": 200, "total": 400},
)
# the frame as simulate_step built it: {category, the five byte columns, label}
OLD = {
    "at_peak": {
        "params": 100,
        "optimizer": 200,
        "temporaries": 50,
        "activations": 40,
        "total": 390,
    },
    "max": {"params": 100, "unsharded_params": 30, "optimizer": 200, "total": 330},
    "after_forward": {
        "params": 100,
        "optimizer": 200,
        "activations": 40,
        "inputs": 8,
        "total": 348,
    },
    "after_backward": {"params": 100, "grads": 100, "optimizer": 200, "total": 400},
    "after_step": {"params": 100, "grads": 100, "optimizer": 200, "total": 400},
}
COMM = {"total": {"all_reduce": 4}, "forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}


def old_frame() -> pd.DataFrame:
    rows = list(virtual.ROWS)
    columns = {c: [OLD[c].get(r, 0) for r in rows] for c in virtual.COLUMNS}
    return pd.DataFrame({"category": rows, **columns, "label": ["virtual"] * len(rows)})


def step_of(model, **settings):
    spec = simulate.check_arguments(
        model,
        world_size=settings.get("world_size", 8),
        strategy=settings.get("strategy", "fsdp"),
        mixed_precision="bf16",
        batch=1,
        seq=4096,
        tp=settings.get("tp"),
        reshard_after_forward=True,
        optimizer="adamw",
        vocab=None,
        timeout=60,
        checkpoint="full",
    )
    raw = StepResult(
        **RAW,
        step_peak_total=512,
        activation_peak={"activations": 30, "temporaries": 12, "total": 300},
        comm=COMM,
        n_params_local=1234,
        phases_s={"setup": 0.1},
        wall_s=2.5,
        rss_peak_bytes=3 * 2**20,
        pid=1,
        torch="2.x",
    )
    return simulate.to_result(raw, spec, launch_s=3.0)


@pytest.mark.parametrize(
    "preset, settings, n_params, dp, tp",
    [
        ("llama-7b", dict(world_size=8, strategy="fsdp"), 6_738_415_616, 8, 1),
        ("llama2-70b", dict(world_size=64, strategy="fsdp+tp", tp=8), 68_976_648_192, 8, 8),
    ],
)
def test_to_frame_is_the_old_frame_and_the_fields_hold_its_attributes(
    preset, settings, n_params, dp, tp
):
    model = virtual.PRESETS[preset]
    step = step_of(model, **settings)
    frame = step.to_frame()
    pd.testing.assert_frame_equal(frame, old_frame())  # columns, dtypes, every value
    assert list(frame.columns) == ["category", *virtual.COLUMNS, "label"]
    assert step.at("temporaries") == 50 and step.at("total", "max") == 330
    # what the frame's attributes held
    assert (step.model, step.n_params) == (model.name, n_params)
    assert (step.world_size, step.tp, step.dp) == (settings["world_size"], tp, dp)
    assert (step.strategy, step.mixed_precision, step.optimizer) == (
        settings["strategy"],
        "bf16",
        "adamw",
    )
    assert (step.checkpoint, step.batch, step.seq) == ("full", 1, 4096)
    assert step.seq_len == 4096  # the old name, kept one release
    assert step.comm == COMM and step.n_params_local == 1234
    assert (step.simulate_s, step.launch_s, step.rss_peak_bytes) == (2.5, 3.0, 3 * 2**20)
    assert step.step_peak_bytes_traced == 512
    assert step.activation_peak_bytes == 30 + 12  # activations + temporaries at their peak
    assert step.activation_peak["total"] == 300 and step.activation_peak["params"] == 0
    assert step.label == "virtual" and step.title.startswith("virtual cluster")
    grid = f" (dp {dp} x tp {tp})" if tp > 1 else ""
    assert f"{settings['strategy']}, {settings['world_size']} ranks{grid}" in step.title
    assert "checkpoint full, batch 1 x seq 4096" in step.title
    # ZeRO's model states: after backward, and the most gathered parameters at once
    assert virtual.model_states(step) == {
        "params": 100,
        "gathered": 30,
        "grads": 100,
        "optimizer": 200,
        "total": 430,
    }
    gib = step.gib()
    assert list(gib.index) == list(virtual.ROWS) and list(gib.columns) == list(virtual.COLUMNS)
    assert gib.at["total", "at_peak"] == round(390 / 2**30, 3)


def test_a_result_is_frozen_and_its_reads_name_the_choices():
    step = step_of(virtual.PRESETS["llama-7b"])
    with pytest.raises(AttributeError):
        step.world_size = 16  # type: ignore[misc]
    with pytest.raises(ValueError, match="column = 'peak': expected one of at_peak, max"):
        step.at("params", "peak")
    with pytest.raises(ValueError, match="row = 'weights': expected one of params, "):
        step.at("weights")
    with pytest.raises(TypeError, match="expected the SimulatedStep"):
        virtual.model_states(step.to_frame())


def test_zero_table_frame_keeps_the_old_columns():
    table = virtual.zero_7b_table(run_virtual=False)
    frame = table.to_frame()
    assert list(frame.columns) == [
        "stage",
        "name",
        "target_GB",
        "estimate_GB",
        "estimate_model_GB",
        "strategy",
        "label",
        "note",
    ]
    assert list(frame["estimate_GB"]) == [112.0, 38.5, 26.25, 14.0]
    assert list(frame["strategy"].isna()) == [False, True, False, False]  # stage 1: no FSDP2 mode
    assert table.title.startswith("virtual cluster vs ZeRO accounting: 7b")
    assert (table.world_size, table.paper_n_params, table.runs) == (8, 7e9, {})
