"""A sweep: one worker over a list of configurations, its rows framed (see :mod:`course_lib.kit`).

    @dataclass(frozen=True)
    class StepRow:
        batch: int
        width: int
        measured: int

    def measure_one(batch: int, width: int) -> StepRow: ...

    kit.sweep(measure_one, kit.grid(width=(64, 256), batch=(16, 64)), StepRow)

On ranks, ``world_size=n`` launches the worker once per configuration through
:func:`course_lib.launch` (the worker is then called ``worker(rank, world_size, **config)``); the
rows every rank returns are taken in rank order (a rank with nothing to report returns ``None``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import pandas as pd
import torch

from course_lib import validate
from course_lib.kit.rows import columns, frame
from course_lib.runtime.launch import launch

Row = TypeVar("Row")

__all__ = ["grid", "one_thread", "rows_of", "sweep"]


def grid(**axes: Iterable[Any]) -> list[dict[str, Any]]:
    """Every combination of the ``axes`` (name -> values), the first axis varying slowest."""
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"{name} = {values!r}: expected a sequence of values to sweep over")
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*axes.values())]


def rows_of(result: object, row_type: type[Row]) -> list[Row]:
    """The rows in one worker's result: a row, ``None`` (no row), or an iterable of rows."""
    if result is None:
        return []
    if isinstance(result, row_type):
        return [result]
    if (
        dataclasses.is_dataclass(result)
        or isinstance(result, (str, bytes, Mapping))
        or not isinstance(result, Iterable)
    ):
        raise TypeError(
            f"worker's result = {type(result).__name__}: expected a {row_type.__name__}, "
            f"a list of them or None"
        )
    found = []
    for item in result:
        found += rows_of(item, row_type)
    return found


def sweep(
    worker: Callable[..., object],
    configs: Iterable[Mapping[str, Any]],
    row_type: type[Row],
    *,
    world_size: int | None = None,
    **launch_options: Any,
) -> pd.DataFrame:
    """Run ``worker(**config)`` for each configuration and frame every row it returns.

    ``configs``: keyword arguments per run (see :func:`grid`). ``world_size``: ``None`` runs
    the worker in this process; ``n`` launches it on ``n`` ranks per configuration, with
    ``launch_options`` (``timeout``, ``backend``, ``threads_per_rank``) passed to ``launch``.
    The frame's columns are ``row_type``'s fields (:func:`~course_lib.kit.frame`).
    """
    columns(row_type)  # a frozen dataclass, checked before anything runs
    if not callable(worker):
        raise TypeError(f"worker = {worker!r}: expected a function that returns rows")
    if world_size is None and launch_options:
        raise TypeError(
            f"launch options = {sorted(launch_options)}: expected world_size = n ranks with them"
        )
    if world_size is not None:
        world_size = validate.count("world_size", world_size, minimum=1)
    rows: list[Row] = []
    for i, config in enumerate(configs):
        if not isinstance(config, Mapping):
            raise TypeError(f"configs[{i}] = {config!r}: expected a mapping of keyword arguments")
        if world_size is None:
            rows += rows_of(worker(**config), row_type)
        else:
            rows += rows_of(launch(worker, world_size, **config, **launch_options), row_type)
    return frame(rows, row_type)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block (or the decorated function), restored after.

    Tiny matmuls run faster on one thread than shared between two busy cores, and timings of
    them spread less.
    """
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
