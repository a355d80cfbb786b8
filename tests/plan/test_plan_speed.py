"""The planner's search is fast and changes nothing by being fast: ``plan()`` shares what layouts
of one search have in common (a stage's compute and TP / CP / EP traffic across the ZeRO stages
and interleavings, one layer's activations across the ZeRO stages) and skips re-checking the
layouts the search built valid. Three guards:

* its output, every row and field, equals the one-layout-at-a-time path (``plan.evaluate`` per
  candidate, nothing shared) on five searches;
* on eight searches (DeepSeek-V3 on 2,048 GPUs, Llama 3 405B on 16,384, ...) it equals what the
  planner printed before it shared anything (``plan_reference.json``: row counts, each column's
  sum over every row, the first five rows);
* the work is counted, not timed: DeepSeek-V3's 45,540 layouts cost 1,896 stage compute
  prices, not 17,561. A wall-clock bound is marked slow.

A deliberate change to what the planner predicts changes the recorded sums: record them again
with ``python tests/plan/test_plan_speed.py`` (the one-layout-at-a-time test still guards the
sharing)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pandas.testing as pdt
import pytest

from course_lib import plan as P
from course_lib.plan import planner, search
from course_lib.plan.published import RUNS
from course_lib.plan.specs import ModelSpec

REFERENCE = json.loads((Path(__file__).with_name("plan_reference.json")).read_text())
H100, A100 = "8xH100 + 400G IB", "8xA100-80GB + 200G IB"
_GPT = dict(
    gated_mlp=False, bias=True, norm="layernorm", tied_embeddings=True, learned_positions=True
)
_SHAPE = P.DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape")


def _case(name: str) -> tuple[ModelSpec, Any, dict[str, Any]]:
    """(model, cluster, plan() keywords) of one recorded search."""
    ds, q = RUNS["DeepSeek-V3"], RUNS["Qwen3-30B-A3B, 16 H100"]
    llama, l128 = RUNS["Llama 3 405B, 8K, 16,384 GPUs"], RUNS["Llama 3 405B, 128K, 16,384 GPUs"]
    gpt = ModelSpec("GPT-1.7B", 24, 2304, 24, 24, 4 * 2304, 51200, 2048, dropout=True, **_GPT)
    return {
        "ds": (ds.model, P.cluster(ds.cluster, gpus=2048),
               dict(global_batch_tokens=ds.global_batch_tokens, uneven_stages=True, assumptions=ds.assumptions)),
        "llama16k": (llama.model, P.cluster(H100, gpus=16384),
                     dict(global_batch_tokens=llama.global_batch_tokens, uneven_stages=True)),
        "ds_flat": (ds.model, P.cluster(ds.cluster, gpus=2048), dict(global_batch_tokens=ds.global_batch_tokens)),
        "qwen30": (q.model, P.cluster(H100, gpus=16),
                   dict(global_batch_tokens=q.global_batch_tokens, assumptions=q.assumptions, total_tokens=1e12)),
        "mtnlg": (P.model("MT-NLG-530B"), P.cluster(A100, gpus=2240),
                  dict(global_batch_tokens=1920 * 2048, allow_tp_across_nodes=True)),
        "l128": (l128.model, P.cluster(H100, gpus=16384),
                 dict(global_batch_tokens=l128.global_batch_tokens, uneven_stages=True,
                      only={"micro_batch": [1], "pp": [8, 16, 32]})),
        "gpt1.7shape": (gpt, P.cluster(A100, gpus=32), dict(global_batch_tokens=512 * 2048, assumptions=_SHAPE)),
        "mixtral": (P.model("Mixtral-8x7B"), P.cluster(H100, gpus=64),
                    dict(global_batch_tokens=1024 * 4096, assumptions=_SHAPE)),
    }[name]  # fmt: skip


def _one_at_a_time(model: ModelSpec, cluster: Any, kw: dict[str, Any]) -> pd.DataFrame:
    """plan() the slow way: ``evaluate`` on each candidate, checked, nothing shared."""
    how = kw.get("assumptions", P.DEFAULT_ASSUMPTIONS)
    uneven, tokens = kw.get("uneven_stages", False), kw["global_batch_tokens"]
    rows = []
    for layout in search.candidates(model, cluster, cluster.gpus, tokens, uneven, 8,
                                    kw.get("allow_tp_across_nodes", False), kw.get("only")):  # fmt: skip
        row = P.evaluate(model, cluster, layout, global_batch_tokens=tokens, assumptions=how,
                         uneven_stages=uneven, timed=False)  # fmt: skip
        if row["fits"]:
            row = P.evaluate(model, cluster, layout, global_batch_tokens=tokens, assumptions=how,
                             uneven_stages=uneven, total_tokens=kw.get("total_tokens"))  # fmt: skip
        rows.append(row)
    return planner._ranked(pd.DataFrame(rows))


@pytest.mark.parametrize(
    "name, only",
    [
        ("ds", {"pp": [8, 16], "micro_batch": [1, 2]}),  # MoE, FP8, DualPipe, by shape, uneven
        ("qwen30", None),  # every layout of a small MoE run, with days
        ("llama16k", None),
        ("mtnlg", None),  # tp across nodes
        ("gpt1.7shape", None),
    ],
)
def test_plan_equals_the_one_layout_at_a_time_path(name, only):
    model, cluster, kw = _case(name)
    if only:
        kw = {**kw, "only": only}
    fast = P.plan(model, cluster, **kw)
    slow = _one_at_a_time(model, cluster, kw)
    pdt.assert_frame_equal(fast, slow, check_exact=True)
    pdt.assert_frame_equal(fast.attrs["rejected"], slow.attrs["rejected"], check_exact=True)
    assert len(fast) > 10 and len(fast.attrs["rejected"]) > 0  # the comparison compares something


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float):
        return (
            math.isnan(want)
            if math.isnan(got)
            else got == pytest.approx(want, rel=1e-12, abs=1e-300)
        )
    return bool(got == want)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_plan_equals_what_it_printed_before_it_was_made_fast(name, monkeypatch):
    calls: list[Any] = []  # the layouts whose stage compute was priced
    real = planner.compute_s
    monkeypatch.setattr(planner, "compute_s", lambda *a: calls.append(a[2]) or real(*a))
    model, cluster, kw = _case(name)
    result = P.plan(model, cluster, **kw)
    for part, df in (("fits", result), ("rejected", result.attrs["rejected"])):
        ref = REFERENCE[name][part]
        assert (len(df), list(df.columns)) == (ref["rows"], ref["columns"]), (name, part)
        for c, total in ref["sums"].items():
            assert _same(float(df[c].astype(float).sum()), total), (name, part, c)
        for c, counts in ref["counts"].items():
            assert {str(k): int(v) for k, v in df[c].value_counts().items()} == counts, (
                name,
                part,
                c,
            )
        for i, want in enumerate(ref["top"]):
            got = {
                k: v.item() if hasattr(v, "item") else v for k, v in df.iloc[i].to_dict().items()
            }
            bad = [k for k in want if not _same(got[k], want[k])]
            assert not bad, (name, part, i, {k: (got[k], want[k]) for k in bad})
    # the work is counted: the stage compute is priced once per family (the layout less its
    # ZeRO stage and interleaving), not once per layout that fits
    family = ["dp", "tp", "pp", "cp", "ep", "etp", "micro_batch", "recompute"]
    assert len(calls) == len({tuple(r) for r in result[family].values}) < len(result)
    if name == "ds":  # DeepSeek-V3 on 2,048 H800s: 45,540 layouts, 17,561 fit, 1,896 families
        assert (len(result), len(result.attrs["rejected"]), len(calls)) == (
            17561,
            45540 - 17561,
            1896,
        )


@pytest.mark.slow
def test_the_two_large_searches_answer_in_seconds():
    """The issue's bounds (DeepSeek-V3 on 2,048 GPUs under 2 s, Llama 3 405B on 16,384 under 1 s,
    about 1.5 s and 0.05 s of CPU on this 2-core machine), doubled for a loaded machine; CPU time,
    not wall time, so that waiting for a core does not count."""
    for name, bound in (("ds", 4.0), ("llama16k", 2.0)):
        model, cluster, kw = _case(name)
        start = time.process_time()
        P.plan(model, cluster, **kw)
        assert time.process_time() - start < bound, name


def _record() -> None:
    """Write ``plan_reference.json`` from the planner as it is now."""

    def part(df: pd.DataFrame, top: int) -> dict[str, Any]:
        numeric = [
            c
            for c in df.columns
            if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        ]
        return {
            "rows": len(df),
            "columns": list(df.columns),
            "sums": {c: float(df[c].astype(float).sum()) for c in numeric},
            "counts": {c: {str(k): int(v) for k, v in df[c].value_counts().sort_index().items()}
                       for c in df.columns if c not in numeric},
            "top": [{k: v.item() if hasattr(v, "item") else v for k, v in r.items()}
                    for r in df.head(top).to_dict("records")],
        }  # fmt: skip

    out = {}
    for name in REFERENCE:
        model, cluster, kw = _case(name)
        result = P.plan(model, cluster, **kw)
        out[name] = {"fits": part(result, 5), "rejected": part(result.attrs["rejected"], 2)}
    Path(__file__).with_name("plan_reference.json").write_text(
        json.dumps(out, separators=(",", ":"))
    )


if __name__ == "__main__":
    _record()
