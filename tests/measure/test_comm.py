"""CommMeter: exact point-to-point bytes, ring-formula collective bytes, patches always restored."""
import os
import pickle
import tempfile

import pytest
import torch
import torch.distributed as dist

from course_lib.measure import estimate as E
from course_lib.measure.comm import PATCHED_FUNCTIONS, CommMeter


@pytest.fixture
def single_rank_group():
    """A one-rank gloo group (FileStore in a temp dir): enough to test the counting logic."""
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _originals():
    return {name: (getattr(dist, name), getattr(dist.distributed_c10d, name))
            for name in PATCHED_FUNCTIONS}


def test_counts_calls_and_payloads_on_one_rank(single_rank_group):
    t = torch.ones(10)  # 40 bytes
    with CommMeter() as comm:
        dist.all_reduce(t)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.all_gather_into_tensor(torch.empty(10), t)
        dist.barrier()
    assert comm.calls == {"all_reduce": 2, "broadcast": 1, "all_gather_into_tensor": 1, "barrier": 1}
    assert [r["bytes"] for r in comm.records] == [40, 40, 40, 40, 0]
    assert comm.bytes_sent == 0 and comm.bytes_received == 0  # one rank moves nothing
    assert all(r["api"] == "c10d" and r["group_size"] == 1 for r in comm.records)
    assert comm.summary()["collective_bytes_in"] == 160
    assert comm.rank == 0
    clone = pickle.loads(pickle.dumps(comm))
    assert clone.records == comm.records and clone.calls == comm.calls


def test_patches_restored_even_on_error(single_rank_group):
    before = _originals()
    with pytest.raises(ZeroDivisionError):
        with CommMeter():
            assert dist.all_reduce is not before["all_reduce"][0]  # patched inside
            dist.all_reduce(torch.ones(2))
            raise ZeroDivisionError("the block fails")
    assert _originals() == before


def test_nested_wrapped_calls_are_counted_once(single_rank_group):
    # all_gather_object is not wrapped; it calls the wrapped all_gather internally, once per use
    with CommMeter(dispatch=False) as comm:
        out = [None]
        dist.all_gather_object(out, {"a": 1})
    assert out == [{"a": 1}]
    assert set(comm.calls) <= {"all_gather"} and comm.calls.get("all_gather", 0) >= 1


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"patch_modules\[0\] must be a module"):
        CommMeter(patch_modules=["torch"])


def test_works_without_a_process_group():
    with CommMeter() as comm:
        torch.ones(3).sum()
    assert comm.records == [] and comm.bytes_sent == 0


# ---- two and four real ranks ----------------------------------------------------------------------
launch = pytest.importorskip("course_lib.runtime.launch").launch


def _p2p_and_collectives(rank, world_size):
    import torch.distributed._functional_collectives as funcol

    from course_lib.measure.comm import CommMeter

    with CommMeter() as comm:
        if rank == 0:
            dist.send(torch.ones(5, dtype=torch.float64), dst=1)  # 40 bytes
            dist.isend(torch.ones(3), dst=1).wait()  # 12 bytes
        elif rank == 1:
            dist.recv(torch.empty(5, dtype=torch.float64))  # from any source
            dist.irecv(torch.empty(3), src=0).wait()
        grad = torch.ones(1000)  # 4000 bytes
        dist.all_reduce(grad)
        funcol.wait_tensor(funcol.all_reduce(grad, "sum", dist.group.WORLD))
        dist.reduce_scatter_tensor(torch.empty(1000 // world_size), grad)
    with CommMeter(dispatch=False) as direct:
        dist.all_to_all_single(torch.empty(4 * world_size), torch.ones(4 * world_size))  # 16 B each
        chunks = [torch.ones(2) for _ in range(world_size)] if rank == 0 else None
        dist.scatter(torch.empty(2), chunks, src=0)  # 8 bytes per rank
    return comm.summary(), comm.records, direct.records


@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_exact_for_send_recv_and_ring_formula_for_collectives(world_size):
    results = launch(_p2p_and_collectives, world_size, timeout=60)
    (s0, _, _), (s1, r1, _) = results[0], results[1]
    assert s0["p2p_bytes_sent"] == 52 and s0["p2p_bytes_received"] == 0
    assert s1["p2p_bytes_received"] == 52 and s1["p2p_bytes_sent"] == 0
    assert [(r["op"], r["peer"]) for r in r1[:2]] == [("recv", 0), ("irecv", 0)]
    ring = E.ring_allreduce_bytes_sent(4000, world_size)
    rs = E.reduce_scatter_bytes_sent(4000, world_size)
    for rank, (summary, records, direct) in enumerate(results):
        a2a, scatter = direct
        assert (a2a["op"], a2a["sent"], a2a["received"]) == ("all_to_all_single", 16 * (world_size - 1),
                                                             16 * (world_size - 1))
        root = rank == 0
        assert (scatter["sent"], scatter["received"]) == ((8 * (world_size - 1), 0) if root else (0, 8))
        assert summary["calls"]["all_reduce"] == 2
        apis = [r["api"] for r in records if r["op"] == "all_reduce"]
        assert apis == ["c10d", "functional"]  # CommDebugMode sees the functional one
        assert summary["collective_bytes_sent"] == 2 * ring + rs
    assert s0["bytes_sent"] == 52 + 2 * ring + rs


def _old_and_new_gather_names(rank, world_size):
    import torch
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter

    shard = torch.ones(250)  # 1000 bytes per rank
    with CommMeter(dispatch=False) as old:
        dist.all_gather_into_tensor(torch.empty(250 * world_size), shard)
        dist.reduce_scatter_tensor(torch.empty(250), torch.ones(250 * world_size))
    with CommMeter(dispatch=False) as new:
        dist.all_gather_single(torch.empty(250 * world_size), shard)
        dist.reduce_scatter_single(torch.empty(250), torch.ones(250 * world_size))
    return old.records, new.records


def test_torch_2_13_single_names_count_once_and_like_the_old_names():
    """all_gather_into_tensor now calls all_gather_single: each call must be recorded once,
    under the name the caller used, with the same bytes."""
    for old, new in launch(_old_and_new_gather_names, 2, timeout=60):
        assert [r["op"] for r in old] == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        assert [r["op"] for r in new] == ["all_gather_single", "reduce_scatter_single"]
        assert [(r["bytes"], r["sent"]) for r in old] == [(r["bytes"], r["sent"]) for r in new]
        assert [r["sent"] for r in new] == [1000, 1000]  # (N-1)/N of 2000 B on 2 ranks, both ways
