"""Distributed checkpoints over ``torch.distributed.checkpoint`` (DCP), written then renamed.

Introduced in notebooks/18_failures_and_checkpoints.ipynb.

``save(state, path)``: every rank writes its own shards (a DTensor's local piece; a plain tensor
or Python value once, by one rank) into ``path + ".partial"``; when every rank is done and DCP
has written the index (``.metadata``), rank 0 renames the folder to ``path``. A run killed in the
middle of a write leaves ``path.partial`` behind and ``path`` (the previous checkpoint, if any)
untouched: :func:`latest` never returns a partial one.

``load(state, path)``: checks the checkpoint against the state it is loaded into before reading a
byte (every key there, every shape the same, every shard file present and as long as the index
says), then lets DCP read what each rank needs. A DTensor loads into any number of ranks: DCP
reads the pieces of the saved shards that overlap the new ones (4 ranks saved, 2 or 1 load).
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from course_lib import validate
from course_lib.resilience.failures import CheckpointIOError, by_rank, from_dcp, gather, on_rank0

__all__ = [
    "CheckpointError",
    "CheckpointIOError",
    "PendingSave",
    "save",
    "load",
    "latest",
    "checkpoint_bytes",
    "verify",
]

PARTIAL = ".partial"
#: what a failed save leaves, said after the ranks that failed and why
NOT_SAVED = "not saved; a checkpoint already there is untouched"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this state: the message names what does not match."""


def _rank(group) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _barrier(group) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def _stateful(state: Any) -> dict:
    sd = state.state_dict() if hasattr(state, "state_dict") else state
    if not isinstance(sd, Mapping):
        raise TypeError(
            f"state = {validate.describe(state)}: expected a dict or an object with state_dict()"
        )
    return dict(sd)


def _folder(path: Any) -> pathlib.Path:
    """``path`` as a folder to write or read, refused before any collective when it is not
    one (not a path, or no name: ``""``, ``"."``, ``"/"``)."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path = {validate.describe(path)}: expected a folder (str or PathLike)")
    folder = pathlib.Path(path)
    if not folder.name:
        raise ValueError(
            f"path = {str(path)!r}: expected a checkpoint folder with a name, e.g. "
            "'checkpoints/step_000100'"
        )
    return folder


def _publish(path: pathlib.Path, group) -> None:
    """Rank 0 swaps the finished ``.partial`` folder in; the others wait for it (and raise
    rank 0's error with it if the file system refused the rename)."""

    def swap() -> None:
        old = path.with_name(path.name + ".old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(path.with_name(path.name + PARTIAL), path)
        shutil.rmtree(old, ignore_errors=True)

    on_rank0(group, swap, "renaming into", path, path, "written in .partial, not renamed")


def _fresh_partial(partial: pathlib.Path) -> None:
    shutil.rmtree(partial, ignore_errors=True)  # a write killed earlier
    partial.mkdir(parents=True)


class PendingSave:
    """An ``async_save`` in flight: training goes on; :meth:`wait` finishes the write and the
    rename (every rank calls it, before the next save)."""

    def __init__(self, future: Any, path: pathlib.Path, group) -> None:
        self._future, self.path, self._group = future, path, group

    def wait(self, timeout: float = 120.0) -> pathlib.Path:
        fut = getattr(self._future, "upload_completion", self._future)
        partial = self.path.with_name(self.path.name + PARTIAL)
        try:
            fut.result(timeout=validate.number("timeout", timeout, positive=True))
        except CheckpointException as exc:
            raise from_dcp(exc, "writing", partial, self.path, NOT_SAVED) from exc
        _barrier(self._group)
        _publish(self.path, self._group)
        return self.path


def save(
    state: Any, path: str | os.PathLike, *, group=None, async_: bool = False
) -> pathlib.Path | PendingSave:
    """Write ``state`` (a dict, or an object with ``state_dict()`` such as :class:`TrainState`)
    to the checkpoint folder ``path``, every rank its own shards, then rename it into place.

    Called by every rank of ``group`` (default: the whole world). ``async_=True`` copies the
    tensors and returns at once with a :class:`PendingSave` whose ``wait()`` completes the
    write (``torch.distributed.checkpoint.async_save``); otherwise returns ``path`` once it is
    there.

    A save that fails (a full disk, a folder it may not write) raises
    :class:`CheckpointIOError` on every rank, naming each failed rank and its cause in its first
    lines (``rank 1: No space left on device (ENOSPC) writing '<path>.partial'``), DCP's own
    report as its cause; the checkpoint already at ``path``, if any, is untouched."""
    sd = _stateful(state)  # a bad state or path is refused before the first barrier
    path = _folder(path)
    partial = path.with_name(path.name + PARTIAL)
    on_rank0(group, lambda: _fresh_partial(partial), "creating", partial, path, NOT_SAVED)
    no_dist = not dist.is_initialized()
    try:
        if async_:
            fut = dcp.async_save(sd, checkpoint_id=partial, process_group=group, no_dist=no_dist)
            return PendingSave(fut, path, group)
        dcp.save(sd, checkpoint_id=partial, process_group=group, no_dist=no_dist)
    except CheckpointException as exc:
        raise from_dcp(exc, "writing", partial, path, NOT_SAVED) from exc
    _barrier(group)
    _publish(path, group)
    return path


def latest(root: str | os.PathLike) -> pathlib.Path | None:
    """The complete checkpoint in ``root`` whose name sorts last (``step_000120`` after
    ``step_000080``), or None: a ``.partial`` folder left by a killed write is never chosen; a
    checkpoint being replaced (``name.old``) stands in for ``name`` if the rename was cut short."""
    root = pathlib.Path(root)
    if not root.is_dir():
        return None
    done = {
        p.name: p
        for p in root.iterdir()
        if p.is_dir() and not p.name.endswith((PARTIAL, ".old")) and (p / ".metadata").is_file()
    }
    for old in root.glob("*.old"):  # killed between the two renames of an overwrite
        if old.name[:-4] not in done and (old / ".metadata").is_file():
            done[old.name[:-4]] = old
    return done[max(done)] if done else None


def _metadata(path: pathlib.Path) -> Metadata:
    if not (path / ".metadata").is_file():
        what = "a partial write (killed before it finished)" if path.name.endswith(PARTIAL) else ""
        raise CheckpointError(
            f"path = {str(path)!r}: expected a checkpoint folder with its index (.metadata); "
            + (what or "none there")
        )
    try:
        return dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # a torn index
        raise CheckpointError(
            f"path = {str(path)!r}: expected a readable index, .metadata is damaged ({exc})"
        ) from None


def _files_complete(path: pathlib.Path, meta: Metadata) -> None:
    """Every shard file the index names is there and as long as its last item's end."""
    need: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        rel = str(info.relative_path)
        need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(need.items()):
        f = path / rel
        if not f.is_file():
            writer = re.match(r"__(\d+)_", rel)  # DCP names a rank's files __<rank>_<n>.distcp
            raise CheckpointError(
                f"shard file = {rel!r}: expected in {str(path)!r}, it is missing "
                + (f"(rank {writer[1]} wrote it when saving)" if writer else "(a rank wrote it)")
            )
        have = f.stat().st_size
        if have < size:
            raise CheckpointError(
                f"shard file = {rel!r}: expected at least {size:,} bytes, it has {have:,} "
                "(truncated)"
            )


def _flat(sd: Mapping) -> dict[str, Any]:
    """The state's leaves under the dotted keys DCP writes in its index (lists indexed)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    return dict(flatten_state_dict(dict(sd))[0])


def verify(state: Any, path: str | os.PathLike) -> Metadata:
    """Check that the checkpoint at ``path`` can fill ``state``: raises :class:`CheckpointError`
    naming the first key, shape or file that does not match; returns DCP's index."""
    path = _folder(path)
    meta = _metadata(path)
    saved = meta.state_dict_metadata
    for key, value in _flat(_stateful(state)).items():
        if key not in saved:
            raise CheckpointError(
                f"{key} = missing from the checkpoint: expected every key of the state "
                f"({len(saved)} saved in {str(path)!r})"
            )
        if isinstance(value, torch.Tensor):
            want = tuple(value.shape)  # a DTensor's shape is the global one
            entry = saved[key]
            have = tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else None
            if have != want:
                raise CheckpointError(
                    f"{key} = shape {have} in the checkpoint: expected {want}, the shape of "
                    "the state it is loaded into (another model?)"
                )
    _files_complete(path, meta)
    return meta


def _verify_on_every_rank(sd: dict, path: str | os.PathLike, group) -> None:
    """:func:`verify` on every rank; where any rank's check fails, every rank raises, naming
    each rank that failed and why (one that cannot see a shard: a folder not shared between
    nodes), instead of the others entering DCP's collectives without it."""
    error: CheckpointError | None = None
    try:
        verify(sd, path)
    except CheckpointError as exc:
        error = exc
    if not dist.is_initialized():
        if error is not None:
            raise error
        return
    failures = gather(group, None if error is None else str(error))
    if failures:
        raise CheckpointError(by_rank(failures)) from error


def load(state: Any, path: str | os.PathLike, *, group=None) -> Any:
    """Fill ``state`` (a dict, or an object with ``state_dict``/``load_state_dict``) from the
    checkpoint at ``path``, on however many ranks now run (every rank of ``group`` calls it).
    Nothing is read before :func:`verify` has passed; a read that fails on some rank all the
    same raises :class:`CheckpointIOError` naming each such rank and its cause. Returns
    ``state``."""
    sd = _stateful(state)
    _verify_on_every_rank(sd, path, group)
    with warnings.catch_warnings():  # one process without a group: DCP's note says so
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        try:
            dcp.load(
                sd, checkpoint_id=str(path), process_group=group, no_dist=not dist.is_initialized()
            )
        except CheckpointException as exc:
            outcome = "not loaded; the state may be filled in part"
            raise from_dcp(exc, "reading", path, path, outcome) from exc
    if hasattr(state, "load_state_dict") and not isinstance(state, Mapping):
        state.load_state_dict(sd)
    elif isinstance(state, dict):
        state.update(sd)
    return state


def checkpoint_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk of a checkpoint folder (shards and index)."""
    return sum(f.stat().st_size for f in pathlib.Path(path).rglob("*") if f.is_file())
