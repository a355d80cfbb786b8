"""Mixture of experts and expert parallelism (notebooks/16_mixture_of_experts.ipynb).

* ``moe.py``: the one-process reference layer :class:`MoE` (router, top-k, capacity, the
  load-balancing loss, shared experts) and :func:`route`, the routing alone;
* ``dispatch.py``: :class:`ExpertParallel` (experts split over ranks, tokens
  dispatched and combined with ``all_to_all_single`` of uneven splits), :func:`all_to_all`
  (differentiable), :func:`dispatch_splits`, :func:`sync_moe_grads`.

This package front re-exports the public names of both.
"""

from __future__ import annotations

from course_lib.parallel.experts.dispatch import (
    ExpertParallel,
    all_to_all,
    dispatch_splits,
    sync_moe_grads,
)
from course_lib.parallel.experts.moe import (
    ROUTERS,
    Expert,
    MoE,
    Router,
    Routing,
    capacity,
    load_balancing_loss,
    route,
    shared_sum,
    update_bias,
)

__all__ = [
    "Router",
    "ROUTERS",
    "Routing",
    "Expert",
    "MoE",
    "route",
    "capacity",
    "load_balancing_loss",
    "update_bias",
    "shared_sum",
    "ExpertParallel",
    "all_to_all",
    "dispatch_splits",
    "sync_moe_grads",
]
