"""Unit 14's plots: what a bar's label says about its plan."""

from __future__ import annotations

import pandas as pd

from course_lib.units.u14_planning_a_run import plots


def _plan(**kw) -> pd.Series:
    base = dict(rank=1, tp=2, cp=1, pp=2, v=1, ep=1, dp=16, zero=3, recompute="selective")
    return pd.Series({**base, "micro_batch": 1, **kw})


def test_plans_that_differ_in_any_dimension_get_different_labels():
    plans = [_plan(), _plan(v=2), _plan(v=4), _plan(cp=2), _plan(ep=8), _plan(micro_batch=2)]
    labels = [plots._label(p) for p in plans]
    assert len(set(labels)) == len(labels)
    assert labels[0] == "#1 TP2 PP2 DP16\nZeRO-3 selective mb1"  # a dimension at 1 is left out
    assert "PP2 v4" in labels[2] and "CP2" in labels[3] and "EP8" in labels[4]
