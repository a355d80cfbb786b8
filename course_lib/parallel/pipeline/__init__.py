"""Pipeline parallelism from scratch: the layers are cut into stages, one rank per stage, and
micro-batches flow through them with point-to-point send/recv.
Introduced in notebooks/12_pipeline_parallelism.ipynb.

A stage computes its layers on a micro-batch and *sends the activation forward* to the next
stage; in backward it receives the gradient of that activation and *sends the gradient of its
own input back*. Nothing else crosses a stage boundary: one (b, s, h) tensor each way per
micro-batch. What a schedule decides is the order in which each rank runs its forwards (F) and
backwards (B); the order decides how long ranks wait (the bubble) and how many micro-batches'
activations a stage holds at once (its memory).

* ``naive``: one micro-batch goes all the way forward and back before the next starts; only one
  rank works at a time, (p-1)/p of the time is idle.
* ``gpipe`` (Huang et al. 2019, arXiv:1811.06965): all m forwards, then all m backwards. Idle
  fraction (p-1)/(m+p-1), but every stage holds m micro-batches of activations at its peak.
* ``1f1b``, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training", arXiv:2006.09503): stage s runs p-s-1 warm-up forwards, then alternates one forward
  and one backward, then drains. Same bubble as GPipe, but stage s holds at most p-s
  micro-batches. (Often credited to Megatron-LM; Megatron 2021 added the interleaving below.)
* ``interleaved`` (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", arXiv:2104.04473, Sec. 2.2.2): the model is cut into v·p smaller stages and rank r
  holds stages r, r+p, r+2p, ... (round robin), run in a 1F1B order. Each F/B is v times
  shorter, so the fill and drain shrink to (p-1)/(v·m) of the ideal time, at the price of v times
  more messages.

The schedules themselves: ``schedules.py``. What one rank holds and does: ``rank.py``
(:class:`PipelineRank`, :class:`Action`, :func:`stage_owner`); running a step: ``executor.py``
(:func:`run_schedule`); recording and reading its timeline: ``trace.py``
(:func:`bubble_from_events`, :func:`replay`). Weight versions of a pipeline that never flushes
(PipeDream-2BW): ``two_bw.py``. What we leave out (torch.distributed.pipelining has it):
splitting a model by tracing it, stages whose input and output shapes differ, zero-bubble
schedules.
"""

from __future__ import annotations

from course_lib.parallel.pipeline.executor import run_schedule
from course_lib.parallel.pipeline.rank import Action, PipelineRank, stage_owner
from course_lib.parallel.pipeline.schedules import (
    SCHEDULES,
    check_pipeline,
    gpipe_order,
    interleaved_order,
    make_stack,
    naive_order,
    one_f_one_b_order,
    schedule_order,
    split_layers,
)
from course_lib.parallel.pipeline.trace import bubble_from_events, replay

__all__ = [
    "SCHEDULES",
    "Action",
    "split_layers",
    "stage_owner",
    "naive_order",
    "gpipe_order",
    "one_f_one_b_order",
    "interleaved_order",
    "schedule_order",
    "check_pipeline",
    "make_stack",
    "PipelineRank",
    "run_schedule",
    "bubble_from_events",
    "replay",
]
