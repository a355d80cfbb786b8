"""Unit 08's checks, what they share: the learner's collective run inside ranks (the learner's
side hands back the tensors it left and the calls it made, :mod:`course_lib.grading.calls`), and
the judge's verdicts on them (expected values computed in one process from the seeded inputs)."""

from __future__ import annotations

import traceback
from typing import Any

from course_lib.grading.calls import CallLog, need_records, other_calls, sent_bytes
from course_lib.grading.core import fail, fmt_int, refuse

WORLD_SIZES = (2, 3, 4)


NUMELS = (1, 7, 1001)  # the shape of a case: sizes that do not split evenly over the ranks
DTYPES = ("float32", "float64")  # the dtypes every ring case runs in, in this order
#: per-rank salts of the seeded inputs (rank r's data differs from rank r+1's)
ALL_REDUCE_SALT, ALL_GATHER_SALT = 7919, 104729


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


def ring_input(seed: int, salt: int, rank: int, numel: int, dtype: str) -> Any:
    """Rank ``rank``'s input of ``numel`` elements, the same wherever it is made."""
    import torch

    gen = torch.Generator().manual_seed(seed + salt * rank + numel)
    return torch.randn(numel, generator=gen, dtype=torch.float64).to(getattr(torch, dtype))  # (S,)


GRADE_TIMEOUT_S = 45.0  # a deadlocked ring (blocking send in both directions) ends here


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def learner_name(data: Any) -> str:
    """The name of the learner's function the learner's side reported, for ✗ lines only."""
    name = data.get("name") if isinstance(data, dict) else None
    return name[:100] if isinstance(name, str) and name else "your function"


#: the course's own answers, out of reach while the learner's code runs (inside each rank)
_RING_REFERENCES = (
    "course_lib.parallel.collectives.ring:ring_all_reduce",
    "course_lib.parallel.collectives.ring:ring_reduce_scatter",
    "course_lib.parallel.collectives.ring:ring_all_gather",
    "course_lib.parallel.collectives.ring:naive_ring_all_reduce",
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


# --------------------------------------------------------------------------------------------
# the learner's side: what runs inside the ranks
# --------------------------------------------------------------------------------------------
def _ring_worker(
    rank: int,
    world_size: int,
    fn,
    gather: bool,
    numels: tuple[int, ...] = NUMELS,
    seed: int = 0,
    chunk: int = 512,
) -> dict:
    """What ``fn`` left, one tensor per (dtype, numel), and the calls it made on an evenly split
    tensor. All-reduce (``gather`` False): ``fn(x)`` sums x in place, then on ``world_size *
    chunk`` float32. All-gather: ``fn(output, input)`` fills the N * k output from this rank's k
    elements, then gathers ``chunk`` float32 elements per rank."""
    import torch

    def args(numel: int, dtype: str) -> tuple:
        if not gather:
            return (ring_input(seed, ALL_REDUCE_SALT, rank, numel, dtype),)  # (S,)
        mine = ring_input(seed, ALL_GATHER_SALT, rank, numel, dtype)  # (k,)
        return torch.full((world_size * numel,), float("nan"), dtype=mine.dtype), mine  # (N*k,)

    results = []
    for dtype in DTYPES:
        for numel in numels:
            got = args(numel, dtype)
            ok, err = _guarded(fn, *got)
            if not ok:
                return {"error": err}
            results.append(got[0])
    # divisible sizes: the byte formula is exact
    even = (
        (torch.empty(world_size * chunk), torch.randn(chunk))
        if gather
        else (torch.randn(world_size * chunk),)
    )
    with CallLog() as log:
        ok, err = _guarded(fn, *even)
    if not ok:
        return {"error": err}
    return {"results": results, "calls": log.records}


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


# --------------------------------------------------------------------------------------------
# the judge's side: a reference the ranks ran, and the verdicts
# --------------------------------------------------------------------------------------------
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


def expected_all_reduce(seed: int, world_size: int, numel: int, dtype: str) -> tuple[Any, Any]:
    """What every rank holds after an all-reduce of the seeded inputs, and the bound on the
    rounding of any summation order: 2(N-1) eps sum|x| (Higham 2002, 4.2; either result is
    within (N-1) eps sum|x| of the exact sum)."""
    import torch

    xs = torch.stack(
        [ring_input(seed, ALL_REDUCE_SALT, r, numel, dtype) for r in range(world_size)]
    ).double()  # (N, S)
    eps = torch.finfo(getattr(torch, dtype)).eps
    return xs.sum(0).to(getattr(torch, dtype)), 2 * (world_size - 1) * eps * xs.abs().sum(0)


def expected_all_gather(seed: int, world_size: int, k: int, dtype: str) -> Any:
    """Every rank's output of an all-gather of the seeded inputs: rank r's k elements in chunk r."""
    import torch

    return torch.cat([ring_input(seed, ALL_GATHER_SALT, r, k, dtype) for r in range(world_size)])


def _case_tensor(task: int, res: dict, i: int, where: str, numel: int, dtype: str) -> Any:
    """The i-th tensor a rank handed back, checked to be a tensor of ``numel`` elements."""
    import torch

    results = res.get("results")
    got = results[i] if isinstance(results, list) and i < len(results) else None
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (numel,):
        fail(task, f"{where}: the run handed back no tensor of {numel} elements of {dtype}")
    return got


def check_ring_cases(
    task: int, world_size: int, results: list[dict], case: tuple, what: str, gather: bool
) -> None:
    """Every rank's tensors against the expected ones: within the summation bound (all-reduce)
    or bit for bit (all-gather, copies only)."""
    import torch

    numels, seed, _ = case
    cases = [(dtype, numel) for dtype in DTYPES for numel in numels]
    if gather:
        wanted = [(expected_all_gather(seed, world_size, n, d), None) for d, n in cases]
    else:
        wanted = [expected_all_reduce(seed, world_size, n, d) for d, n in cases]
    for rank, res in enumerate(results):
        for i, ((dtype, numel), (ref, bound)) in enumerate(zip(cases, wanted)):
            where = f"rank {rank} of {world_size}"
            got = _case_tensor(task, res, i, where, ref.numel(), dtype)
            detail = ""
            if bound is None:  # copies: bit for bit
                ok = got.dtype == ref.dtype and torch.equal(got, ref)
            else:
                diff = (got.double() - ref.double()).abs()  # (S,)
                ok = not bool((diff > bound).any()) and got.dtype == ref.dtype
                detail = (
                    f" (max abs error {float(diff.max()):.3g}; element 0: got "
                    f"{float(got[0]):.6g}, expected {float(ref[0]):.6g})"
                )
            if not ok:
                fail(
                    task,
                    f"{what} differs from torch.distributed on rank {rank} of {world_size} "
                    f"for {numel} elements of {dtype}{detail}",
                )


def check_ring_bytes(
    task: int, name: str, world_size: int, results: list[dict], size: int, expected, formula: str
) -> None:
    """Every rank made point-to-point calls only and sent ``expected`` bytes for a ``size``-byte
    tensor."""
    for rank, res in enumerate(results):
        records = need_records(task, res.get("calls"), f"rank {rank} of {world_size}")
        other = other_calls(records)
        if other:
            fail(
                task,
                f"{name} must use only point-to-point send/recv, but rank {rank} "
                f"called {sorted(other)}",
            )
        sent = sent_bytes(records)
        if sent != expected:
            hint = (
                " (no send/isend was counted: build it from dist.isend and dist.irecv)"
                if sent == 0
                else ""
            )
            fail(
                task,
                f"rank {rank} of {world_size} sent {fmt_int(sent)} B for a "
                f"{fmt_int(size)} B tensor; expected {formula} = "
                f"{fmt_int(int(expected))} B{hint}",
            )
