"""Unit 12's task 1 (solutions/12_pipeline_parallelism.ipynb): predict the bubble of GPipe
with uneven stages. Re-exported by :mod:`checks`.

``collect_bubble_prediction`` calls the learner's formula on the drawn pipelines;
``judge_bubble_prediction`` replays on ideal hardware (``pipeline.replay``) the order each of 3
ranks runs in the course's GPipe (``pipeline.schedule_order``, the order a real run on 3 ranks
records: ``_bubble_worker``, tests/units/u12_pipeline_parallelism) and compares.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe, learner_value
from course_lib.grading.split import split_check

__all__ = ["check_bubble_prediction", "BUBBLE_REFERENCES"]

BUBBLE_REFERENCES = (
    "course_lib.measure.estimate.compute:pipeline_bubble_fraction",
    "course_lib.measure.estimate.compute:pipeline_bubble_ratio",
    "course_lib.parallel.pipeline.trace:replay",
    "course_lib.units.u12_pipeline_parallelism.run:replayed_bubble",
)
GRADE_TIMEOUT_S = 90.0


def _launch(task: int, worker, world_size: int, *args):
    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    try:
        return launch(worker, world_size, *args, timeout=GRADE_TIMEOUT_S)
    except LaunchError as exc:
        first = next(iter(exc.failures.values()), str(exc))
        fail(
            task,
            f"the run on {world_size} ranks did not finish: "
            f"{(str(first).strip().splitlines() or [''])[0]}",
        )


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

    return [
        learner_value(
            run_learner(task, fn, list(c["sizes"]), c["microbatches"], forbid=BUBBLE_REFERENCES)
        )
        for c in bubble_cases(task)
    ]


def expect_bubble_prediction(task: int = 1) -> list[float]:
    """What each drawn pipeline idles: the order each rank runs in the course's GPipe, replayed
    on ideal hardware. A real run records exactly that order (``_bubble_worker``; a test runs it
    on 3 ranks), so the grade replays the schedule rather than starting ranks to record it."""
    from course_lib.parallel import pipeline as P
    from course_lib.units.u12_pipeline_parallelism._cases import BUBBLE_RANKS, bubble_cases

    return [
        _replayed_idle(
            [
                P.schedule_order("gpipe", r, BUBBLE_RANKS, c["microbatches"])
                for r in range(BUBBLE_RANKS)
            ],
            c["sizes"],
        )
        for c in bubble_cases(task)
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
        "GPipe's idle fraction with uneven stages matches its order on 3 ranks replayed on ideal "
        "hardware (2 drawn pipelines)",
    )


check_bubble_prediction = split_check(
    collect_bubble_prediction, judge_bubble_prediction, expect=expect_bubble_prediction
)
