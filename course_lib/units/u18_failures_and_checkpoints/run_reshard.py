"""Unit 18, saving and loading: a run saved on 4 ranks continues on 2 and on 1 bit for bit; a
resume that forgets one part of the state; the errors of a bad checkpoint.

Used by notebooks/18_failures_and_checkpoints.ipynb through :mod:`run` (which re-exports these).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

import course_lib
from course_lib import kit, validate
from course_lib.resilience import PARTS


@dataclass(frozen=True)
class ReshardRow:
    """:func:`reshard_run`: one resumed step beside the same step of the unbroken run."""

    step: int
    world_size: int
    uninterrupted: float
    resumed: float
    same: bool


@dataclass(frozen=True)
class ForgetRow:
    """:func:`forget_table`: one step after a resume that left one part of the state fresh."""

    forgot: str
    step: int
    step_counted: int = field(metadata=kit.column("step counted"))
    loss: float
    uninterrupted: float
    gap: float


@dataclass(frozen=True)
class ForgetSummaryRow:
    """:func:`forget_summary`: one forgotten part against the unbroken run."""

    forgot: str
    largest_gap: float = field(metadata=kit.column("largest |loss gap|"))
    bit_for_bit: bool = field(metadata=kit.column("bit for bit"))
    ends_at: int = field(metadata=kit.column("run ends at step"))


@dataclass(frozen=True)
class CaseRow:
    """:func:`bad_checkpoints`: one checkpoint and what ``load`` said of it."""

    case: str
    says: str = field(metadata=kit.column("load says"))


def _segment(rank, world_size, *, root, start, stop, steps, save_at, parts=PARTS):
    """Train from checkpoint ``start`` (None: from scratch) to step ``stop``, saving at
    ``save_at``; returns [(step, loss)] and the flat weights at the end."""
    from course_lib import resilience
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    state = T.build(steps=steps, parts=parts)
    data = T.make_data()
    if start is not None:
        resilience.load(state, pathlib.Path(root) / start)
    out = []
    for step, loss in T.steps_until(state, data, stop):
        out.append((step, loss))
        if step in save_at:
            resilience.save(state, pathlib.Path(root) / f"step_{step:06d}")
    return out, T.full_weights(state)


def reshard_run(
    world_sizes: Sequence[int] = (4, 2, 1), *, steps: int = 12, timeout: float = 60.0
) -> pd.DataFrame:
    """The unit's MLP trained ``steps`` steps without a break on ``world_sizes[0]`` ranks, saving
    on the way, and the same run resumed: the first world size's checkpoint loaded and continued
    by the next world size, which saves in turn for the one after (equal segments). Rows (the
    resumed steps): step, world_size (of the segment), uninterrupted, resumed (losses), same
    (bitwise). ``attrs["weights_equal"]``: the final weights of both runs are the same bits."""
    sizes = validate.counts("world_sizes", world_sizes)
    if len(sizes) < 2:
        raise ValueError(f"world_sizes = {sizes!r}: expected at least two (saved, loaded)")
    for w in sizes:
        validate.choice("world_sizes", w, (1, 2, 4))
    steps = validate.count("steps", steps, minimum=len(sizes))
    cuts = [steps * (i + 1) // len(sizes) for i in range(len(sizes) - 1)]
    root = tempfile.mkdtemp(prefix="u18_reshard_")
    try:
        kw = dict(root=root, steps=steps, timeout=timeout)
        ref_losses, ref_w = course_lib.launch(
            _segment, sizes[0], start=None, stop=steps, save_at=(cuts[0],), **kw
        )[0]
        rows, resumed_w = [], None
        for i, w in enumerate(sizes[1:]):
            stop = cuts[i + 1] if i + 1 < len(cuts) else steps
            losses, resumed_w = course_lib.launch(
                _segment,
                w,
                start=f"step_{cuts[i]:06d}",
                stop=stop,
                save_at=(stop,) if stop < steps else (),
                **kw,
            )[0]
            rows += [(s, w, loss) for s, loss in losses]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ref_by_step = dict(ref_losses)
    df = kit.frame(
        [ReshardRow(s, w, ref_by_step[s], loss, ref_by_step[s] == loss) for s, w, loss in rows],
        ReshardRow,
    )
    df.attrs["weights_equal"] = bool(resumed_w is not None and (resumed_w == ref_w).all())
    df.attrs["saved_on"], df.attrs["cuts"] = sizes[0], cuts
    return df


def _forget_rank(rank, world_size, *, root, steps, cut, forget):
    from course_lib import resilience
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    curves = {}
    for part in ("nothing", *forget):
        parts = tuple(p for p in PARTS if p != part)
        state = T.build(steps=steps, parts=parts)
        resilience.load(state, pathlib.Path(root) / f"step_{cut:06d}")
        stop = state.step + steps - cut
        curves[part] = list(T.steps_until(state, T.make_data(), stop))  # (step, loss)
    return curves


def forget_table(
    forget: Sequence[str] = PARTS, *, steps: int = 16, cut: int = 6, world_size: int = 2
) -> pd.DataFrame:
    """Resume a run at step ``cut`` with one part of its state not restored (left as a fresh
    run has it), for each part in ``forget``; the same ``steps - cut`` steps are trained after
    the resume. Rows: forgot, step (after the resume: 1, 2, ...), loss, uninterrupted, gap."""
    names = validate.choices("forget", forget, PARTS)
    steps = validate.count("steps", steps, minimum=2)
    cut = validate.count("cut", cut, minimum=1, maximum=steps - 1)
    root = tempfile.mkdtemp(prefix="u18_forget_")
    try:
        ref = course_lib.launch(
            _segment, world_size, root=root, start=None, stop=steps, steps=steps, save_at=(cut,)
        )[0][0]
        curves = course_lib.launch(
            _forget_rank, world_size, root=root, steps=steps, cut=cut, forget=tuple(names)
        )[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    after = [loss for s, loss in ref if s > cut]
    rows = []
    for part, curve in curves.items():
        for i, (counted, loss) in enumerate(curve):
            rows.append(ForgetRow(part, cut + i + 1, counted, loss, after[i], loss - after[i]))
    return kit.frame(rows, ForgetRow)


def forget_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per forgotten part: the largest |gap| to the uninterrupted run and whether the resumed
    losses are the same bits."""
    rows = [
        ForgetSummaryRow(
            part, float(g.gap.abs().max()), bool((g.gap == 0).all()), int(g["step counted"].max())
        )
        for part, g in df.groupby("forgot", sort=False)
    ]
    return kit.frame(rows, ForgetSummaryRow)


def _bad_rank(rank, world_size, *, root):
    from course_lib import resilience
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    good = pathlib.Path(root) / "step_000002"
    state = T.build(steps=4)
    list(T.steps_until(state, T.make_data(), 2))
    resilience.save(state, good)
    cases = {}

    def attempt(name, path, st=None):
        try:
            resilience.load(st or T.build(steps=4), path)
            cases[name] = "loaded"
        except resilience.CheckpointError as err:
            cases[name] = str(err).replace(str(root), "<root>")

    bad = pathlib.Path(root) / "damaged"
    if rank == 0:
        shutil.copytree(good, bad / "missing")
        os.remove(bad / "missing" / "__1_0.distcp")
        shutil.copytree(good, bad / "truncated")
        f = bad / "truncated" / "__0_0.distcp"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        (pathlib.Path(root) / "step_000004.partial").mkdir()  # a write killed halfway
    import torch.distributed as dist

    dist.barrier()
    attempt("the good checkpoint", good)
    attempt("a wider model", good, T.build(steps=4, widths=(16, 128, 64, 8)))
    attempt("a shard file missing", bad / "missing")
    attempt("a shard file cut in half", bad / "truncated")
    attempt("a write killed halfway", pathlib.Path(root) / "step_000004.partial")
    latest = resilience.latest(root)
    cases["latest() picks"] = latest.name if latest else "nothing"
    return cases


def bad_checkpoints(world_size: int = 2) -> pd.DataFrame:
    """Save a good checkpoint on ``world_size`` ranks, damage copies of it (a shard file
    removed, one cut in half, a write left partial) and load each, and load the good one into a
    wider model. Rows: case, what load said (rank 0)."""
    root = tempfile.mkdtemp(prefix="u18_bad_")
    try:
        cases = course_lib.launch(
            _bad_rank, validate.count("world_size", world_size, minimum=2), root=root
        )[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return kit.frame([CaseRow(case, says) for case, says in cases.items()], CaseRow)
