"""Measured runs of unit 08 (collectives): what the ranks hold, how many bytes move, how long it takes.

Used by notebooks/08_collectives.ipynb, its widget and its exercise checks. Every function here
launches real processes with :func:`course_lib.launch` (gloo on CPU) and returns plain data:
tensors the ranks returned, or tidy pandas DataFrames. Predictions come from
:mod:`course_lib.measure.estimate`; bytes from :class:`course_lib.measure.comm.CommMeter`, which
counts the payload handed to every call and measures what the process wrote to its sockets (the
wire). The wire bytes of every collective at a size where headers do not matter are measured in
:mod:`course_lib.units.u08_collectives.wire_bytes`.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

import pandas as pd
import torch
import torch.distributed as dist

from course_lib.measure import estimate
from course_lib.parallel import collectives as C

#: the eight primitives of torch.distributed shown in the notebook, in teaching order
PRIMITIVES = ("broadcast", "scatter", "gather", "reduce", "all_reduce", "all_gather",
              "reduce_scatter", "all_to_all")
#: the from-scratch all-reduce algorithms of course_lib.parallel.collectives, by name
ALGORITHMS = tuple(C.ALL_REDUCE_ALGORITHMS)
#: what the byte experiments can run: the from-scratch all-reduces plus the composite
#: reduce-scatter + all-gather (both rings from scratch)
BYTE_EXPERIMENTS = ALGORITHMS + ("reduce_scatter+all_gather",)
#: what the timing experiments can run: from-scratch algorithms and gloo's own all_reduce
TIMED = ALGORITHMS + ("gloo",)
#: everything the widget can run
COLLECTIVE_CHOICES = PRIMITIVES + tuple(f"{name} (from scratch)" for name in ALGORITHMS)

WORKED_EXAMPLE_GRADS = (0.20, 0.10, -0.05, 0.15)


def _choice(name: str, value, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; valid choices: {', '.join(choices)}")
    return value


def _world_size(world_size, *, minimum: int = 1, maximum: int = 16) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if not minimum <= world_size <= maximum:
        raise ValueError(f"world_size must be in {minimum}..{maximum}, got world_size={world_size}")
    return world_size


def _launch(fn, world_size: int, *args, timeout: float = 60.0, **kwargs):
    from course_lib.runtime.launch import launch  # imported here: ranks never need it

    return launch(fn, world_size, *args, timeout=timeout, **kwargs)


def _meter():
    from course_lib.measure.comm import CommMeter

    # direct torch.distributed calls are all we make; dispatch=True would also import
    # torch.distributed.tensor in every rank (seconds of start-up) to see DTensor collectives
    return CommMeter(dispatch=False)


# --------------------------------------------------------------------------------------------
# 1. the eight primitives: before / after on every rank
# --------------------------------------------------------------------------------------------
def piece_value(rank: int, piece: int) -> float:
    """The value rank ``rank`` starts with in slot ``piece``: 10 * rank + piece.

    Tens digit = who owns it, units digit = which piece, so pictures and sums read at a glance
    (all-reduce of piece 1 on 4 ranks: 1 + 11 + 21 + 31 = 64).
    """
    return float(10 * rank + piece)


def _row(rank: int, world_size: int, k: int = 1) -> torch.Tensor:
    values = torch.tensor([piece_value(rank, c) for c in range(world_size)])  # (N,)
    return values.repeat_interleave(k)  # (N*k,) slot c = elements c*k .. c*k+k-1


def _only(slot: int, value: torch.Tensor, world_size: int, k: int = 1) -> torch.Tensor:
    """An N-slot row (k elements per slot) that is empty (NaN) except at ``slot``."""
    row = _empty(world_size, k)
    row[slot * k:(slot + 1) * k] = value.reshape(-1)
    return row


def _empty(world_size: int, k: int = 1) -> torch.Tensor:
    return torch.full((world_size * k,), float("nan"))


def _run_primitive(name: str, rank: int, world_size: int, root: int,
                   k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one torch.distributed primitive; return (input buffer, output buffer) as N-slot rows.

    An N-slot row shows what the rank holds in the buffer it passes in (before) and the buffer the
    result lands in (after); NaN marks a slot the rank has no data for. ``k``: float32 elements
    per slot (1 for the pictures; more to move enough bytes for the wire to be measured).
    """
    n, me = world_size, rank
    is_root = me == root
    if name == "broadcast":
        buf = _row(me, n, k) if is_root else _empty(n, k)  # non-roots pass an empty (NaN) buffer
        before = buf.clone()
        dist.broadcast(buf, src=root)
        return before, buf
    if name == "scatter":
        full = _row(me, n, k) if is_root else _empty(n, k)
        out = torch.empty(k)
        dist.scatter(out, scatter_list=list(full.chunk(n)) if is_root else None, src=root)
        return full, _only(me, out, n, k)
    if name == "gather":
        mine = torch.full((k,), piece_value(me, me))
        out = [torch.empty(k) for _ in range(n)] if is_root else None
        dist.gather(mine, gather_list=out, dst=root)
        return _only(me, mine, n, k), (torch.cat(out) if is_root else _empty(n, k))
    if name == "reduce":
        buf = _row(me, n, k)
        before = buf.clone()
        dist.reduce(buf, dst=root)
        # only the destination's buffer is defined after a reduce; the others are scratch
        return before, (buf if is_root else _empty(n, k))
    if name == "all_reduce":
        buf = _row(me, n, k)
        before = buf.clone()
        dist.all_reduce(buf)
        return before, buf
    if name == "all_gather":
        mine = torch.full((k,), piece_value(me, me))
        out = [torch.empty(k) for _ in range(n)]
        dist.all_gather(out, mine)  # the list form: CommMeter counts it
        return _only(me, mine, n, k), torch.cat(out)
    if name == "reduce_scatter":
        buf = _row(me, n, k)
        out = torch.empty(k)
        dist.reduce_scatter(out, list(buf.clone().chunk(n)))  # piece r of the sum lands on rank r
        return buf, _only(me, out, n, k)
    if name == "all_to_all":
        buf = _row(me, n, k)
        out = torch.empty(n * k)
        dist.all_to_all_single(out, buf)  # slot c of rank r goes to rank c, slot r
        return buf, out
    algorithm = name.removesuffix(" (from scratch)")
    buf = _row(me, n, k)
    before = buf.clone()
    C.ALL_REDUCE_ALGORITHMS[algorithm](buf)
    return before, buf


def _primitives_worker(rank: int, world_size: int, names: Sequence[str], root: int) -> dict:
    results = {}
    for name in names:
        dist.barrier()  # no rank starts the next primitive while another is still in the last one
        with _meter() as meter:
            before, after = _run_primitive(name, rank, world_size, root)
        results[name] = {"before": before, "after": after, "calls": dict(meter.calls),
                         "wire_bytes_sent": meter.wire_bytes_sent,
                         "model_bytes_sent": meter.model_bytes_sent, "wire_source": meter.wire_source}
    return results


def run_primitives(names: Sequence[str] = PRIMITIVES, world_size: int = 4, *, root: int = 0,
                   timeout: float = 60.0) -> dict[str, dict]:
    """Run each named collective once on ``world_size`` real ranks (one launch for all).

    Returns ``{name: {"before": [row per rank], "after": [row per rank], "calls": [dict per
    rank], "wire_bytes_sent": [...], "model_bytes_sent": [...], "wire_source": [...]}}`` where a
    row is an N-slot float tensor (NaN = the rank holds nothing there); ``wire_bytes_sent`` is
    measured by CommMeter (what the rank wrote to its sockets, None where the OS cannot see it),
    ``model_bytes_sent`` is estimate's figure as CommMeter applies it. With one float per slot the
    payloads are a few bytes, so the wire is mostly message headers here.
    ``names``: any of :data:`COLLECTIVE_CHOICES`.
    """
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        _choice("names[i]", name, COLLECTIVE_CHOICES)
    world_size = _world_size(world_size, maximum=10)
    if "recursive_doubling (from scratch)" in names and world_size & (world_size - 1):
        raise ValueError(f"recursive doubling needs a power-of-two world size, got "
                         f"world_size={world_size}; valid choices: 1, 2, 4, 8")
    if not 0 <= root < world_size:
        raise ValueError(f"root must be a rank in 0..{world_size - 1}, got root={root}")
    per_rank = _launch(_primitives_worker, world_size, names, root, timeout=timeout)
    return {name: {key: [per_rank[r][name][key] for r in range(world_size)]
                   for key in ("before", "after", "calls", "wire_bytes_sent", "model_bytes_sent",
                               "wire_source")}
            for name in names}


def payload_bytes(name: str, world_size: int, k: int = 1) -> int:
    """The S of a run_primitives run: N float32 slots of ``k`` elements, 4 * N * k bytes (the
    input row, or for all_gather and gather the output row, as estimate's conventions count it)."""
    _choice("name", name, COLLECTIVE_CHOICES)
    return 4 * world_size * k


def estimated_bytes_sent(name: str, world_size: int, rank: int, *, root: int = 0,
                         k: int = 1) -> int | float | None:
    """What estimate predicts ``rank`` sends in a run_primitives run of ``name`` with root
    ``root`` and ``k`` elements per slot (None when estimate has no formula for it). scatter and
    gather send different amounts at the root and elsewhere
    (``estimate.collective_bytes_sent(..., root=...)``); the from-scratch reduce + broadcast
    uses rank 0 as its root whatever ``root`` is."""
    size = payload_bytes(name, world_size, k)
    if name.endswith(" (from scratch)"):
        return predicted_bytes_sent(name.removesuffix(" (from scratch)"), size, world_size, rank)
    if name in estimate.COLLECTIVES:
        return estimate.collective_bytes_sent(name, size, world_size, root=rank == root)
    return None


def bytes_table(name: str, result: dict, world_size: int, *, root: int = 0) -> pd.DataFrame:
    """Per-rank bytes of one run_primitives result (run with ``root``): predicted by estimate,
    measured on the wire (CommMeter), and the residual (wire - predicted; None if unmeasured)."""
    rows = []
    for rank in range(world_size):
        predicted = estimated_bytes_sent(name, world_size, rank, root=root)
        wire = result["wire_bytes_sent"][rank]
        rows.append({"rank": rank, "calls": ", ".join(f"{op} x{k}" for op, k in
                                                    sorted(result["calls"][rank].items())),
                     "sent, predicted (estimate)": predicted,
                     "sent, measured (wire)": wire,
                     "residual (wire - predicted)": None if wire is None or predicted is None
                     else wire - predicted})
    return pd.DataFrame(rows).set_index("rank")


def expected_after(name: str, world_size: int, *, root: int = 0) -> list[torch.Tensor]:
    """What every rank should hold after ``name``, computed in one process from the definition.

    Used by tests and by the notebook's check cell (the ranks' real output must equal this).
    """
    _choice("name", name, COLLECTIVE_CHOICES)
    n = world_size
    rows = torch.stack([_row(r, n) for r in range(n)])  # (rank, slot)
    total = rows.sum(0)  # (slot,)
    if name == "broadcast":
        return [rows[root].clone() for _ in range(n)]
    if name == "scatter":
        return [_only(r, rows[root, r], n) for r in range(n)]
    if name == "gather":
        return [rows.diagonal().clone() if r == root else _empty(n) for r in range(n)]
    if name == "reduce":
        return [total.clone() if r == root else _empty(n) for r in range(n)]
    if name in ("all_reduce",) or name.endswith("(from scratch)"):
        return [total.clone() for _ in range(n)]
    if name == "all_gather":
        return [rows.diagonal().clone() for _ in range(n)]
    if name == "reduce_scatter":
        return [_only(r, total[r], n) for r in range(n)]
    return [rows[:, r].clone() for r in range(n)]  # all_to_all: rank r gets column r


# --------------------------------------------------------------------------------------------
# 2. the worked example and the two decompositions of all-reduce
# --------------------------------------------------------------------------------------------
def _worked_example_worker(rank: int, world_size: int, grads: Sequence[float], lr: float,
                           weight: float) -> dict:
    n = world_size
    g = torch.tensor([grads[rank]], dtype=torch.float64)  # (1,) this worker's gradient

    via_all_reduce = g.clone()
    dist.all_reduce(via_all_reduce)

    via_reduce_broadcast = g.clone()
    dist.reduce(via_reduce_broadcast, dst=0)
    dist.broadcast(via_reduce_broadcast, src=0)

    # reduce-scatter needs a size divisible by N: pad with zeros, as FSDP pads its flat parameters
    padded = torch.zeros(n, dtype=torch.float64)  # (N,)
    padded[0] = g
    shard = torch.empty(1, dtype=torch.float64)
    full = torch.empty(n, dtype=torch.float64)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(shard, padded)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(full, shard)
    via_rs_ag = full[:1]

    via_ring = C.ring_all_reduce(g.clone())
    means = {k: float(v.item()) / n for k, v in {
        "all_reduce": via_all_reduce, "reduce+broadcast": via_reduce_broadcast,
        "reduce_scatter+all_gather": via_rs_ag, "ring (from scratch)": via_ring}.items()}
    mean = means["all_reduce"]
    return {"rank": rank, "grad": float(g.item()), **{f"mean via {k}": v for k, v in means.items()},
            "sgd step": -lr * mean, "new weight": weight - lr * mean}


def worked_example(grads: Sequence[float] = WORKED_EXAMPLE_GRADS, *, lr: float = 1e-3,
                   weight: float = 1.0, timeout: float = 60.0) -> pd.DataFrame:
    """Data-parallel SGD on one weight: each rank has one gradient; average them four ways.

    One row per rank: its gradient, the mean computed by all_reduce, by reduce + broadcast, by
    reduce-scatter + all-gather and by our ring (each divided by N), the SGD step -lr * mean and
    the updated weight. float64, so the four means agree to the last bit or nearly.
    """
    grads = [float(g) for g in grads]
    world_size = _world_size(len(grads), minimum=1, maximum=16)
    rows = _launch(_worked_example_worker, world_size, grads, lr, weight, timeout=timeout)
    return pd.DataFrame(rows).set_index("rank")


def _decomposition_worker(rank: int, world_size: int, numel: int, seed: int) -> dict:
    n = world_size
    gen = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(numel, generator=gen)  # (S,) this rank's "gradient"
    reference = x.clone()
    dist.all_reduce(reference)

    rb = x.clone()
    dist.reduce(rb, dst=0)
    dist.broadcast(rb, src=0)

    padded_numel = math.ceil(numel / n) * n
    padded = torch.zeros(padded_numel)  # (N*k,) zero padding to a multiple of N
    padded[:numel] = x
    shard = torch.empty(padded_numel // n)  # (k,)
    full = torch.empty(padded_numel)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(shard, padded)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(full, shard)
    rs_ag = full[:numel]

    shard2 = torch.empty(padded_numel // n)
    full2 = torch.empty(padded_numel)
    C.ring_reduce_scatter(shard2, padded)
    C.ring_all_gather(full2, shard2)
    ring_rs_ag = full2[:numel]

    ring = C.ring_all_reduce(x.clone())
    abs_sum = x.abs()
    dist.all_reduce(abs_sum)
    bound = float(((n - 1) * torch.finfo(x.dtype).eps * abs_sum).max())
    # (method, its result, torch.distributed's result for the same input, the reference's name)
    checks = [("reduce+broadcast", rb, reference, "all_reduce"),
              ("reduce_scatter+all_gather", rs_ag, reference, "all_reduce"),
              ("ring reduce_scatter+all_gather (from scratch)", ring_rs_ag, reference, "all_reduce"),
              ("ring all_reduce (from scratch)", ring, reference, "all_reduce"),
              ("naive ring all_reduce (from scratch)", C.naive_ring_all_reduce(x.clone()), reference,
               "all_reduce"),
              ("reduce+broadcast (from scratch)", C.reduce_broadcast_all_reduce(x.clone()), reference,
               "all_reduce")]
    if n & (n - 1) == 0:  # recursive doubling needs a power-of-two world size
        checks.append(("recursive doubling (from scratch)", C.recursive_doubling_all_reduce(x.clone()),
                       reference, "all_reduce"))
    shard3 = torch.empty(padded_numel // n)
    C.ring_reduce_scatter(shard3, padded)
    checks.append(("ring reduce_scatter (from scratch)", shard3, shard, "reduce_scatter_tensor"))
    full3 = torch.empty(padded_numel)
    C.ring_all_gather(full3, shard)  # the same input as torch's all-gather above
    checks.append(("ring all_gather (from scratch)", full3, full, "all_gather_into_tensor"))
    out = []
    for method, got, want, ref_name in checks:
        out.append({"rank": rank, "method": method, "compared with": f"dist.{ref_name}",
                    "max abs difference": float((got - want).abs().max()),
                    "bitwise equal": bool(torch.equal(got, want)),
                    "summation bound": bound})
    return out


def all_reduce_decompositions(world_size: int = 4, numel: int = 1001, *, seed: int = 0,
                              timeout: float = 60.0) -> pd.DataFrame:
    """all_reduce = reduce + broadcast = reduce_scatter + all_gather, checked on random data, and
    every from-scratch collective of course_lib.parallel.collectives against torch.distributed.

    One row per (rank, method): the largest difference from the torch.distributed collective named
    in ``compared with`` (``dist.all_reduce`` for every all-reduce) and whether it is bitwise equal. ``summation bound`` is (N-1) eps max_i sum_r |x_r,i|, how far two valid
    summation orders may drift apart in float32 (Higham 2002, section 4.2).
    """
    world_size = _world_size(world_size, minimum=1)
    per_rank = _launch(_decomposition_worker, world_size, int(numel), int(seed), timeout=timeout)
    return pd.DataFrame([row for rows in per_rank for row in rows])


# --------------------------------------------------------------------------------------------
# 3. bytes of the from-scratch algorithms: predicted by estimate, counted and measured by CommMeter
# --------------------------------------------------------------------------------------------
def predicted_bytes_sent(algorithm: str, size_bytes: int, world_size: int, rank: int = 0) -> int | float:
    """Bytes ``rank`` sends in ``algorithm`` on a tensor of ``size_bytes`` (from estimate)."""
    _choice("algorithm", algorithm, BYTE_EXPERIMENTS)
    if algorithm in estimate.ALLREDUCE_BYTES_ALGORITHMS:
        # reduce_broadcast_all_reduce's root is rank 0 (its default)
        return estimate.allreduce_bytes_sent(size_bytes, world_size, algorithm=algorithm,
                                             root=rank == 0)
    return (estimate.reduce_scatter_bytes_sent(size_bytes, world_size)
            + estimate.allgather_bytes_sent(size_bytes, world_size))


def _bytes_worker(rank: int, world_size: int, algorithms: Sequence[str], numel: int,
                  dtype: torch.dtype) -> list[dict]:
    rows = []
    for algorithm in algorithms:
        x = torch.randn(numel, dtype=dtype)  # (S,)
        dist.barrier()
        with _meter() as meter:
            if algorithm == "reduce_scatter+all_gather":
                shard = torch.empty(numel // world_size, dtype=dtype)
                C.ring_reduce_scatter(shard, x)
                C.ring_all_gather(x, shard)
            else:
                C.ALL_REDUCE_ALGORITHMS[algorithm](x)
        rows.append({"algorithm": algorithm, "rank": rank, "size_bytes": x.numel() * x.element_size(),
                     "payload_sent": int(meter.model_bytes_sent),
                     "payload_received": int(meter.model_bytes_received),
                     "wire_bytes_sent": meter.wire_bytes_sent, "p2p_calls": sum(meter.calls.values())})
    return rows


def measure_bytes(world_size: int = 4, numel: int = 4 * 1024, *, algorithms: Sequence[str] = BYTE_EXPERIMENTS,
                  dtype: torch.dtype = torch.float32, timeout: float = 60.0) -> pd.DataFrame:
    """Bytes each rank sends in each from-scratch algorithm: predicted, counted and measured.

    One row per (algorithm, rank): ``size_bytes`` (S); ``payload_sent`` / ``payload_received``,
    the tensors the algorithm handed to isend / irecv (counted by CommMeter from the calls);
    ``wire_bytes_sent``, what the rank wrote to its sockets (measured by CommMeter through the
    OS; None where it cannot see them); ``predicted_bytes_sent`` (estimate); ``residual`` (wire -
    predicted: gloo's message headers) and ``p2p_calls``. ``numel`` must be a multiple of
    ``world_size`` so that the ring's chunks are even and the formulas are exact (uneven sizes
    are covered by ``collectives.ring_all_reduce_elements_sent``).
    """
    world_size = _world_size(world_size, minimum=1)
    algorithms = [_choice("algorithms[i]", a, BYTE_EXPERIMENTS) for a in algorithms]
    if numel % world_size:
        raise ValueError(f"numel must be a multiple of world_size so the formulas are exact: "
                         f"got numel={numel}, world_size={world_size}")
    if "recursive_doubling" in algorithms and world_size & (world_size - 1):
        raise ValueError(f"recursive_doubling needs a power-of-two world size, got "
                         f"world_size={world_size}; valid choices: 1, 2, 4, 8, 16")
    per_rank = _launch(_bytes_worker, world_size, algorithms, int(numel), dtype, timeout=timeout)
    df = pd.DataFrame([row for rows in per_rank for row in rows])
    df["predicted_bytes_sent"] = [predicted_bytes_sent(a, s, world_size, r)
                                  for a, s, r in zip(df.algorithm, df.size_bytes, df["rank"])]
    df["residual"] = [None if w is None else w - p
                      for w, p in zip(df.wire_bytes_sent, df.predicted_bytes_sent)]
    df = df[["algorithm", "rank", "size_bytes", "predicted_bytes_sent", "payload_sent", "wire_bytes_sent",
             "residual", "payload_received", "p2p_calls"]]
    return df.sort_values(["algorithm", "rank"], key=lambda c: c.map(
        {a: i for i, a in enumerate(algorithms)}) if c.name == "algorithm" else c).reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# 4. time: ring vs recursive doubling vs gloo, and the alpha-beta fit
# --------------------------------------------------------------------------------------------
def _timing_worker(rank: int, world_size: int, numel: int, algorithms: Sequence[str],
                   repeats: int, warmup: int) -> dict:
    x = torch.randn(numel)  # (S,) float32
    times: dict[str, list[float]] = {}
    for algorithm in algorithms:
        fn = dist.all_reduce if algorithm == "gloo" else C.ALL_REDUCE_ALGORITHMS[algorithm]
        for _ in range(warmup):  # first calls pay for connection set-up and allocations
            fn(x)
        samples = []
        for _ in range(repeats):
            x.fill_(1.0)  # keep values finite however many times we sum them
            dist.barrier()  # everyone starts together: we time the collective, not the stragglers
            t0 = time.perf_counter()
            fn(x)
            samples.append(time.perf_counter() - t0)
        times[algorithm] = samples
    return times


def time_all_reduce(sizes_bytes: Sequence[int], *, world_size: int = 4,
                    algorithms: Sequence[str] = ("ring", "recursive_doubling", "gloo"),
                    repeats: int = 5, warmup: int = 1, progress: bool = True,
                    timeout: float = 300.0) -> pd.DataFrame:
    """Time all-reduce of float32 tensors of each size on ``world_size`` ranks (one launch per size).

    A sample is the slowest rank's time for one call (the collective is done when its last rank
    is), after a barrier; we report the median and the quartiles over ``repeats`` samples, in
    seconds. On a shared CPU machine absolute times are noisy: compare algorithms within a run.
    Columns: algorithm, size_bytes, median_s, p25_s, p75_s, repeats.
    """
    world_size = _world_size(world_size, minimum=2)
    algorithms = [_choice("algorithms[i]", a, TIMED) for a in algorithms]
    if "recursive_doubling" in algorithms and world_size & (world_size - 1):
        raise ValueError(f"recursive_doubling needs a power-of-two world size, got "
                         f"world_size={world_size}; valid choices: 2, 4, 8, 16")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    sizes = list(sizes_bytes)
    for s in sizes:
        if s < 4 or s % 4:
            raise ValueError(f"sizes_bytes must be positive multiples of 4 (float32), got {s}")
    if progress:
        from tqdm.auto import tqdm

        sizes_iter = tqdm(sizes, desc=f"all-reduce sweep on {world_size} ranks", unit="size")
    else:
        sizes_iter = sizes
    rows = []
    for size in sizes_iter:
        per_rank = _launch(_timing_worker, world_size, size // 4, algorithms, repeats, warmup,
                           timeout=timeout)
        for algorithm in algorithms:
            slowest = [max(per_rank[r][algorithm][i] for r in range(world_size)) for i in range(repeats)]
            q = statistics.quantiles(slowest, n=4) if repeats > 1 else [slowest[0]] * 3
            rows.append({"algorithm": algorithm, "size_bytes": size, "median_s": statistics.median(slowest),
                         "p25_s": q[0], "p75_s": q[2], "repeats": repeats})
    return pd.DataFrame(rows)


def _steps_and_message(algorithm: str, size_bytes: float, world_size: int) -> tuple[int, float]:
    """(number of sequential message steps, bytes per message) of an all-reduce algorithm."""
    if algorithm == "ring":
        return 2 * (world_size - 1), size_bytes / world_size
    if algorithm == "recursive_doubling":
        return math.ceil(math.log2(world_size)), size_bytes
    raise ValueError(f"algorithm={algorithm!r} has no alpha-beta fit here; valid choices: ring, "
                     "recursive_doubling")


def fit_alpha_beta(times: pd.DataFrame, world_size: int,
                   algorithms: Sequence[str] = ("ring", "recursive_doubling")) -> tuple[float, float]:
    """Fit one (alpha, beta) to the all-reduce timings of the given from-scratch algorithms.

    Both algorithms are sequences of message steps (ring: 2(N-1) steps of S/N bytes; recursive
    doubling: log2 N steps of S bytes), so every measurement gives a point (bytes per message,
    time per step) on the single-message line T = alpha + beta * m, which
    ``estimate.fit_alpha_beta`` fits by least squares of the relative error (so the small
    messages, which measure alpha, count as much as the large ones, which measure beta).
    Returns (alpha in s, beta in s/byte).
    """
    xs, ys = [], []
    for algorithm in algorithms:
        sub = times[times.algorithm == algorithm]
        for size, t in zip(sub.size_bytes, sub.median_s):
            steps, message = _steps_and_message(algorithm, size, world_size)
            xs.append(message)
            ys.append(t / steps)
    return estimate.fit_alpha_beta(xs, ys, relative=True)


def compare_with_model(times: pd.DataFrame, world_size: int, alpha: float, beta: float,
                       algorithms: Sequence[str] = ("ring", "recursive_doubling")) -> pd.DataFrame:
    """Measured median beside ``estimate.allreduce_time`` with the fitted alpha and beta.

    Columns: algorithm, size_bytes, measured_s, predicted_s, residual_s (measured - predicted),
    ratio (measured / predicted).
    """
    sub = times[times.algorithm.isin(list(algorithms))]
    out = pd.DataFrame({
        "algorithm": sub.algorithm.values,
        "size_bytes": sub.size_bytes.values,
        "measured_s": sub.median_s.values,
        "predicted_s": [estimate.allreduce_time(s, world_size, alpha=max(alpha, 0.0),
                                                beta=max(beta, 1e-15), algorithm=a)
                        for a, s in zip(sub.algorithm, sub.size_bytes)],
    })
    out["residual_s"] = out.measured_s - out.predicted_s
    out["ratio"] = out.measured_s / out.predicted_s
    return out


def model_crossover_bytes(world_size: int, alpha: float, beta: float) -> float:
    """Message size where the alpha-beta model says ring and recursive doubling take equal time.

    ring: 2(N-1) alpha + 2(N-1)/N S beta;  recursive doubling: log2 N (alpha + S beta).
    Found by bisection on ``estimate.allreduce_time`` (so it always agrees with the plotted
    curves); ``inf`` when the ring never wins in the model.
    """
    a, b = max(alpha, 0.0), max(beta, 1e-15)

    def gap(s: float) -> float:  # > 0 while recursive doubling is faster
        return (estimate.allreduce_time(s, world_size, alpha=a, beta=b, algorithm="ring")
                - estimate.allreduce_time(s, world_size, alpha=a, beta=b, algorithm="recursive_doubling"))

    lo, hi = 0.0, 1.0
    while gap(hi) > 0:
        hi *= 2
        if hi > 2**60:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return hi


def measured_crossover_bytes(times: pd.DataFrame) -> float | None:
    """Smallest measured size from which the ring is faster than recursive doubling at every
    larger size too (None if it never is)."""
    ring = times[times.algorithm == "ring"].set_index("size_bytes").median_s
    rd = times[times.algorithm == "recursive_doubling"].set_index("size_bytes").median_s
    sizes = sorted(set(ring.index) & set(rd.index))
    crossover = None
    for size in reversed(sizes):
        if ring[size] < rd[size]:
            crossover = size
        else:
            break
    return crossover


def model_curves(sizes_bytes: Sequence[float], world_size: int, alpha: float, beta: float,
                 algorithms: Sequence[str] = ("ring", "recursive_doubling")) -> pd.DataFrame:
    """``estimate.allreduce_time`` on a grid of sizes, for drawing the model's lines.
    Columns: algorithm, size_bytes, predicted_s."""
    return pd.DataFrame([
        {"algorithm": a, "size_bytes": s,
         "predicted_s": estimate.allreduce_time(s, world_size, alpha=max(alpha, 0.0),
                                                beta=max(beta, 1e-15), algorithm=a)}
        for a in algorithms for s in sizes_bytes])
