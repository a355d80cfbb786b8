"""Checks for the exercises of unit 08, collectives (solutions/08_collectives.ipynb).

The learner's functions are launched on 2, 3 and 4 real gloo ranks with course_lib.launch and
compared with torch.distributed (values) and with course_lib.measure.estimate (bytes: the payloads
the learner's code hands to send/isend, counted by CommMeter from the calls it makes; for
point-to-point calls that is what the model counts too, the wire adds only gloo's headers). Each check prints one deterministic line or raises AssertionError("✗ task N: ...").
The sizes of task 3, the delays of task 4 and a model size and GPU count of task 6 are drawn
from the grading seed (:func:`course_lib.grading.seeds.case_rng`).
"""

from __future__ import annotations

from course_lib.grading.core import fail, fmt_int, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.units.u08_collectives.checks_ranks import (
    _BYTES_REFERENCES,
    GRADE_TIMEOUT_S,
    WORLD_SIZES,
    _all_gather_worker,
    _all_reduce_worker,
    _check_bytes,
    _check_cases,
    _composite_worker,
    _guarded,
    _launch_learner,
    _name,
    draw_ring_case,
)

# --------------------------------------------------------------------------------------------
# what runs inside the ranks
# --------------------------------------------------------------------------------------------
# The meters run with dispatch=False: they count direct torch.distributed calls (all a ring needs)
# without importing torch.distributed.tensor in every rank, which costs seconds per launch.


UNIT = "u08_collectives"


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
def check_ring_all_reduce(fn, task: int = 1) -> None:
    """Task: ring all-reduce from send/recv. ``fn(tensor)`` sums ``tensor`` over ranks in place.

    Graded on 2, 3 and 4 ranks, on sizes drawn from the grading seed (one element, a small and a
    large size no N divides: :func:`draw_ring_case`), float32 and float64, against
    ``dist.all_reduce`` (within the summation-order bound 2(N-1) eps sum|x|), then on a drawn size
    divisible by N: every rank must send exactly estimate.ring_allreduce_bytes_sent(S, N) bytes
    through point-to-point calls only.
    """
    from course_lib.measure import estimate

    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = draw_ring_case(case_rng(task, UNIT))
    for world_size in WORLD_SIZES:
        results = _launch_learner(task, _all_reduce_worker, world_size, fn, *case)
        _check_cases(task, fn, world_size, results, "the all-reduced tensor")
        size = results[0]["size_bytes"]
        _check_bytes(
            task,
            fn,
            world_size,
            results,
            estimate.ring_allreduce_bytes_sent(size, world_size),
            "2(N-1)/N * S",
        )
    passed(
        task,
        "ring all-reduce matches dist.all_reduce on 2, 3 and 4 ranks (sizes that do not split "
        "evenly, float32 and float64) and each rank sends 2(N-1)/N * S bytes",
    )


def check_ring_all_gather(fn, task: int = 2) -> None:
    """Task: ring all-gather. ``fn(output, input)``: rank r's ``input`` (k elements) lands in
    chunk r of every rank's ``output`` (N * k elements).

    Graded on 2, 3 and 4 ranks, k drawn as in task 1 (:func:`draw_ring_case`), float32 and
    float64, bitwise against
    ``dist.all_gather_single`` (copies, no arithmetic), then bytes: each rank sends exactly
    estimate.allgather_bytes_sent(S_out, N) = (N-1)/N * S_out through point-to-point calls.
    """
    from course_lib.measure import estimate

    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = draw_ring_case(case_rng(task, UNIT))
    for world_size in WORLD_SIZES:
        results = _launch_learner(task, _all_gather_worker, world_size, fn, *case)
        _check_cases(task, fn, world_size, results, "the gathered tensor")
        size = results[0]["size_bytes"]
        _check_bytes(
            task,
            fn,
            world_size,
            results,
            estimate.allgather_bytes_sent(size, world_size),
            "(N-1)/N * S_out",
        )
    passed(
        task,
        "ring all-gather equals dist.all_gather_single bit for bit on 2, 3 and 4 ranks "
        "and each rank sends (N-1)/N * S_out bytes",
    )


def check_composite_bytes(predict, task: int = 3) -> None:
    """Task: predict the bytes one rank sends in an all-reduce done as ring reduce-scatter +
    ring all-gather. ``predict(size_bytes, world_size)`` returns a number of bytes.

    Graded against estimate (reduce_scatter_bytes_sent + allgather_bytes_sent) on several
    (S, N), and against the payloads CommMeter counts in the from-scratch rings' send calls on 2
    and 4 ranks.
    """
    from course_lib.measure import estimate
    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    rng = case_rng(task, UNIT)
    odd = rng.choice((3, 5, 6, 7))
    cases = [
        (4 * rng.randint(256, 4096), 2),
        (4 * rng.randint(256, 4096), 4),
        (odd * 4 * rng.randint(256, 4096), odd),  # N not a power of two
        (2 ** rng.randint(20, 26), rng.choice((8, 16, 32))),
        (2 ** rng.randint(28, 32), rng.choice((64, 128, 256))),
        (4 * rng.randint(1, 2000), 1),  # one rank sends nothing
    ]
    rng.shuffle(cases)
    for size, n in cases:
        expected = estimate.reduce_scatter_bytes_sent(size, n) + estimate.allgather_bytes_sent(
            size, n
        )
        got = run_learner(task, predict, size, n, forbid=_BYTES_REFERENCES)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            fail(task, f"{_name(predict)}({size}, {n}) must return a number of bytes, got {got!r}")
        if abs(got - expected) > 1e-9 * max(1.0, expected):
            fail(
                task,
                f"for S = {fmt_int(size)} B on N = {n} ranks: {got!r} B per rank is not what "
                "reduce-scatter + all-gather send",
            )
    for n, numel in ((2, 2 * rng.randint(256, 2048)), (4, 4 * rng.randint(256, 2048))):
        try:
            measured = launch(_composite_worker, n, numel, timeout=GRADE_TIMEOUT_S)
        except LaunchError as exc:  # not the learner's fault, but say so clearly
            fail(
                task,
                f"could not measure the reference run on {n} ranks: {str(exc).splitlines()[0]}",
            )
        predicted = run_learner(task, predict, numel * 4, n, forbid=_BYTES_REFERENCES)
        for rank, got in enumerate(measured):
            if got != predicted:
                fail(
                    task,
                    f"rank {rank} of {n}, S = {fmt_int(numel * 4)} B: your prediction "
                    f"{predicted!r} is not what CommMeter counted in the send calls",
                )
    passed(
        task,
        f"predictions match estimate on {len(cases)} cases and CommMeter on 2 and 4 ranks: "
        "reduce-scatter + all-gather sends 2(N-1)/N * S per rank, the ring all-reduce's bytes",
    )


# --------------------------------------------------------------------------------------------
# task 4: predict before you measure -- late ranks and an all-reduce
# --------------------------------------------------------------------------------------------
#: the late ranks of task 4 under the default seed: rank r computes STRAGGLER_SLEEPS[r] seconds
#: before the all-reduce (:func:`straggler_sleeps` draws them per seed)
STRAGGLER_SLEEPS = (0.0, 0.3, 0.1, 0.0)


def straggler_sleeps(task: int = 4) -> tuple[float, ...]:
    """Delays of 4 ranks drawn from the grading seed, 0.05 s apart at least: one rank on time,
    one straggler 0.2-0.4 s late, two in between, in a drawn order (never the lecture's)."""
    rng = case_rng(task, UNIT)
    while True:
        late = rng.choice((0.2, 0.25, 0.3, 0.35, 0.4))
        mids = rng.sample([x / 20 for x in range(0, round(late * 20))], 2)
        sleeps = [0.0, late, *mids]
        rng.shuffle(sleeps)
        if sleeps != [0.0, 0.2, 0.0, 0.0]:
            return tuple(sleeps)


STRAGGLER_TOL_S = 0.1  # scheduling on a shared 2-core machine: tens of ms of jitter
#: measuring is not predicting: the lecture's run of the same experiment is out of reach
_STRAGGLER_REFERENCES = ("course_lib.units.u08_collectives.run_patterns:straggler",)


def _measure_straggler(sleeps) -> list[float]:
    from course_lib.units.u08_collectives.run_patterns import straggler

    return straggler(list(sleeps))["in_all_reduce_s"].tolist()


def check_straggler_prediction(predict_wait_s, task: int = 4) -> None:
    """Task: ``predict_wait_s(sleeps)`` returns, for each rank, the seconds it spends inside one
    all-reduce when rank r first computes ``sleeps[r]`` seconds. The check predicts first, then
    runs it on 4 real ranks with STRAGGLER_SLEEPS and compares every rank within 0.1 s. A shared
    machine can delay one run: a miss is measured again (up to 3 runs)."""
    sleeps = straggler_sleeps(task)
    got = run_learner(task, predict_wait_s, list(sleeps), forbid=_STRAGGLER_REFERENCES)
    if (
        not isinstance(got, (list, tuple))
        or len(got) != len(sleeps)
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in got)
    ):
        fail(
            task,
            f"expected a list of {len(sleeps)} numbers of seconds (one per rank), got {got!r}",
        )
    misses = []
    for _ in range(3):
        measured = _measure_straggler(sleeps)
        worst = max(range(len(got)), key=lambda r: abs(got[r] - measured[r]))
        if abs(got[worst] - measured[worst]) <= STRAGGLER_TOL_S:
            passed(
                task,
                f"every rank's time inside the all-reduce is within {STRAGGLER_TOL_S:g} s of "
                "the prediction, on 4 ranks with delays the lecture did not run",
            )
            return
        misses.append(
            f"rank {worst}: predicted {got[worst]:.3f} s, measured {measured[worst]:.3f} s"
        )
    fail(
        task,
        f"sleeps {list(sleeps)}, in 3 runs: {'; '.join(misses)} (within "
        f"{STRAGGLER_TOL_S:g} s passes)",
    )


# --------------------------------------------------------------------------------------------
# task 5: find the bug -- all-gather where an all-reduce was needed
# --------------------------------------------------------------------------------------------
def buggy_average_gradients(grad):
    """The gradient averaging of task 5, with its one mistake (shown to the learner)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    parts = [torch.empty_like(grad) for _ in range(world)]
    dist.all_gather(parts, grad)
    return torch.cat(parts) / world


def _average_worker(
    rank: int,
    world_size: int,
    fn,
    shapes: tuple[tuple[int, ...], ...] = ((2,), (3, 5)),
    seed: int = 0,
) -> dict:
    import torch

    def gradient(r: int, shape: tuple[int, ...]) -> torch.Tensor:  # rank r's, made anywhere
        gen = torch.Generator().manual_seed(seed + 11 * r + len(shape))
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    cases = []
    for shape in shapes:
        want = torch.stack([gradient(r, shape) for r in range(world_size)]).mean(0)
        ok, err = _guarded(lambda g: cases.append(fn(g)), gradient(rank, shape))
        if not ok:
            return {"error": err}
        out = cases.pop()
        if not isinstance(out, torch.Tensor):
            why = f"returned {type(out).__name__}, not a tensor"
        elif tuple(out.shape) != shape:
            why = f"returned shape {tuple(out.shape)}, expected the gradient's {shape}"
        else:
            err_max = float((out.double() - want).abs().max())
            why = f"max abs difference from the mean {err_max:.3g}"
            cases.append({"shape": list(shape), "ok": err_max <= 1e-12, "why": why})
            continue
        return {"cases": [{"shape": list(shape), "ok": False, "why": why}]}
    return {"cases": cases}


def check_fixed_average(fn, task: int = 5) -> None:
    """Task: ``fn(grad)`` returns the mean of ``grad`` over all ranks, with grad's shape (what
    buggy_average_gradients should have returned). Run on 2 and 3 real ranks, on a vector and a
    matrix whose shapes and values are drawn from the grading seed, float64, against the mean
    computed from every rank's gradient (within 1e-12)."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    rng = case_rng(task, UNIT)
    shapes = ((rng.randint(2, 9),), (rng.randint(2, 6), rng.randint(2, 6)))
    seed = rng.randrange(2**31)
    for world_size in (2, 3):
        results = _launch_learner(task, _average_worker, world_size, fn, shapes, seed)
        for rank, res in enumerate(results):
            for case in res["cases"]:
                if not case["ok"]:
                    fail(
                        task,
                        f"rank {rank} of {world_size}, gradient of shape {tuple(case['shape'])}: "
                        f"{case['why']}",
                    )
    passed(task, "every rank holds the mean gradient, in the gradient's shape, on 2 and 3 ranks")


# --------------------------------------------------------------------------------------------
# task 6: scale it up -- bytes per GPU per step at 7B and 70B
# --------------------------------------------------------------------------------------------
SCALE_SCHEMES = ("all_reduce", "zero3", "parameter_server")
SCALE_CASES = tuple((n, w) for n in (7_000_000_000, 70_000_000_000) for w in (8, 64))
_SCALE_REFERENCES = _BYTES_REFERENCES + (
    "course_lib.measure.estimate.communication:reduce_broadcast_bytes_sent",
)


def _scale_expected(n_params: int, world_size: int, scheme: str) -> float:
    from course_lib.measure import estimate

    s = 2 * n_params  # bf16 gradients (and, for ZeRO-3, bf16 parameters): 2 bytes each
    if scheme == "all_reduce":
        return estimate.ring_allreduce_bytes_sent(s, world_size)
    if scheme == "zero3":  # reduce-scatter the gradients, all-gather the parameters twice
        return estimate.reduce_scatter_bytes_sent(
            s, world_size
        ) + 2 * estimate.allgather_bytes_sent(s, world_size)
    return estimate.reduce_broadcast_bytes_sent(s, world_size, root=True)


def check_scale_bytes(bytes_per_step, task: int = 6) -> None:
    """Task: ``bytes_per_step(n_params, world_size, scheme)``: the bytes the busiest GPU sends in
    one step, bf16, for scheme "all_reduce" (ring all-reduce of the gradients), "zero3"
    (ring reduce-scatter of the gradients + ring all-gather of the parameters before forward and
    again before backward) and "parameter_server" (rank 0 collects and sends back everything).
    Graded for 7B and 70B on 8 and 64 GPUs, and a size and GPU count drawn from the grading
    seed, against estimate (rtol 1e-9)."""
    rng = case_rng(task, UNIT)
    drawn = (rng.randint(1, 500) * 10**9, rng.choice((2, 4, 16, 32, 128, 256, 512)))
    for n_params, ws in (*SCALE_CASES, drawn):
        for scheme in SCALE_SCHEMES:
            expected = _scale_expected(n_params, ws, scheme)
            got = run_learner(task, bytes_per_step, n_params, ws, scheme, forbid=_SCALE_REFERENCES)
            if isinstance(got, bool) or not isinstance(got, (int, float)):
                fail(
                    task,
                    f"{n_params:.0e} params, {ws} GPUs, {scheme}: expected a number of bytes, got {got!r}",
                )
            if abs(got - expected) > 1e-9 * expected:
                fail(
                    task,
                    f"{n_params:.0e} params, {ws} GPUs, {scheme}: {got / 1e9:,.4g} GB per step is "
                    "not what the busiest GPU sends",
                )
    a = _scale_expected(70_000_000_000, 64, "all_reduce") / 1e9
    z = _scale_expected(70_000_000_000, 64, "zero3") / 1e9
    p = _scale_expected(70_000_000_000, 64, "parameter_server") / 1e9
    passed(
        task,
        f"bytes per step match estimate for 7B and 70B on 8 and 64 GPUs and an unseen size (70B on 64: "
        f"all-reduce {a:,.0f} GB, ZeRO-3 {z:,.0f} GB, parameter server {p:,.0f} GB)",
    )
