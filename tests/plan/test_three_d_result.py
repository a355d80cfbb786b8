"""The 3-D run's typed result (``Run3D``, ``RankRun3D``), built here by hand (no rank starts):
its frame, its dict form (what the exported cluster experiment stores), the round trip through
a results file, and the experiment's comparison of a run made here with one loaded from a file."""

from __future__ import annotations

import pytest
import torch

from course_lib import cluster
from course_lib.cluster.results import dumps, loads
from course_lib.dims import ParallelDims
from course_lib.plan import three_d
from course_lib.plan.three_d_result import RankRun3D, Run3D


def rank(i: int, pp: int, wire: int | None) -> RankRun3D:
    return RankRun3D(
        rank=i,
        coords=(pp, 0, i % 2),
        losses=(None, None) if pp == 0 else (4.25, 4.0),
        memory={"params": 400 + i, "grads": 300, "optimizer": 620},
        peak_bytes=2000 + i,
        params_numel=75,
        buffer_bytes=100,
        comm={"p2p_bytes_sent": 64, "model_bytes_sent": 96 + i, "wire_bytes_sent": wire},
        calls={"all_reduce": 7, "isend": 2, "recv": 2},
        params={"w": torch.full((2,), float(i))} if i % 2 == 0 else None,
    )


RUN = Run3D(
    ranks=(rank(0, 0, 120), rank(1, 0, None), rank(2, 1, 130), rank(3, 1, 131)),
    losses=(4.25, 4.0),
    params={"w": torch.zeros(2)},
    dims=ParallelDims(dp=1, tp=2, pp=2),
    config=three_d.tiny_config(),
    steps=2,
    batch=4,
    microbatches=2,
    lr=1e-3,
    seed=0,
)


def test_frame_has_one_row_per_rank_with_its_measurements():
    frame = RUN.to_frame()
    assert list(frame.columns) == [
        "rank",
        "pp",
        "dp",
        "tp",
        "params",
        "grads",
        "optimizer",
        "peak_bytes",
        "params_numel",
        "buffer_bytes",
        "all_reduce",
        "send",
        "recv",
        "p2p_bytes_sent",
        "model_bytes_sent",
        "wire_bytes_sent",
    ]
    assert list(frame["pp"]) == [0, 0, 1, 1] and list(frame["tp"]) == [0, 1, 0, 1]
    assert list(frame["params"]) == [400, 401, 402, 403]
    assert list(frame["model_bytes_sent"]) == [96, 97, 98, 99]
    assert frame["wire_bytes_sent"].isna().tolist() == [False, True, False, False]
    table = three_d.comm_table(RUN)
    assert list(table.columns)[:4] == ["rank", "pp", "dp", "tp"] and len(table.columns) == 10


def test_dict_form_is_the_old_result_and_reads_back():
    old = RUN.as_dict()
    assert list(old) == ["ranks", "losses", "params", "layout", "config", "setup"]
    assert old["layout"] == {"dp": 1, "tp": 2, "pp": 2}
    assert old["setup"] == {"steps": 2, "batch": 4, "microbatches": 2, "lr": 1e-3, "seed": 0}
    assert old["losses"] == [4.25, 4.0] and old["ranks"][2]["losses"] == [4.25, 4.0]
    assert old["ranks"][0]["coords"] == (0, 0, 0)
    back = Run3D.from_dict(old)
    assert all(isinstance(r, RankRun3D) for r in back.ranks) and back.dims == RUN.dims
    assert cluster.results.differences(back, RUN) == []


def test_a_results_file_round_trip_and_the_experiment_compares_run_with_file():
    value, _ = loads(dumps(RUN.as_dict()))  # what the exported u14.run_3d writes and loads
    exp = cluster.get("u14.run_3d")
    assert exp.differences(RUN, value) == []  # a run made here against the file's dict
    changed = RUN.as_dict()
    changed["ranks"][3]["memory"] = {"params": 1, "grads": 300, "optimizer": 620}
    assert exp.differences(RUN, changed) != []
    # a typed result stored as such round-trips too (course_lib's dataclasses are rebuilt)
    typed, _ = loads(dumps(RUN))
    assert isinstance(typed, Run3D) and cluster.results.differences(typed, RUN) == []


def test_results_are_frozen():
    with pytest.raises(AttributeError):
        RUN.steps = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        RUN.ranks[0].rank = 5  # type: ignore[misc]
