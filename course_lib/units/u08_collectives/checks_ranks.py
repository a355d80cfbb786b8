"""Unit 08's checks, what they share: the learner's collective run inside ranks, and the verdicts."""

from __future__ import annotations

import traceback

from course_lib.grading.core import fail, fmt_int, refuse

WORLD_SIZES = (2, 3, 4)


NUMELS = (1, 7, 1001)  # the shape of a case: sizes that do not split evenly over the ranks


def draw_ring_case(rng) -> tuple[tuple[int, ...], int, int]:
    """The sizes, data seed and byte-count chunk one ring check runs, drawn from the grading seed:
    one element (a chunk per rank is not there), a small and a large size that no world size of
    2, 3 or 4 divides (chunks of unequal size), then a seed for the data and the chunk (elements
    per rank) of the evenly split tensor whose bytes are counted."""

    def uneven(lo: int, hi: int) -> int:
        n = rng.randint(lo, hi)
        while n % 2 == 0 or n % 3 == 0:
            n += 1
        return n

    return (1, uneven(5, 63), uneven(700, 1500)), rng.randrange(2**31), rng.randint(64, 1024)


GRADE_TIMEOUT_S = 45.0  # a deadlocked ring (blocking send in both directions) ends here


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _p2p_only(calls: dict) -> dict:
    """The calls of a CommMeter that are not point-to-point (they should be none)."""
    return {op: n for op, n in calls.items() if "send" not in op and "recv" not in op}


#: the course's own answers, out of reach while the learner's code runs (inside each rank)
_RING_REFERENCES = (
    "course_lib.parallel.collectives:ring_all_reduce",
    "course_lib.parallel.collectives:ring_reduce_scatter",
    "course_lib.parallel.collectives:ring_all_gather",
    "course_lib.parallel.collectives:naive_ring_all_reduce",
)


_BYTES_REFERENCES = tuple(
    f"course_lib.measure.estimate.communication:{name}"
    for name in (
        "ring_allreduce_bytes_sent",
        "reduce_scatter_bytes_sent",
        "allgather_bytes_sent",
        "allreduce_bytes_sent",
        "collective_bytes_sent",
    )
)


USES_REFERENCE = "uses the course's own"


def _guarded(fn, *args):
    """Call the learner's fn inside a rank with the course's rings out of reach; return
    (ok, error) instead of raising. A call into a reference is reported as its own error."""
    from course_lib.grading.references import watch_references

    try:
        with watch_references(_RING_REFERENCES) as used:
            fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        if used:
            return False, (USES_REFERENCE, ", ".join(used), "")
        first = (str(exc).strip().splitlines() or [""])[0]
        return False, (type(exc).__name__, first, traceback.format_exc())
    if used:
        return False, (USES_REFERENCE, ", ".join(used), "")
    return True, None


def _all_reduce_worker(
    rank: int,
    world_size: int,
    fn,
    numels: tuple[int, ...] = NUMELS,
    seed: int = 0,
    chunk: int = 512,
) -> dict:
    import torch
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter

    cases = []
    for dtype in (torch.float32, torch.float64):
        for numel in numels:
            gen = torch.Generator().manual_seed(seed + 7919 * rank + numel)
            x = torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)  # (S,)
            ref, abs_sum = x.clone(), x.abs()
            dist.all_reduce(ref)
            dist.all_reduce(abs_sum)
            got = x.clone()
            ok, err = _guarded(fn, got)
            if not ok:
                return {"error": err}
            # any summation order is within (N-1) eps sum|x| of the exact sum (Higham 2002, 4.2)
            bound = 2 * (world_size - 1) * torch.finfo(dtype).eps * abs_sum
            bad = (got - ref).abs() > bound
            cases.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "numel": numel,
                    "ok": not bool(bad.any()) and got.dtype == dtype,
                    "max_err": float((got.double() - ref.double()).abs().max()),
                    "got_first": float(got.reshape(-1)[0]),
                    "ref_first": float(ref.reshape(-1)[0]),
                }
            )
    numel = world_size * chunk  # divisible: the byte formula is exact
    x = torch.randn(numel)
    with CommMeter(dispatch=False) as meter:
        ok, err = _guarded(fn, x)
    if not ok:
        return {"error": err}
    return {
        "cases": cases,
        "size_bytes": numel * 4,
        "bytes_sent": int(meter.model_bytes_sent),
        "other_calls": _p2p_only(dict(meter.calls)),
    }


def _all_gather_worker(
    rank: int,
    world_size: int,
    fn,
    numels: tuple[int, ...] = NUMELS,
    seed: int = 0,
    chunk: int = 512,
) -> dict:
    import torch

    from course_lib.measure.comm import CommMeter
    from course_lib.runtime.compat import all_gather_single as all_gather

    cases = []
    for dtype in (torch.float32, torch.float64):
        for k in numels:
            gen = torch.Generator().manual_seed(seed + 104729 * rank + k)
            mine = torch.randn(k, generator=gen, dtype=torch.float64).to(dtype)  # (k,)
            ref = torch.empty(world_size * k, dtype=dtype)
            all_gather(ref, mine)
            got = torch.full((world_size * k,), float("nan"), dtype=dtype)  # (N*k,)
            ok, err = _guarded(fn, got, mine.clone())
            if not ok:
                return {"error": err}
            cases.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "numel": k,
                    "ok": bool(torch.equal(got, ref)),
                }
            )
    k = chunk
    out, mine = torch.empty(world_size * k), torch.randn(k)
    with CommMeter(dispatch=False) as meter:
        ok, err = _guarded(fn, out, mine)
    if not ok:
        return {"error": err}
    return {
        "cases": cases,
        "size_bytes": out.numel() * 4,
        "bytes_sent": int(meter.model_bytes_sent),
        "other_calls": _p2p_only(dict(meter.calls)),
    }


def _composite_worker(rank: int, world_size: int, numel: int) -> int:
    import torch

    from course_lib.measure.comm import CommMeter
    from course_lib.parallel.collectives import ring_all_gather, ring_reduce_scatter

    x = torch.randn(numel)  # (S,)
    shard = torch.empty(numel // world_size)  # (S/N,)
    with CommMeter(dispatch=False) as meter:
        ring_reduce_scatter(shard, x)
        ring_all_gather(x, shard)
    return int(meter.model_bytes_sent)


# --------------------------------------------------------------------------------------------
# shared verdict logic
# --------------------------------------------------------------------------------------------
def _launch_learner(task: int, worker, world_size: int, fn, *args) -> list[dict]:
    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    try:
        results = launch(worker, world_size, fn, *args, timeout=GRADE_TIMEOUT_S)
    except LaunchError as exc:
        first = next(iter(exc.failures.values()), str(exc))
        hint = " (a deadlock? post isend/irecv before waiting)" if "deadline" in str(exc) else ""
        fail(
            task,
            f"{_name(fn)} on {world_size} ranks did not finish{hint}: "
            f"{(str(first).strip().splitlines() or [''])[0]}",
        )
    for rank, res in enumerate(results):
        if "error" in res:
            kind, message, _ = res["error"]
            if kind == USES_REFERENCE:
                refuse(task, [message])
            if kind == "NotImplementedError":
                fail(task, f"not implemented yet: {_name(fn)} raised NotImplementedError")
            hint = (
                " -- a deadlock? a blocking send waits for a receiver that is itself sending: "
                "post isend and irecv before waiting"
                if "timed out" in message.lower()
                else ""
            )
            fail(task, f"{_name(fn)} raised {kind} on rank {rank} of {world_size}: {message}{hint}")
    return results


def _check_cases(task: int, fn, world_size: int, results: list[dict], what: str) -> None:
    for rank, res in enumerate(results):
        for case in res["cases"]:
            if not case["ok"]:
                detail = (
                    f" (max abs error {case['max_err']:.3g}; element 0: got "
                    f"{case['got_first']:.6g}, expected {case['ref_first']:.6g})"
                    if "max_err" in case
                    else ""
                )
                fail(
                    task,
                    f"{what} differs from torch.distributed on rank {rank} of {world_size} "
                    f"for {case['numel']} elements of {case['dtype']}{detail}",
                )


def _check_bytes(
    task: int, fn, world_size: int, results: list[dict], expected, formula: str
) -> None:
    for rank, res in enumerate(results):
        if res["other_calls"]:
            fail(
                task,
                f"{_name(fn)} must use only point-to-point send/recv, but rank {rank} "
                f"called {sorted(res['other_calls'])}",
            )
        if res["bytes_sent"] != expected:
            hint = (
                " (no send/isend was counted: build it from dist.isend and dist.irecv)"
                if res["bytes_sent"] == 0
                else ""
            )
            fail(
                task,
                f"rank {rank} of {world_size} sent {fmt_int(res['bytes_sent'])} B for a "
                f"{fmt_int(res['size_bytes'])} B tensor; expected {formula} = "
                f"{fmt_int(int(expected))} B{hint}",
            )
