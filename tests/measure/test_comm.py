"""CommMeter: bytes measured on the wire (/proc/self/io) beside the model's bytes (estimate),
exact point-to-point payloads, patches always restored.

Tolerance for wire bytes: a gloo message carries a small header (48 B per write: a send of k
bytes writes k + 96 B, its receiver 48 B), so a collective's wire bytes exceed its payload by a
few KiB at most (largest seen: 6.9 KiB for a 1 MiB list-form reduce_scatter on 4 ranks). With
S = 1 MiB every comparison allows 1 % of S (10.5 KiB); the findings the tests pin down (a tree
broadcast, reduce_scatter moving an all-reduce's bytes) differ from the ring model by 25-125 % of
S, so they cannot pass if the formula replaces the measurement."""

import os
import pickle
import tempfile

import pytest
import torch
import torch.distributed as dist

from course_lib.measure import estimate as E
from course_lib.measure import wire
from course_lib.measure.comm import PATCHED_FUNCTIONS, CommMeter

MIB = 2**20
TOL = 0.01  # of S: see the module docstring


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
    return {
        name: (getattr(dist, name), getattr(dist.distributed_c10d, name))
        for name in PATCHED_FUNCTIONS
        if hasattr(dist, name)  # torch < 2.13 has no *_single flat-tensor names
    }


def test_counts_calls_and_payloads_on_one_rank(single_rank_group):
    t = torch.ones(10)  # 40 bytes
    with CommMeter() as comm:
        dist.all_reduce(t)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.all_gather_into_tensor(torch.empty(10), t)
        dist.barrier()
    assert comm.calls == {
        "all_reduce": 2,
        "broadcast": 1,
        "all_gather_into_tensor": 1,
        "barrier": 1,
    }
    assert [r["bytes"] for r in comm.records] == [40, 40, 40, 40, 0]
    assert comm.model_bytes_sent == 0 and comm.model_bytes_received == 0  # one rank moves nothing
    assert comm.wire_source == wire.GLOO_SOURCE
    # measured: one rank writes nothing to a socket (all_gather_into_tensor's window may hold the
    # FutureWarning it writes to stderr on first use: wchar counts every write of the process)
    assert [
        w["wire_sent"] for w in comm.wire_windows if w["ops"] != ["all_gather_into_tensor"]
    ] == [0] * 4
    assert [r["wire_window"] for r in comm.records] == [0, 1, 2, 3, 4]
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
    with pytest.raises(TypeError, match=r"patch_modules\[0\] = .*: expected a module"):
        CommMeter(patch_modules=["torch"])


def test_works_without_a_process_group():
    with CommMeter() as comm:
        torch.ones(3).sum()
    assert comm.records == [] and comm.model_bytes_sent == 0
    assert comm.wire_source.startswith("unavailable: no process group")
    assert comm.wire_bytes_sent is None and comm.summary()["wire_bytes_sent"] is None


def test_wire_bytes_come_from_the_os_counter(single_rank_group, monkeypatch):
    """Replace the OS counter by a fake that grows 1000 B per read: every synchronous call's
    wire_sent becomes exactly 1000 (one read before, one after), whatever its payload -- so the
    number is read from the counter, not computed from the call."""
    reads = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(wire, "read_wchar", lambda: next(reads))
    with CommMeter(dispatch=False) as comm:
        dist.all_reduce(torch.ones(10))
        dist.broadcast(torch.ones(1000), src=0)
    assert [r["wire_sent"] for r in comm.records] == [1000, 1000]
    assert [r["residual"] for r in comm.records] == [1000, 1000]  # the model says 0 on one rank
    assert comm.wire_bytes_sent == 2000 and comm.model_bytes_sent == 0


def test_unavailable_wire_is_reported_not_invented(single_rank_group, monkeypatch):
    assert "NCCL" in wire.wire_source("nccl") and wire.wire_source("nccl").startswith("unavailable")
    monkeypatch.setattr(wire.sys, "platform", "darwin")
    assert wire.wire_source("gloo").startswith("unavailable: darwin has no /proc/self/io")
    monkeypatch.undo()
    monkeypatch.setattr(wire, "_PROC_IO", os.path.join(tempfile.gettempdir(), "no-such-io-file"))
    reason = wire.wire_source("gloo")
    assert reason.startswith("unavailable: cannot read")
    with CommMeter(dispatch=False) as comm:
        dist.all_reduce(torch.ones(10))
    assert comm.wire_source == reason and comm.wire_bytes_sent is None
    assert comm.records[0]["wire_sent"] is None and comm.records[0]["model_sent"] == 0
    assert comm.wire_windows == [] and comm.wire_residual is None


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
        assert (a2a["op"], a2a["model_sent"], a2a["model_received"]) == (
            "all_to_all_single",
            16 * (world_size - 1),
            16 * (world_size - 1),
        )
        root = rank == 0
        assert (scatter["model_sent"], scatter["model_received"]) == (
            (8 * (world_size - 1), 0) if root else (0, 8)
        )
        assert summary["calls"]["all_reduce"] == 2
        apis = [r["api"] for r in records if r["op"] == "all_reduce"]
        assert apis == ["c10d", "functional"]  # CommDebugMode sees the functional one
        assert summary["collective_model_bytes_sent"] == 2 * ring + rs
        # measured: the functional all_reduce runs outside any call window (unmeasured); the
        # direct one writes the ring's bytes plus headers
        functional = [r for r in records if r["api"] == "functional"][0]
        assert functional["wire_sent"] is None and summary["unmeasured_calls"] == 1
        direct = [r for r in records if r["op"] == "all_reduce" and r["api"] == "c10d"][0]
        assert ring <= direct["wire_sent"] <= ring + 4096, direct
        assert summary["wire_block_bytes"] >= summary["wire_bytes_sent"] > 0
    assert s0["model_bytes_sent"] == 52 + 2 * ring + rs


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


@pytest.mark.skipif(
    not hasattr(dist, "all_gather_single"), reason="torch < 2.13 has no all_gather_single"
)
def test_torch_2_13_single_names_count_once_and_like_the_old_names():
    """all_gather_into_tensor now calls all_gather_single: each call must be recorded once,
    under the name the caller used, with the same bytes."""
    for old, new in launch(_old_and_new_gather_names, 2, timeout=60):
        assert [r["op"] for r in old] == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        assert [r["op"] for r in new] == ["all_gather_single", "reduce_scatter_single"]
        assert [(r["bytes"], r["model_sent"]) for r in old] == [
            (r["bytes"], r["model_sent"]) for r in new
        ]
        assert [r["model_sent"] for r in new] == [
            1000,
            1000,
        ]  # (N-1)/N of 2000 B on 2 ranks, both ways


# ---- wire bytes of real gloo collectives --------------------------------------------------------
def _wire_figures(rank, world_size, size):
    """Each primitive once on S = ``size`` bytes, a CommMeter around each; wire and model per op."""
    import torch
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter
    from course_lib.runtime import compat

    n, numel = world_size, size // 4
    ops = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(numel)),
        "all_gather": lambda: dist.all_gather(
            [torch.empty(numel) for _ in range(n)], torch.ones(numel)
        ),
        "broadcast": lambda: dist.broadcast(torch.ones(numel), src=0),
        "reduce_scatter": lambda: compat.reduce_scatter_single(
            torch.empty(numel // n), torch.ones(numel)
        ),
        "send": lambda: (
            dist.send(torch.ones(numel), dst=1)
            if rank == 0
            else dist.recv(torch.empty(numel), src=0)
            if rank == 1
            else None
        ),
        "send 4 B": lambda: (
            dist.send(torch.ones(1), dst=1)
            if rank == 0
            else dist.recv(torch.empty(1), src=0)
            if rank == 1
            else None
        ),
        "async all_reduce": lambda: dist.all_reduce(torch.ones(numel), async_op=True).wait(),
        "isend+irecv": lambda: [
            w.wait()
            for w in [
                dist.isend(torch.ones(numel), (rank + 1) % n),
                dist.irecv(torch.empty(numel), (rank - 1) % n),
            ]
        ],
    }
    out = {}
    for name, op in ops.items():
        dist.barrier()
        with CommMeter(dispatch=False) as meter:
            op()
        out[name] = {
            "wire": meter.wire_bytes_sent,
            "model": meter.model_bytes_sent,
            "records": meter.records,
            "windows": meter.wire_windows,
            "source": meter.wire_source,
        }
    return out


# wire bytes per rank in multiples of S (S = the tensor; for all_gather and reduce_scatter, S_in),
# as gloo moves them: all_reduce is a ring, broadcast a binomial tree, reduce_scatter an all-reduce
GLOO_WIRE = {
    2: {
        "all_reduce": [1.0, 1.0],
        "all_gather": [1.0, 1.0],
        "broadcast": [1.0, 0.0],
        "reduce_scatter": [1.0, 1.0],
    },
    4: {
        "all_reduce": [1.5] * 4,
        "all_gather": [3.0] * 4,
        "broadcast": [2.0, 1.0, 0.0, 0.0],
        "reduce_scatter": [1.5] * 4,
    },
}


@pytest.fixture(scope="module", params=[2, 4], ids=["W=2", "W=4"])
def wire_run(request):
    n = request.param
    return n, launch(_wire_figures, n, MIB, timeout=120)


def test_wire_bytes_reproduce_what_gloo_moves(wire_run):
    n, results = wire_run
    for name, per_rank in GLOO_WIRE[n].items():
        for rank, expected in enumerate(per_rank):
            got = results[rank][name]
            assert got["source"] == wire.GLOO_SOURCE
            assert abs(got["wire"] - expected * MIB) <= TOL * MIB, (name, rank, got["wire"] / MIB)
            # the model is the ring's figure on every rank; a residual says where gloo differs
            assert got["records"][0]["residual"] == got["wire"] - got["model"]


def test_wire_differs_from_the_ring_model_where_gloo_differs(wire_run):
    """Would fail if wire_sent were computed from the formula: broadcast is a tree (the model
    spreads (N-1)/N S over every rank) and reduce_scatter moves an all-reduce's 2(N-1)/N S_in,
    twice the ring reduce-scatter's (N-1)/N S_in."""
    n, results = wire_run
    for rank in range(n):
        rs = results[rank]["reduce_scatter"]
        assert rs["model"] == E.reduce_scatter_bytes_sent(MIB, n)  # (N-1)/N S_in
        residual = rs["records"][0]["residual"]
        assert abs(residual - rs["model"]) <= TOL * MIB, residual / MIB  # wire = 2 x model
        bc = results[rank]["broadcast"]
        assert bc["model"] == E.collective_bytes_sent("broadcast", MIB, n)  # (N-1)/N S
        residual = bc["records"][0]["residual"]
        tree = GLOO_WIRE[n]["broadcast"][rank] * MIB
        assert abs(residual - (tree - bc["model"])) <= TOL * MIB, residual / MIB
        assert abs(residual) >= 0.2 * MIB  # on every rank: at least a quarter of S off the model
    # per rank the two disagree, in total they agree: a tree moves (N-1) S like the ring pipeline
    total_wire = sum(results[r]["broadcast"]["wire"] for r in range(n))
    assert abs(total_wire - (n - 1) * MIB) <= TOL * MIB


def test_header_overhead_and_asynchronous_windows(wire_run):
    n, results = wire_run
    sender, receiver = results[0], results[1]
    # a send's overhead is a constant, the same for 4 B and 1 MiB: headers, not payload
    big, small = sender["send"]["wire"] - MIB, sender["send 4 B"]["wire"] - 4
    assert big == small and 0 < big <= 256, (big, small)
    assert 0 < receiver["send"]["wire"] <= 256  # the receiver writes only its notice
    for rank in range(n):
        res = results[rank]
        # async_op=True: the window stays open until wait() returns, so the bytes are all there
        assert abs(res["async all_reduce"]["wire"] - res["all_reduce"]["wire"]) <= TOL * MIB
        assert res["async all_reduce"]["records"][0]["wire_sent"] == res["async all_reduce"]["wire"]
        # isend + irecv waited together: one measured window, no per-call split
        pair = res["isend+irecv"]
        assert [w["ops"] for w in pair["windows"]] == [["isend", "irecv"]]
        assert [r["wire_sent"] for r in pair["records"]] == [None, None]
        assert (
            0 < pair["wire"] - MIB <= 1024 and pair["windows"][0]["residual"] == pair["wire"] - MIB
        )


def test_collective_family_is_the_same_on_every_supported_torch():
    from course_lib.measure.comm import collective_family

    for old, new, family in [
        ("all_gather_into_tensor", "all_gather_single", "all_gather"),
        ("reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter"),
    ]:
        assert collective_family(old) == collective_family(new) == family
    assert collective_family("all_to_all_single") == "all_to_all"
    assert collective_family("all_reduce") == "all_reduce"


def _as_on_torch_211(rank, world_size):
    """torch 2.11 has only the old names (each the implementation itself): after
    compat.provide_new_collective_names, code written with 2.13's names runs and is metered once
    per call, whichever name it used."""
    from course_lib.runtime import compat

    c10d = dist.distributed_c10d
    for old, new in (
        ("all_gather_into_tensor", "all_gather_single"),
        ("reduce_scatter_tensor", "reduce_scatter_single"),
    ):
        impl = getattr(c10d, new)
        if impl.__module__ == "course_lib.runtime.compat":
            continue  # an older torch indeed: the rank already runs on the old names
        for module in (c10d, dist):
            vars(module)[old] = impl
            del vars(module)[new]
    compat.provide_new_collective_names()
    out, shard = torch.empty(4 * world_size), torch.empty(2)
    with CommMeter() as meter:
        dist.all_gather_single(out, torch.ones(4))
        compat.reduce_scatter_single(shard, torch.ones(2 * world_size))
        dist.all_gather_into_tensor(out, torch.ones(4))
    return meter.calls, meter.model_bytes_sent, out.tolist(), shard.tolist()


def test_the_213_names_on_an_older_torch_run_and_are_metered_once():
    for calls, sent, out, shard in launch(_as_on_torch_211, 2, timeout=60):
        assert calls == {
            "all_gather_single": 1,
            "reduce_scatter_single": 1,
            "all_gather_into_tensor": 1,
        }
        assert sent == 2 * 16 + 8  # two all-gathers: (N-1) x 16 B; reduce-scatter (N-1)/N x 16 B
        assert out == [1.0] * 8 and shard == [2.0, 2.0]
