"""Unit 19's plots and widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_lib.measure.profile import Span, StepProfile  # noqa: E402
from course_lib.units.u19_inside_the_step import plots as P  # noqa: E402
from course_lib.units.u19_inside_the_step import run  # noqa: E402
from course_lib.units.u19_inside_the_step.widgets import FlashExplorer  # noqa: E402


def _profile(rank: int) -> StepProfile:
    spans = (
        Span("autograd::engine::evaluate_function: MmBackward0", 1, 0.0, 10.0, "backward"),
        Span("gloo:all_reduce", 2, 5.0, 10.0, "comm"),
        Span("aten::mm", 1, 12.0, 2.0, "op"),
    )
    return StepProfile(rank, (), spans, None, 15.0)


def test_plots_draw_and_refuse_bad_frames():
    table = pd.DataFrame(
        {"name": ["aten::mm", "aten::add"], "self_cpu_us": [10.0, 3.0], "calls": [2, 5]}
    )
    roofs = {"here": {"name": "a CPU", "flops_per_s": 1e11, "bytes_per_s": 1e10}, "H100": run.H100}
    ops = run.block_ops(64, 32, 2, 32)
    tables = {name: run.op_table(ops, r) for name, r in roofs.items()}
    tables["here"]["measured_us"] = tables["here"].predicted_us * 2
    point = {"seq": 64, "block_size": 16, "causal": True}
    point.update({f"{n}_{w}_bytes": 1024 for n in ("flash", "naive") for w in ("saved", "peak")})
    sweep = pd.DataFrame([{**point, "seq": s, "flash_predicted_bytes": 1024} for s in (64, 128)])
    figs = [
        P.plot_top_ops(table),
        P.plot_timeline([_profile(0).timeline(), _profile(1).timeline()]),
        P.plot_roofline(tables, roofs),
        P.plot_fusion(run.fusion_bytes(4, 8), {"eager_ms": 2.0, "compiled_ms": None}),
        P.plot_fusion(run.fusion_bytes(4, 8), {"eager_ms": 2.0, "compiled_ms": 1.0}),
        P.plot_memory_sweep(sweep),
        P.plot_flash_point(point),
    ]
    assert all(f.axes for f in figs)
    for f in figs:
        plt.close(f)
    with pytest.raises(ValueError, match="self_cpu_us"):
        P.plot_top_ops(pd.DataFrame({"name": ["x"]}))
    with pytest.raises(ValueError, match="timelines = \\[\\]"):
        P.plot_timeline([])


def test_flash_explorer_runs():
    ex = FlashExplorer(seq=64, block_size=32)
    ex.run_button.click()
    assert ex.result is not None and ex.result["seq"] == 64
    assert ex.result["flash_saved_bytes"] == ex.result["flash_predicted_bytes"]
    assert "for backward" in ex.status.value
