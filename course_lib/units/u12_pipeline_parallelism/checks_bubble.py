"""Unit 12's task 1 (solutions/12_pipeline_parallelism.ipynb): predict the bubble of GPipe
with uneven stages. Re-exported by :mod:`checks`.

``collect_bubble_prediction`` calls the learner's formula on the drawn pipelines;
``judge_bubble_prediction`` runs the course's GPipe on 3 real ranks, replays the order each rank
ran on ideal hardware (``pipeline.replay``) and compares.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe, learner_value
from course_lib.grading.split import split_check

__all__ = ["check_bubble_prediction"]


def _bubble_worker(rank, world_size, cases):
    return [_bubble_case(rank, world_size, c["sizes"], c["microbatches"]) for c in cases]


def _bubble_case(rank, world_size, sizes, microbatches):
    import torch
    import torch.nn.functional as F

    from course_lib.measure.timing import EventLog
    from course_lib.parallel import pipeline as P

    p, m, n = world_size, microbatches, sum(sizes)
    split = P.check_pipeline(
        "gpipe", n_layers=n, ranks=p, microbatches=m, batch_rows=m, sizes=sizes
    )
    model = P.PipelineRank(P.make_stack(n, width=8, seq=4, heads=2), split, rank, p)
    log = EventLog(rank)
    torch.manual_seed(0)
    x, y = torch.randn(m, 4, 8), torch.randn(m, 4, 8)  # (rows, seq, width), on every rank
    P.run_schedule(
        model,
        P.schedule_order("gpipe", rank, p, m),
        x,
        y,
        microbatches=m,
        loss_fn=F.mse_loss,
        log=log,
    )
    return log.to_records()


def _replayed_idle(orders, sizes) -> float:
    """Mean over ranks of the idle fraction of ``orders`` replayed with ``sizes`` layers per
    stage (F = a stage's layers, B twice that, messages free)."""
    import statistics

    import pandas as pd

    from course_lib.parallel import pipeline as P

    split = P.split_layers(sum(sizes), len(sizes), sizes=sizes)
    spans = pd.DataFrame(P.replay(orders, split)).assign(lane="compute")
    return statistics.fmean(P.bubble_from_events(spans).values())


def collect_bubble_prediction(fn, task: int = 1) -> list[Any]:
    """Task: ``fn(layers, microbatches)`` -> the idle fraction of one GPipe step (idle time
    over the whole step, mean over ranks), a float, when stage k has ``layers[k]`` layers, an F
    costs a stage's layers and a B twice that. Graded on two drawn pipelines on 3 real ranks
    (uneven stages; one with m <= p), the order each rank ran replayed on ideal hardware, to
    1e-9."""
    from course_lib.units.u12_pipeline_parallelism._cases import bubble_cases
    from course_lib.units.u12_pipeline_parallelism.checks import BUBBLE_REFERENCES

    return [
        learner_value(
            run_learner(task, fn, list(c["sizes"]), c["microbatches"], forbid=BUBBLE_REFERENCES)
        )
        for c in bubble_cases(task)
    ]


def expect_bubble_prediction(task: int = 1) -> list[float]:
    """What each drawn pipeline idles: a real GPipe run on 3 ranks, its order replayed on ideal
    hardware (the grade runs it while the learner's side runs)."""
    from course_lib.measure.timing import merge_event_logs
    from course_lib.units.u12_pipeline_parallelism._cases import BUBBLE_RANKS, bubble_cases
    from course_lib.units.u12_pipeline_parallelism.checks import _launch
    from course_lib.units.u12_pipeline_parallelism.run import _recorded_orders

    cases = bubble_cases(task)
    runs = _launch(task, _bubble_worker, BUBBLE_RANKS, cases)
    return [
        _replayed_idle(
            _recorded_orders(merge_event_logs([r[i] for r in runs]), BUBBLE_RANKS), c["sizes"]
        )
        for i, c in enumerate(cases)
    ]


def judge_bubble_prediction(data: Any, task: int = 1, expected: Any = None) -> None:
    from course_lib.units.u12_pipeline_parallelism._cases import bubble_cases

    cases = bubble_cases(task)
    got_all = data if isinstance(data, list) and len(data) == len(cases) else [None] * len(cases)
    predictions = []
    for c, got in zip(cases, got_all):
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got):
            fail(
                task,
                f"fn({c['sizes']}, {c['microbatches']}) must return a finite float, "
                f"got {describe(got)}",
            )
        predictions.append(float(got))
    for c, got, replayed in zip(cases, predictions, expected):
        if abs(got - replayed) > 1e-9:
            fail(
                task,
                f"layers per stage {c['sizes']}, m = {c['microbatches']}: you predicted "
                f"{got:.6f}; the run's order replayed on ideal hardware idles "
                f"{'more' if replayed > got else 'less'}",
            )
    passed(
        task,
        "GPipe's idle fraction with uneven stages matches real runs on 3 ranks replayed on ideal "
        "hardware (2 drawn pipelines)",
    )


check_bubble_prediction = split_check(
    collect_bubble_prediction, judge_bubble_prediction, expect=expect_bubble_prediction
)
