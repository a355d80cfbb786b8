"""The one place for torch-version fallbacks.

torch 2.13 renamed the flat-tensor collectives: ``all_gather_into_tensor`` became
``all_gather_single`` and ``reduce_scatter_tensor`` became ``reduce_scatter_single`` (the old
names still work and call the new ones). The course is tested with 2.13 and runs on older
builds (a lent GPU machine may have 2.11), so code calls these two names from here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_single",
    "import_optional",
    "provide_new_collective_names",
    "quiet_import_logs",
    "reduce_scatter_single",
]

# Loggers that speak while an optional library is imported, about nothing the course does:
# torchao's "Failed to load .../_C_*.so" for GPU kernels a CPU wheel cannot load, and torch's
# pytree notes on the enums torchao registers (they carry the install's paths).
_IMPORT_NOISE = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_import_logs() -> Iterator[None]:
    """Import an optional library (torchao, peft) without its import-time log lines: below
    ERROR they are hidden inside the block; real errors still show."""
    loggers = [logging.getLogger(name) for name in _IMPORT_NOISE]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def import_optional(name: str, *, extra: str, needed_for: str) -> ModuleType:
    """Import ``name``, a library only some units use (pyproject.toml's optional extras, which
    ``make lab`` leaves out); missing, an ImportError whose one line names what needs it and the
    command that installs it."""
    try:
        with quiet_import_logs():
            return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"{needed_for} needs {name.split('.')[0]}, which `make lab` leaves out: run "
            f'`pip install -c constraints.txt -e ".[{extra}]"` in the course folder (or start '
            f"the course with `make lab EXTRAS={extra}`), then restart the kernel"
        ) from exc


def all_gather_single(
    output: torch.Tensor,
    input: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> Any:
    """``output`` (world_size * input.numel()) <- every rank's ``input``, in rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_single(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
) -> Any:
    """``output`` <- this rank's chunk of the element-wise reduction of every rank's ``input``."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)


def provide_new_collective_names() -> None:
    """On torch older than 2.13, give ``torch.distributed`` the two names 2.13 introduced
    (``all_gather_single``, ``reduce_scatter_single``), so the lectures' code and a learner's
    answer written with them run there too. Every rank the course starts calls it; on 2.13 and
    later it changes nothing.

    Each new name is a function of its own that calls the old one, as 2.13's old name calls the
    new: ``CommMeter`` wraps both and counts only the outer call. It is set on
    ``torch.distributed.distributed_c10d`` too, where ``CommMeter`` looks for what to wrap."""
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "all_gather_single"):

        def all_gather_single(  # type: ignore[no-untyped-def]
            output_tensor, input_tensor, group=None, async_op=False
        ):
            """torch 2.13's name for ``all_gather_into_tensor`` (course_lib.runtime.compat)."""
            return c10d.all_gather_into_tensor(
                output_tensor, input_tensor, group=group, async_op=async_op
            )

        for module in (c10d, dist):
            vars(module)["all_gather_single"] = all_gather_single
    if not hasattr(c10d, "reduce_scatter_single"):

        def reduce_scatter_single(  # type: ignore[no-untyped-def]
            output, input, op=dist.ReduceOp.SUM, group=None, async_op=False
        ):
            """torch 2.13's name for ``reduce_scatter_tensor`` (course_lib.runtime.compat)."""
            return c10d.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)

        for module in (c10d, dist):
            vars(module)["reduce_scatter_single"] = reduce_scatter_single
