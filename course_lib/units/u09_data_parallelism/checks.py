"""Unit 09's graded checks (solutions/09_data_parallelism.ipynb, exercises/09_data_parallelism.ipynb).

1. ``check_bucketed_hook``: the learner's bucketed gradient hook, run on 2 and 3 real gloo ranks
   (inside the ranks under ``watch_references``: the course's DataParallel is out of reach), two
   SGD steps against one process on the full batch (parallel.harness), and every bucket
   all-reduced asynchronously during backward, in bucket order;
2. ``check_no_sync_loop``: the fixed accumulation loop: the gradients of the whole batch and one
   all-reduce per bucket per optimizer step, counted by CommMeter on 2 ranks;
3. ``check_accumulation_steps``: the batch arithmetic DeepSpeed asserts (the sources' config bug);
4. ``check_bytes_prediction``: bytes each rank sends per optimizer step, against bytes measured
   on the wire by the OS in real runs (gloo's headers allowed for).
Each check prints one deterministic line or raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import error_pair, fail, fmt_int, launch_learner, passed, run_learner

__all__ = [
    "check_bucketed_hook",
    "check_no_sync_loop",
    "check_accumulation_steps",
    "check_bytes_prediction",
    "HOOK_REFERENCES",
]

#: the course's answers to task 1, out of reach while the learner's hook runs
HOOK_REFERENCES = (
    "course_lib.parallel.ddp:DataParallel",
    "course_lib.parallel.ddp:allreduce_gradients",
)
# (not torch's DistributedDataParallel: torch itself calls its class methods during any
# backward; and a DDP wrapper the harness never calls would average nothing)
HOOK_CAP_MB = 0.0002  # 209 B: 4 buckets for the 6,800 B check model
GRADE_TIMEOUT_S = 60.0
HEADER_ALLOWANCE = 1024  # B per all-reduce and per peer: gloo's message headers (576 B measured)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _launch(task: int, worker, world_size: int, *args) -> list[dict]:
    return launch_learner(task, worker, world_size, *args, timeout=GRADE_TIMEOUT_S)


# --------------------------------------------------------------------------------------------
# task 1: the bucketed gradient hook
# --------------------------------------------------------------------------------------------
def training_case(task: int) -> dict:
    """Tasks 1 and 2: the seeds of the MLP and of its batches, drawn from the grading seed."""
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, "u09_data_parallelism")
    return {"seed": rng.randrange(10_000), "batch": rng.randrange(10_000)}


def _hook_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    from course_lib.grading.references import watch_references
    from course_lib.measure.comm import CommMeter
    from course_lib.parallel import harness as H
    from course_lib.parallel.ddp import assign_buckets
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    model = model_fn(case["seed"])  # the same seed on every rank: no broadcast needed
    buckets = assign_buckets(list(model.named_parameters()), int(HOOK_CAP_MB * 2**20))
    sizes = dict((n, p.numel() * p.element_size()) for n, p in model.named_parameters())
    steps: list[dict] = []
    used: list[str] = []
    try:
        with watch_references(forbid) as used:
            finish = fn(model, [list(b) for b in buckets])
            if not callable(finish):
                raise TypeError(
                    f"fn(model, buckets) = a {type(finish).__name__}: expected a finish() function"
                )

            def step_fn(m, batch):
                loss = H.mse_loss(m, batch)
                with CommMeter(dispatch=False) as meter:
                    loss.backward()
                    during = [(r["op"], r["bytes"], r["async"]) for r in meter.records]
                    finish()
                steps.append({"during": during, "calls": meter.calls})
                return loss

            record = H.parallel_run(
                model,
                lambda s: batch_fn(case["batch"] + s),
                steps=2,
                step_fn=step_fn,
                shard=(rank, world_size),
            )
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": list(used), "error": error_pair(exc)}
    return {
        "used": list(used),
        "record": record,
        "steps": steps,
        "bucket_bytes": [sum(sizes[n] for n in b) for b in buckets],
    }


def _check_hook_calls(task: int, where: str, k: int, step: dict, expected: list[int]) -> None:
    """One rank's step: one asynchronous all_reduce per bucket during backward, in bucket
    order, and no other collective call (``where``: "rank r of N")."""
    during = step["during"]
    if [op for op, _, _ in during] != ["all_reduce"] * len(during) or len(during) != len(expected):
        fail(
            task,
            f"{where}, step {k + 1}: expected "
            f"{len(expected)} all_reduce calls during backward (one per "
            f"bucket, launched from the hook), got {[op for op, _, _ in during]}",
        )
    if not all(a for _, _, a in during):
        fail(
            task,
            f"{where}: an all-reduce launched from the "
            "hook blocked backward; launch it with async_op=True and wait in "
            "finish()",
        )
    if [b for _, b, _ in during] != expected:
        fail(
            task,
            f"{where}: buckets went out as "
            f"{[b for _, b, _ in during]} B, expected {expected} B in bucket "
            "order (each bucket flattened into one tensor)",
        )
    calls = step["calls"]
    extra = {op: n for op, n in calls.items() if op != "all_reduce"} or calls.get(
        "all_reduce", 0
    ) - len(expected)
    if extra:
        fail(
            task,
            f"{where}: finish() made more collective calls than one all-reduce per bucket: {calls}",
        )


def check_bucketed_hook(fn, task: int = 1) -> None:
    """Task: ``fn(model, buckets)`` registers hooks that all-reduce each bucket asynchronously
    as soon as its gradients have all arrived, and returns ``finish()``, to be called after
    ``loss.backward()``: it waits and leaves the mean over ranks in every ``.grad``.

    Graded on 2 and 3 ranks, 2 SGD steps of the float64 MLP (4 buckets): losses, gradients and
    parameters equal one process on the full batch within the harness tolerance; during each
    backward exactly one asynchronous all_reduce per bucket, in bucket order."""
    from course_lib.parallel import harness as H
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = training_case(task)
    reference = H.reference_run(
        lambda seed: model_fn(case["seed"]), lambda s: batch_fn(case["batch"] + s), steps=2
    )
    for world_size in (2, 3):
        results = _launch(task, _hook_worker, world_size, fn, list(HOOK_REFERENCES), case)
        for rank, res in enumerate(results):
            for k, step in enumerate(res["steps"]):
                _check_hook_calls(
                    task, f"rank {rank} of {world_size}", k, step, res["bucket_bytes"]
                )
        table = H.compare(reference, [r["record"] for r in results])
        bad = table[~table.ok]
        if len(bad):
            row = bad.iloc[0]
            fail(
                task,
                f"on {world_size} ranks, step {row.step}, rank {row['rank']}: "
                f"{row.quantity} {row['name']!r} differs from one process on the full "
                f"batch ({row.problem})",
            )
    passed(
        task,
        "the bucketed hook matches one process on 2 and 3 ranks, with one "
        "asynchronous all-reduce per bucket launched during backward, in order",
    )


# --------------------------------------------------------------------------------------------
# task 2: the accumulation loop
# --------------------------------------------------------------------------------------------
MICRO_STEPS = 4


def _loop_worker(rank: int, world_size: int, fn, case) -> dict:
    from course_lib.measure.comm import CommMeter
    from course_lib.parallel import harness as H
    from course_lib.parallel.ddp import DataParallel
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    rows = 8 * world_size * MICRO_STEPS
    model = DataParallel(model_fn(case["seed"]), bucket_cap_mb=HOOK_CAP_MB)
    x, y = H.shard_batch(batch_fn(case["batch"], rows=rows), rank, world_size)
    micro = list(zip(x.chunk(MICRO_STEPS), y.chunk(MICRO_STEPS)))
    try:
        with CommMeter(dispatch=False) as meter:
            fn(model, micro)
    except Exception as exc:  # noqa: BLE001
        return {"error": error_pair(exc)}
    reference = H.reference_run(
        lambda seed: model_fn(case["seed"]), lambda s: batch_fn(case["batch"], rows=rows)
    ).grads[0]
    grads = H.full_tensors(model, "grad")
    worst = max(
        (
            float((grads[n] - g).abs().max()) / (1e-6 + 1e-5 * float(g.abs().max()))
            if n in grads
            else float("inf")
        )
        for n, g in reference.items()
    )
    return {"calls": meter.calls, "buckets": len(model.buckets), "worst": worst}


def check_no_sync_loop(fn, task: int = 2) -> None:
    """Task: ``fn(model, micro_batches)`` runs forward and backward on each (x, y) micro-batch
    of this rank so that the gradients are those of the whole batch, averaged over ranks, with
    one all-reduce per bucket for the whole optimizer step (``model.no_sync()``)."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    for rank, res in enumerate(_launch(task, _loop_worker, 2, fn, training_case(task))):
        calls, n = res["calls"].get("all_reduce", 0), res["buckets"]
        if calls != n:
            fail(
                task,
                f"rank {rank}: {calls} all-reduce calls for {MICRO_STEPS} micro-steps of "
                f"a {n}-bucket model; expected {n} (communicate on the last micro-step "
                "only)",
            )
        if not res["worst"] <= 1.0:
            fail(
                task,
                f"rank {rank}: the accumulated gradients differ from one process on the "
                f"whole batch ({res['worst']:.3g} x the tolerance); divide each "
                "micro-batch loss by the number of micro-steps, and sync the last one",
            )
    passed(
        task,
        f"{MICRO_STEPS} micro-steps, one all-reduce per bucket, gradients of the whole "
        "batch on 2 ranks",
    )


# --------------------------------------------------------------------------------------------
# task 3: the batch arithmetic
# --------------------------------------------------------------------------------------------
UNIT = "u09_data_parallelism"


def batch_cases(task: int) -> list[tuple[int, int, int, int | None]]:
    """Six (train_batch_size, micro_batch_per_gpu, world_size, steps or None), drawn from the
    grading seed around the lecture's 32 = 4 x 2 x 4: three that fit (one on a single GPU, one
    in a single step), one off by a remainder, one smaller than a single micro-step."""
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, UNIT)
    micro, gpus = (1, 2, 4, 8, 16), (2, 4, 8, 16, 32, 64, 128)
    cases: list[tuple[int, int, int, int | None]] = [(32, 4, 2, 4)]
    for n, steps in (
        (1, rng.randint(2, 16)),
        (rng.choice(gpus), 1),
        (rng.choice(gpus), rng.randint(2, 16)),
    ):
        m = rng.choice(micro)
        cases.append((m * n * steps, m, n, steps))
    m, n = rng.choice(micro[1:]), rng.choice(gpus)
    cases.append((m * n * rng.randint(2, 16) + rng.randint(1, m * n - 1), m, n, None))
    m, n = rng.choice(micro[1:]), rng.choice(gpus)
    cases.append((m * n // 2, m, n, None))
    rng.shuffle(cases)
    return cases


def check_accumulation_steps(fn, task: int = 3) -> None:
    """Task: ``fn(train_batch_size, micro_batch_per_gpu, world_size)`` returns the int number of
    accumulation steps that makes train = micro x steps x world hold, and raises ValueError
    when none does."""
    forbid = ["course_lib.units.u09_data_parallelism.run_scale:accumulation_steps_for"]
    cases = batch_cases(task)
    for b, m, n, steps in cases:
        if steps is None:
            got = None
            try:
                got = run_learner(task, fn, b, m, n, forbid=forbid)
            except AssertionError as exc:
                if "ValueError" in str(exc):
                    continue
                raise
            fail(
                task,
                f"train {b}, micro {m}, {n} GPUs: you returned {got!r}, but no whole number "
                "of steps fits: raise ValueError",
            )
        got = run_learner(task, fn, b, m, n, forbid=forbid)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(
                task,
                f"train {b}, micro {m}, {n} GPUs: expected an int, got "
                f"{type(got).__name__} {got!r}",
            )
        if got != steps:
            fail(
                task,
                f"train {b}, micro {m}, {n} GPUs: you returned {got} accumulation steps: "
                f"{m} x {got} x {n} = {m * got * n} rows per step, not {b}",
            )
    passed(task, f"accumulation steps right in {len(cases)} configs, including 32 = 4 x 2 x 4")


# --------------------------------------------------------------------------------------------
# task 4: bytes per step
# --------------------------------------------------------------------------------------------
#: (world size, micro-steps) measured for task 4
BYTE_CASES = ((2, 1), (2, 4), (4, 4))
#: hidden widths task 4's model is drawn from (the lecture measured 64)
BYTE_WIDTHS = tuple(w for w in range(40, 97, 4) if w != 64)


def _bytes_worker(rank: int, world_size: int, micro_list: list[int], width: int) -> dict:
    import contextlib

    import torch

    from course_lib.measure.comm import CommMeter
    from course_lib.parallel import harness as H
    from course_lib.parallel.ddp import DataParallel
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    out = {}
    for k in micro_list:
        model = DataParallel(model_fn(width=width, dtype=torch.float32), bucket_cap_mb=25.0)
        x, y = H.shard_batch(
            batch_fn(0, rows=8 * k * world_size, dtype=torch.float32), rank, world_size
        )
        with CommMeter(dispatch=False) as meter:
            for i, batch in enumerate(zip(x.chunk(k), y.chunk(k))):
                with model.no_sync() if i < k - 1 else contextlib.nullcontext():
                    (H.mse_loss(model, batch) / k).backward()
        out[k] = {
            "wire": meter.wire_bytes_sent,
            "model": meter.model_bytes_sent,
            "calls": meter.calls.get("all_reduce", 0),
            "n_params": sum(p.numel() for p in model.parameters()),
        }
    return out


def check_bytes_prediction(fn, task: int = 4) -> None:
    """Task: ``fn(n_params, dtype_bytes, world_size, micro_steps)`` predicts the int bytes each
    rank sends per optimizer step (a ring all-reduce of the gradients; ``no_sync`` on all
    micro-steps but the last), checked against the bytes each rank wrote to its sockets in
    real runs (gloo's message headers, up to 1 KiB per call and peer, allowed) of a model of
    drawn width."""
    from course_lib.grading.seeds import case_rng

    forbid = [
        f"course_lib.measure.estimate.communication:{f}"
        for f in ("ring_allreduce_bytes_sent", "allreduce_bytes_sent", "collective_bytes_sent")
    ]
    width = case_rng(task, UNIT).choice(BYTE_WIDTHS)
    measured: dict[tuple[int, int], list[Any]] = {}
    for n in sorted({n for n, _ in BYTE_CASES}):
        ks = [k for m, k in BYTE_CASES if m == n]
        for res in _launch(task, _bytes_worker, n, ks, width):
            for k in ks:
                measured.setdefault((n, k), []).append(res[k])
    for (n, k), ranks in measured.items():
        n_params = ranks[0]["n_params"]
        got = run_learner(task, fn, n_params, 4, n, k, forbid=forbid)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(task, f"expected an int number of bytes, got {type(got).__name__} {got!r}")
        for rank, r in enumerate(ranks):
            seen = r["wire"] if r["wire"] is not None else r["model"]
            slack = r["calls"] * HEADER_ALLOWANCE * (n - 1) if r["wire"] is not None else 0
            if not 0 <= seen - got <= slack:
                fail(
                    task,
                    f"{fmt_int(n_params)} float32 parameters, {n} ranks, {k} micro-steps: "
                    f"you predicted {fmt_int(got)} B; rank {rank} sent "
                    f"{'more' if seen > got else 'less'} ({r['calls']} all-reduce call(s))",
                )
    passed(
        task,
        f"bytes per optimizer step predicted for {len(measured)} measured runs "
        "(2 and 4 ranks, 1 and 4 micro-steps)",
    )
