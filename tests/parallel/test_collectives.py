"""Parity of the from-scratch collectives with torch.distributed, on 2, 3 and 4 real gloo ranks.

Each world size is launched once and runs every case inside the ranks (process start-up dominates
the cost on 2 cores); the assertions happen here, in the parent, so failures read well.

Tolerance. The ring sums each chunk in a different rank order than gloo, and floating-point
addition is not associative, so results may differ in the last bits. The classic bound for a sum
of N terms computed in any order is |error| <= (N-1) * eps * sum_i |x_i| (Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., section 4.2); we compare each element against twice
that bound, with eps of the dtype under test. Inputs made of small integers are summed exactly in
every order, and there we require bitwise equality.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import course_lib
from course_lib.parallel import collectives as C

NUMELS = (1, 7, 1001)
DTYPES = (torch.float32, torch.float64)


# --------------------------------------------------------------------------------------------
# what runs inside the ranks
# --------------------------------------------------------------------------------------------
def _ranks_parity(rank: int, world_size: int) -> dict:
    """Run every from-scratch collective beside its torch.distributed twin; return plain data."""
    out: dict = {
        "all_reduce": {},
        "exact": {},
        "reduce_scatter": {},
        "all_gather": {},
        "errors": {},
        "half": {},
    }
    algorithms = dict(C.ALL_REDUCE_ALGORITHMS)
    if world_size & (world_size - 1):
        algorithms.pop("recursive_doubling")
        try:
            C.recursive_doubling_all_reduce(torch.ones(4))
        except ValueError as err:
            out["errors"]["recursive_doubling"] = str(err)
    for dtype in DTYPES:
        for numel in NUMELS:
            gen = torch.Generator().manual_seed(1000 * rank + numel)
            x = torch.randn(numel, generator=gen, dtype=torch.float64).to(dtype)
            ref = x.clone()
            dist.all_reduce(ref)
            abs_sum = x.abs()
            dist.all_reduce(abs_sum)
            for name, fn in algorithms.items():
                got = x.clone()
                returned = fn(got)
                out["all_reduce"][(name, str(dtype), numel)] = (got, ref, abs_sum, returned is got)
            ints = torch.randint(-50, 50, (numel,), generator=gen).to(dtype)
            ref_ints = ints.clone()
            dist.all_reduce(ref_ints)
            for name, fn in algorithms.items():
                out["exact"][(name, str(dtype), numel)] = (fn(ints.clone()), ref_ints)
            # reduce-scatter / all-gather: k elements per rank, k odd
            k = numel
            big = torch.randn(world_size * k, generator=gen, dtype=torch.float64).to(dtype)
            mine, theirs = torch.empty(k, dtype=dtype), torch.empty(k, dtype=dtype)
            big_before = big.clone()
            C.ring_reduce_scatter(mine, big)
            reduce_scatter_ref = (
                getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            )
            reduce_scatter_ref(theirs, big.clone())
            big_abs = big.abs()
            dist.all_reduce(big_abs)
            out["reduce_scatter"][(str(dtype), numel)] = (
                mine,
                theirs,
                big_abs.chunk(world_size)[rank],
                torch.equal(big, big_before),
            )
            gathered, gathered_ref = (
                torch.empty(world_size * k, dtype=dtype),
                torch.empty(world_size * k, dtype=dtype),
            )
            C.ring_all_gather(gathered, x)
            all_gather_ref = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            all_gather_ref(gathered_ref, x)
            out["all_gather"][(str(dtype), numel)] = (gathered, gathered_ref)
    # half precision: the ring adds in bf16/fp16; compare with the exact (float64) sum
    for dtype in (torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(101, generator=gen).to(dtype)
        exact = x.double()
        dist.all_reduce(exact)
        abs_sum = x.double().abs()
        dist.all_reduce(abs_sum)
        out["half"][str(dtype)] = (C.ring_all_reduce(x.clone()), exact, abs_sum)
    # a subgroup: ranks 1..N-1 only (peers are addressed by global rank inside the group)
    sub_ranks = list(range(1, world_size))
    group = dist.new_group(sub_ranks)
    if rank in sub_ranks:
        y = torch.tensor([float(rank)] * 5)
        C.ring_all_reduce(y, group=group)
        out["subgroup"] = y
        if len(sub_ranks) & (len(sub_ranks) - 1) == 0:
            z = torch.tensor([float(rank)])
            C.recursive_doubling_all_reduce(z, group=group)
            out["subgroup_rd"] = z
    # shapes: a non-contiguous 2-D tensor is reduced in place through a copy
    mat = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (rank + 1)  # (4, 3) strided
    C.ring_all_reduce(mat)
    out["non_contiguous"] = mat
    # the ring, step by step, on powers of two: each value is a bitmask of contributing ranks
    record: list = []
    C.ring_all_reduce(torch.full((2 * world_size + 1,), float(2**rank)), record=record)
    out["record"] = record
    # bad sizes for the mirrored signatures
    for name, call in {
        "reduce_scatter": lambda: C.ring_reduce_scatter(
            torch.empty(3), torch.empty(3 * world_size + 1)
        ),
        "all_gather": lambda: C.ring_all_gather(torch.empty(3 * world_size - 1), torch.empty(3)),
    }.items():
        try:
            call()
        except ValueError as err:
            out["errors"][name] = str(err)
    return out


# --------------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------------
def _launch(fn, world_size, *args):
    return course_lib.launch(fn, world_size, *args, timeout=120.0)


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def parity(request):
    return request.param, _launch(_ranks_parity, request.param)


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------
def _bound(abs_sum: torch.Tensor, world_size: int) -> torch.Tensor:
    eps = torch.finfo(abs_sum.dtype).eps
    return 2 * (world_size - 1) * eps * abs_sum + torch.finfo(abs_sum.dtype).tiny


def test_all_reduce_matches_torch_within_summation_bound(parity):
    world_size, results = parity
    names = {name for name, _, _ in results[0]["all_reduce"]}
    expected_names = set(C.ALL_REDUCE_ALGORITHMS) - (
        {"recursive_doubling"} if world_size & (world_size - 1) else set()
    )
    assert names == expected_names
    for rank, res in enumerate(results):
        for key, (got, ref, abs_sum, same_object) in res["all_reduce"].items():
            assert same_object, f"{key}: must reduce in place and return its argument"
            assert got.dtype == ref.dtype and got.shape == ref.shape
            err = (got - ref).abs()
            assert bool((err <= _bound(abs_sum, world_size)).all()), (
                f"rank {rank} {key}: max error {err.max().item():.3g} above the summation bound"
            )


def test_all_reduce_small_integers_exact_and_identical_on_every_rank(parity):
    world_size, results = parity
    for key, (got, ref) in results[0]["exact"].items():
        assert torch.equal(got, ref), key
    for key, (got, _, _, _) in results[0]["all_reduce"].items():
        if key[0] == "naive_ring":  # each rank adds in its own order: may differ in the last bit
            continue
        for rank in range(1, world_size):
            assert torch.equal(results[rank]["all_reduce"][key][0], got), (
                f"{key}: rank {rank} differs from rank 0 (every rank must hold the same bits)"
            )


def test_reduce_scatter_and_all_gather_match_torch(parity):
    world_size, results = parity
    for rank, res in enumerate(results):
        for key, (mine, theirs, abs_sum, input_untouched) in res["reduce_scatter"].items():
            assert input_untouched, f"rank {rank} {key}: ring_reduce_scatter modified its input"
            assert bool(((mine - theirs).abs() <= _bound(abs_sum, world_size)).all()), (rank, key)
        for key, (gathered, gathered_ref) in res["all_gather"].items():
            assert torch.equal(gathered, gathered_ref), (
                rank,
                key,
            )  # pure copies: bitwise equal  # pure copies: bitwise equal


def test_half_precision_within_its_own_summation_bound(parity):
    world_size, results = parity
    for rank, res in enumerate(results):
        for key, (got, exact, abs_sum) in res["half"].items():
            eps = torch.finfo(got.dtype).eps
            # N-1 additions plus the rounding of the inputs' sum to the half type
            bound = 2 * world_size * eps * abs_sum
            assert bool(((got.double() - exact).abs() <= bound).all()), (rank, key)


def test_subgroup_addresses_peers_by_global_rank(parity):
    world_size, results = parity
    total = float(sum(range(1, world_size)))
    assert "subgroup" not in results[0]  # rank 0 is outside the group and does nothing
    for res in results[1:]:
        assert res["subgroup"].tolist() == [total] * 5
        if "subgroup_rd" in res:
            assert res["subgroup_rd"].tolist() == [total]
    assert ("subgroup_rd" in results[1]) == ((world_size - 1) & (world_size - 2) == 0)


def test_non_contiguous_input_reduced_in_place(parity):
    world_size, results = parity
    scale = sum(range(1, world_size + 1))
    expected = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * scale
    for res in results:
        assert torch.equal(res["non_contiguous"], expected)


def test_record_shows_two_n_minus_one_steps_ending_complete(parity):
    world_size, results = parity
    full = float(2**world_size - 1)  # bitmask with every rank's bit set
    for rank, res in enumerate(results):
        record = res["record"]
        assert [r["step"] for r in record] == list(range(2 * (world_size - 1) + 1))
        assert [r["phase"] for r in record] == (
            ["input"] + ["reduce-scatter"] * (world_size - 1) + ["all-gather"] * (world_size - 1)
        )
        assert torch.all(record[0]["state"] == 2**rank)
        assert torch.all(record[-1]["state"] == full)
        # after reduce-scatter, the chunk this rank owns (chunk `rank`) is complete
        owned = torch.tensor_split(record[world_size - 1]["state"], world_size)[rank]
        assert torch.all(owned == full)


def test_bad_world_size_and_sizes_raise_clear_value_errors(parity):
    world_size, results = parity
    errors = results[0]["errors"]
    if world_size & (world_size - 1):
        msg = errors["recursive_doubling"]
        assert f"world_size = {world_size}: expected a power of two" in msg and "1, 2, 4, 8" in msg
    else:
        assert "recursive_doubling" not in errors
    assert (
        "input.numel()" in errors["reduce_scatter"]
        and f"world_size={world_size}" in errors["reduce_scatter"]
    )
    assert "output.numel()" in errors["all_gather"]


# --------------------------------------------------------------------------------------------
# single-process checks (no ranks needed)
# --------------------------------------------------------------------------------------------
def test_chunk_sizes_follow_tensor_split():
    for numel in (0, 1, 7, 8, 1001):
        for n in (1, 2, 3, 4, 5):
            expected = [c.numel() for c in torch.tensor_split(torch.empty(numel), n)]
            assert C.chunk_sizes(numel, n) == expected
    assert C.chunk_sizes(7, 4) == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="world_size = 0: expected an int >= 1"):
        C.chunk_sizes(4, 0)


def test_elements_sent_formula_is_exact_when_divisible():
    for n in (2, 3, 4, 8):
        for rank in range(n):
            assert C.ring_all_reduce_elements_sent(n * 100, n, rank) == 2 * (n - 1) * 100
    # uneven: every rank skips the chunk it owns after reduce-scatter and the last one it receives
    assert [C.ring_all_reduce_elements_sent(7, 4, r) for r in range(4)] == [10, 10, 11, 11]
    assert C.ring_all_reduce_elements_sent(5, 1, 0) == 0


def test_bad_tensors_raise_type_errors():
    with pytest.raises(TypeError, match="floating-point"):
        C.ring_all_reduce(torch.arange(4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        C.naive_ring_all_reduce([1.0, 2.0])


def test_outside_a_process_group_says_how_to_launch():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="course_lib.launch"):
        C.ring_all_reduce(torch.ones(3))


def test_single_rank_is_a_no_op():
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            x = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
            for fn in C.ALL_REDUCE_ALGORITHMS.values():
                y = x.clone()
                assert fn(y) is y and torch.equal(y, x)
            record: list = []
            C.ring_all_reduce(x.clone(), record=record)
            assert len(record) == 1 and record[0]["phase"] == "input"
            out = torch.empty(3, dtype=torch.float64)
            assert torch.equal(C.ring_reduce_scatter(out, x), x)
            assert torch.equal(C.ring_all_gather(torch.empty(3, dtype=torch.float64), x), x)
            with pytest.raises(TypeError, match="dtypes differ"):
                C.ring_all_gather(torch.empty(3, dtype=torch.float32), x)
            with pytest.raises(ValueError, match="root"):
                C.reduce_broadcast_all_reduce(x.clone(), root=1)
        finally:
            dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# payloads handed to send/recv, counted by CommMeter (exact, uneven sizes included)
# --------------------------------------------------------------------------------------------
def _ranks_bytes(rank: int, world_size: int) -> dict:
    from course_lib.measure.comm import CommMeter

    out = {}
    for numel in NUMELS:
        x = torch.randn(numel, dtype=torch.float64)
        with CommMeter(dispatch=False) as meter:
            C.ring_all_reduce(x)
        out[("ring_all_reduce", numel)] = (
            int(meter.model_bytes_sent),
            int(meter.model_bytes_received),
        )
        k = numel
        with CommMeter(dispatch=False) as meter:
            C.ring_reduce_scatter(torch.empty(k), torch.randn(world_size * k))
        out[("ring_reduce_scatter", numel)] = (
            int(meter.model_bytes_sent),
            int(meter.model_bytes_received),
        )
        with CommMeter(dispatch=False) as meter:
            C.ring_all_gather(torch.empty(world_size * k), torch.randn(k))
        out[("ring_all_gather", numel)] = (
            int(meter.model_bytes_sent),
            int(meter.model_bytes_received),
        )
    return out


@pytest.mark.parametrize("world_size", [3, 4])
def test_bytes_sent_are_exactly_the_chunks_forwarded(world_size):
    from course_lib.measure import estimate

    results = _launch(_ranks_bytes, world_size)
    for rank, res in enumerate(results):
        for numel in NUMELS:
            sent, received = res[("ring_all_reduce", numel)]
            assert sent == 8 * C.ring_all_reduce_elements_sent(numel, world_size, rank), (
                rank,
                numel,
            )
            # what rank r receives is what its left neighbour sends
            left = (rank - 1) % world_size
            assert received == 8 * C.ring_all_reduce_elements_sent(numel, world_size, left)
            k_bytes = 4 * numel
            assert (
                res[("ring_reduce_scatter", numel)][0]
                == estimate.reduce_scatter_bytes_sent(world_size * k_bytes, world_size)
                == (world_size - 1) * k_bytes
            )
            assert (
                res[("ring_all_gather", numel)][0]
                == estimate.allgather_bytes_sent(world_size * k_bytes, world_size)
                == (world_size - 1) * k_bytes
            )
    # divisible sizes: the estimate's 2(N-1)/N * S exactly
    s = 8 * world_size * 10
    assert 8 * C.ring_all_reduce_elements_sent(
        world_size * 10, world_size, 0
    ) == estimate.ring_allreduce_bytes_sent(s, world_size)
