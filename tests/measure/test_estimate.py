"""The formulas reproduce the published figures they cite, and reject bad input by name."""

import math

import pytest

from course_lib.measure import estimate as E


# ---- dtypes and model state -------------------------------------------------------------------
def test_dtype_bytes_names_and_torch_dtypes():
    import torch

    assert (
        E.dtype_bytes("fp32") == 4 and E.dtype_bytes("bfloat16") == 2 and E.dtype_bytes("int8") == 1
    )
    assert E.dtype_bytes(torch.float16) == 2 and E.dtype_bytes(torch.float64) == 8
    with pytest.raises(ValueError, match="dtype = 'fp12': expected"):
        E.dtype_bytes("fp12")


@pytest.mark.parametrize(
    "optimizer,expected",
    [
        ("sgd", 0),
        ("momentum", 4),
        ("rmsprop", 4),
        ("adagrad", 4),
        ("adam", 8),
        ("adamw", 8),
        ("adam8bit", 2),
    ],
)
def test_optimizer_state_bytes_per_param(optimizer, expected):
    assert E.optimizer_state_bytes_per_param(optimizer) == expected


def test_optimizer_state_width_and_errors():
    assert E.optimizer_state_bytes_per_param("adam", state_dtype_bytes=2) == 4
    with pytest.raises(ValueError, match="optimizer = 'lion'.*expected one of sgd"):
        E.optimizer_state_bytes_per_param("lion")
    with pytest.raises(ValueError, match="state_dtype_bytes = 4.*adam8bit"):
        E.optimizer_state_bytes_per_param("adam8bit", state_dtype_bytes=4)


def test_model_state_bytes_recipes():
    n = 1000
    fp32 = E.model_state_bytes(n, precision="fp32", optimizer="adam")
    assert fp32 == {"params": 4000, "grads": 4000, "optimizer": 8000, "master": 0, "total": 16000}
    mixed = E.model_state_bytes(n, precision="bf16-mixed", optimizer="adamw")
    # ZeRO paper, Sec. 3.1: 2 + 2 + (4 + 4 + 4) = 16 bytes per parameter
    assert mixed == {
        "params": 2000,
        "grads": 2000,
        "optimizer": 8000,
        "master": 4000,
        "total": 16000,
    }
    assert E.model_state_bytes(n, precision="fp16-mixed", optimizer="sgd")["total"] == 8000
    true16 = E.model_state_bytes(n, precision="bf16-true", optimizer="adam")
    assert true16["optimizer"] == 4000 and true16["total"] == 8000
    assert E.model_state_bytes(n, optimizer="adam8bit")["optimizer"] == 2000
    # torch.optim's per-tensor step counters, when asked for
    assert E.model_state_bytes(n, optimizer="adam", n_param_tensors=3)["optimizer"] == 8012
    assert E.model_state_bytes(n, optimizer="momentum", n_param_tensors=3)["optimizer"] == 4000
    # the 12-byte accounting: bf16 params and grads, fp32 Adam moments, no master (S2)
    twelve = E.model_state_bytes(n, precision="bf16-true", optimizer="adam", state_dtype_bytes=4)
    assert twelve == {"params": 2000, "grads": 2000, "optimizer": 8000, "master": 0, "total": 12000}
    with pytest.raises(ValueError, match="state_dtype_bytes"):
        E.model_state_bytes(n, optimizer="adam8bit", state_dtype_bytes=4)
    with pytest.raises(ValueError, match="state_dtype_bytes"):
        E.model_state_bytes(n, state_dtype_bytes=0)


def test_model_state_bytes_bad_values_name_parameter_and_choices():
    with pytest.raises(
        ValueError, match=r"precision = 'fp8'.*fp32, bf16-mixed, fp16-mixed, bf16-true"
    ):
        E.model_state_bytes(10, precision="fp8")
    with pytest.raises(ValueError, match=r"optimizer = 'adafactor': expected"):
        E.model_state_bytes(10, optimizer="adafactor")
    with pytest.raises(ValueError, match="n_params = .*: expected .*>= 0"):
        E.model_state_bytes(-1)
    with pytest.raises(TypeError, match="n_params = .*: expected an int"):
        E.model_state_bytes("10")


# ---- 8-bit Adam (bitsandbytes), exact -----------------------------------------------------------
def test_adam8bit_state_bytes_by_hand():
    # one 8-bit tensor of 4096 (16 blocks), one kept in fp32 (100 < 4096)
    assert E.adam8bit_state_bytes([4096, 100]) == {
        "uint8_states": 2 * 4096,
        "fp32_states": 8 * 100,
        "absmax": 2 * 4 * 16,
        "code_books": 2 * 256 * 4,
        "unorm": 0,
        "total": 8192 + 800 + 128 + 2048,
    }
    # a partial last block still costs a whole scale; code books only when some tensor is 8-bit
    assert E.adam8bit_state_bytes([4097])["absmax"] == 2 * 4 * 17
    assert E.adam8bit_state_bytes([10, 20]) == {
        "uint8_states": 0,
        "fp32_states": 240,
        "absmax": 0,
        "code_books": 0,
        "unorm": 0,
        "total": 240,
    }
    assert E.adam8bit_state_bytes([])["total"] == 0
    assert E.adam8bit_state_bytes([100], min_8bit_size=0)["uint8_states"] == 200
    assert E.adam8bit_state_bytes([4096], block_size=2048)["absmax"] == 2 * 4 * 2
    assert E.adam8bit_state_bytes([4096, 1], max_unorm=1.0)["unorm"] == 8
    # a large matrix tends to 2 + 8/256 bytes per parameter
    n = 4096 * 4096
    bpp = (E.adam8bit_state_bytes([n])["total"] - 2048) / n
    assert bpp == 2 + 8 / 256


def test_adam8bit_state_bytes_errors_name_the_parameter():
    with pytest.raises(TypeError, match="param_numels = .*: expected an iterable"):
        E.adam8bit_state_bytes(4096)
    with pytest.raises(ValueError, match=r"param_numels\[1\] = .*: expected .*>= 0"):
        E.adam8bit_state_bytes([4096, -1])
    with pytest.raises(TypeError, match=r"param_numels\[0\] = .*: expected an int"):
        E.adam8bit_state_bytes(["4096"])
    with pytest.raises(ValueError, match="block_size = .*: expected an int >= 1"):
        E.adam8bit_state_bytes([4096], block_size=0)
    with pytest.raises(ValueError, match="max_unorm = -1"):
        E.adam8bit_state_bytes([4096], max_unorm=-1)


def _optimizer_state_nbytes(opt):
    """Bytes of the tensors in ``opt.state``, each storage once (bitsandbytes shares its code books)."""
    import torch

    seen, total = set(), 0
    for st in opt.state.values():
        for t in st.values():
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adam8bit_state_bytes_equals_bitsandbytes_measured(dtype):
    """The formula against the real bitsandbytes.optim.Adam8bit: tensors below 4,096 elements
    (biases, LayerNorm), at and above it, sizes that are not a multiple of the 256-value block,
    and a parameter without a gradient (no state). Measured two ways: the bytes of the tensors
    in ``optimizer.state`` and MemoryMeter's *optimizer* bytes."""
    import torch

    bnb = pytest.importorskip("bitsandbytes")
    from course_lib.measure.memory import MemoryMeter

    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {
            "a": torch.nn.Linear(64, 64),
            "ln": torch.nn.LayerNorm(64),
            "b": torch.nn.Linear(64, 100),
            "emb": torch.nn.Embedding(300, 17),
            "unused": torch.nn.Linear(80, 80),
        }
    ).to(dt)
    opt = bnb.optim.Adam8bit(model.parameters(), lr=1e-3)
    with MemoryMeter(model, opt) as mem:
        x = torch.randn(3, 64, dtype=dt)
        loss = (
            model["b"](model["ln"](model["a"](x))).sum() + model["emb"](torch.tensor([1, 2])).sum()
        )
        loss.backward()
        opt.step()
    with_grad = [p for p in model.parameters() if p.grad is not None]
    numels = sorted(p.numel() for p in with_grad)
    assert numels[0] < 4096 <= numels[-1] and any(n % 256 for n in numels if n >= 4096)
    pred = E.adam8bit_state_bytes(p.numel() for p in with_grad)
    assert _optimizer_state_nbytes(opt) == pred["total"] == int(mem.end_breakdown["optimizer"])
    assert pred["total"] > 2 * sum(numels)  # more than the naive 2 B/param
    # the parts, read from the state by name
    uint8 = sum(
        st["state1"].nbytes + st["state2"].nbytes
        for st in opt.state.values()
        if st["state1"].dtype == torch.uint8
    )
    absmax = sum(
        st["absmax1"].nbytes + st["absmax2"].nbytes for st in opt.state.values() if "absmax1" in st
    )
    assert (uint8, absmax) == (pred["uint8_states"], pred["absmax"])
    assert (
        len({st["qmap1"].data_ptr() for st in opt.state.values() if "qmap1" in st}) == 1
    )  # shared


def test_adam8bit_state_bytes_unorm_buffer_matches_bitsandbytes():
    import torch

    # the base class of Adam8bit; Adam8bit itself does not expose max_unorm
    Optimizer2State = pytest.importorskip("bitsandbytes.optim.optimizer").Optimizer2State

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 80)), torch.nn.Parameter(torch.randn(80))]
    opt = Optimizer2State("adam", params, lr=1e-3, optim_bits=8, max_unorm=1.0)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert _optimizer_state_nbytes(opt) == E.adam8bit_state_bytes(params, max_unorm=1.0)["total"]


# ---- ZeRO -------------------------------------------------------------------------------------
def test_zero_paper_figure_1():
    # Rajbhandari et al. 2019, Figure 1: Psi = 7.5B, N_d = 64, K = 12
    got = [round(E.zero_bytes_per_rank(7.5e9, stage=s, world_size=64) / E.GB, 1) for s in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_zero_breakdown_sums_and_errors():
    bd = E.zero_state_breakdown_per_rank(1000, stage=2, world_size=4)
    assert bd == {"params": 2000, "grads": 500, "optimizer": 3000, "total": 5500}
    assert E.zero_bytes_per_rank(10, stage=1, world_size=3) == pytest.approx(40 + 120 / 3)
    with pytest.raises(ValueError, match="stage = 4.*0, 1, 2, 3"):
        E.zero_bytes_per_rank(10, stage=4, world_size=2)
    with pytest.raises(ValueError, match="world_size = .*: expected an int >= 1"):
        E.zero_bytes_per_rank(10, stage=1, world_size=0)


# ---- activations ------------------------------------------------------------------------------
def test_activation_bytes_mlp_counts():
    # relu: hidden outputs once + the output; gelu also keeps the pre-activations
    assert E.activation_bytes_mlp(2, [3, 5, 7, 4]) == 4 * 2 * (5 + 7 + 4)
    assert E.activation_bytes_mlp(2, [3, 5, 7, 4], activation="gelu") == 4 * 2 * (2 * 12 + 4)
    assert E.activation_bytes_mlp(
        2, [3, 5, 4], include_input=True, include_output=False, dtype_bytes=2
    ) == 2 * 2 * (3 + 5)
    assert E.activation_bytes_mlp(8, [3, 5, 4]) == 2 * E.activation_bytes_mlp(4, [3, 5, 4])
    with pytest.raises(ValueError, match="activation = 'elu'.*relu"):
        E.activation_bytes_mlp(2, [3, 4], activation="elu")
    with pytest.raises(ValueError, match="widths"):
        E.activation_bytes_mlp(2, [3])


def test_korthikanti_equation_1():
    s, b, h, a = 2048, 4, 4096, 32
    assert E.activation_bytes_transformer_layer(s, b, h, a) == s * b * h * (34 + 5 * a * s // h)
    assert E.activation_bytes_transformer_layer(s, b, h, a, recompute="selective") == 34 * s * b * h
    assert E.activation_bytes_transformer_layer(s, b, h, a, recompute="full") == 2 * s * b * h
    assert E.activation_bytes_transformer_layer(s, b, h, a, dtype_bytes=4, dropout=False) == 4 * (
        16 * s * b * h + a * s * s * b
    )
    with pytest.raises(ValueError, match="recompute = 'some'"):
        E.activation_bytes_transformer_layer(s, b, h, a, recompute="some")


def test_activation_bytes_gpt_matches_korthikanti_without_dropout():
    from course_lib.models import GPTConfig

    cfg = GPTConfig.tiny()
    B, T, C, L = 2, 16, cfg.n_embd, cfg.n_layer
    per_layer_fp32 = (
        E.activation_bytes_transformer_layer(T, B, C, cfg.n_head, dtype_bytes=4, dropout=False)
        + 4 * 4 * B * T
    )
    head = 4 * (2 * B * T * C + 2 * B * T)
    assert E.activation_bytes_gpt(cfg, B, T, include_logits=False) == L * per_layer_fp32 + head
    with pytest.raises(ValueError, match="seq = 65"):
        E.activation_bytes_gpt(cfg, 1, 65)
    with pytest.raises(ValueError, match="config.dropout = 0.1"):
        E.activation_bytes_gpt(GPTConfig.tiny(dropout=0.1), 1, 8)
    from course_lib.models import LlamaConfig

    with pytest.raises(TypeError, match="expected a course_lib.models.GPTConfig"):
        E.activation_bytes_gpt(LlamaConfig.tiny(), 1, 8)


# ---- communication ----------------------------------------------------------------------------
def test_collective_bytes():
    S = 1200
    assert E.ring_allreduce_bytes_sent(S, 4) == 1800 and isinstance(
        E.ring_allreduce_bytes_sent(S, 4), int
    )
    assert E.ring_allreduce_bytes_sent(10, 3) == pytest.approx(40 / 3)
    assert E.ring_allreduce_bytes_sent(S, 1) == 0
    assert E.naive_ring_allreduce_bytes_sent(S, 4) == 3600
    assert E.reduce_broadcast_bytes_sent(S, 4) == 3600
    assert E.reduce_broadcast_bytes_sent(S, 4, root=False) == S
    assert E.allgather_bytes_sent(S, 4) == 900 == E.reduce_scatter_bytes_sent(S, 4)
    # all-reduce = reduce-scatter + all-gather
    assert E.ring_allreduce_bytes_sent(S, 4) == E.reduce_scatter_bytes_sent(
        S, 4
    ) + E.allgather_bytes_sent(S, 4)
    assert E.collective_bytes_sent("broadcast", S, 4) == 900
    assert E.collective_bytes_sent("send_recv", S, 4) == S
    with pytest.raises(ValueError, match="collective = 'allreduce'.*all_reduce"):
        E.collective_bytes_sent("allreduce", S, 4)


def test_scatter_gather_bytes_root_and_non_root():
    S, n = 1200, 4  # the root's full buffer: 4 chunks of 300 B
    assert E.scatter_bytes_sent(S, n, root=True) == 900  # the 3 other ranks' chunks
    assert E.scatter_bytes_sent(S, n, root=False) == 0
    assert E.gather_bytes_sent(S, n, root=True) == 0  # its own chunk is a local copy
    assert E.gather_bytes_sent(S, n, root=False) == 300
    # what every rank sends adds up to the N-1 chunks that cross the network, both ways
    assert E.scatter_bytes_sent(S, n, root=True) == sum(
        E.gather_bytes_sent(S, n, root=False) for _ in range(n - 1)
    )
    assert E.gather_bytes_sent(10, 3, root=False) == pytest.approx(10 / 3)
    assert E.scatter_bytes_sent(S, 1, root=True) == 0 == E.gather_bytes_sent(S, 1, root=False)
    for c, root, expected in (
        ("scatter", True, 900),
        ("scatter", False, 0),
        ("gather", True, 0),
        ("gather", False, 300),
    ):
        assert E.collective_bytes_sent(c, S, n, root=root) == expected
    with pytest.raises(ValueError, match=r"root = None: expected True.*'scatter'"):
        E.collective_bytes_sent("scatter", S, n)
    with pytest.raises(ValueError, match=r"root = 0: expected one of True"):
        E.gather_bytes_sent(S, n, root=0)
    # root is irrelevant where every rank sends the same
    assert E.collective_bytes_sent("broadcast", S, n, root=False) == 900
    assert E.busbw(100.0, "scatter", 4) == pytest.approx(75.0) == E.busbw(100.0, "gather", 4)


def test_scatter_gather_bytes_equal_what_commmeter_counts():
    """CommMeter's accounting of scatter/gather (its recording step, fed the arguments a call on
    a 4-rank group would bind) agrees with estimate for the root and for the other ranks. The
    end-to-end check on real ranks is in tests/units/u08_collectives/test_u08_run.py."""
    import torch

    from course_lib.measure import comm
    from course_lib.measure._comm_records import rooted_record

    n, chunk = 4, torch.empty(3)  # each rank's chunk: 12 B; the root's buffer S = 48 B
    S = n * chunk.numel() * chunk.element_size()
    meter = comm.CommMeter(dispatch=False)
    for name in ("scatter", "gather"):
        key = "src" if name == "scatter" else "dst"
        for is_root in (True, False):
            meter.records = []
            # group_src/group_dst is a rank in the default group, which is rank 0 outside a
            # process group: root 0 is "this rank", root 1 another one
            args = {"tensor": chunk, key: None, f"group_{key}": 0 if is_root else 1, "group": None}
            meter.records = [rooted_record(name, args, n, False)]
            assert meter.model_bytes_sent == E.collective_bytes_sent(name, S, n, root=is_root), (
                name,
                is_root,
            )


def test_recursive_doubling_bytes_and_allreduce_dispatch():
    S = 1000
    assert E.recursive_doubling_allreduce_bytes_sent(S, 8) == 3000
    assert E.recursive_doubling_allreduce_bytes_sent(S, 1) == 0
    assert E.recursive_doubling_allreduce_bytes_sent(S, 2) == S
    # the same figure as the alpha-beta model's bandwidth term with beta = 1 s/byte
    for n in (2, 4, 16):
        assert E.recursive_doubling_allreduce_bytes_sent(S, n) == E.allreduce_time(
            S, n, alpha=0.0, beta=1.0, algorithm="recursive_doubling"
        )
    with pytest.raises(ValueError, match=r"world_size = 6: expected a power of two.*1, 2, 4"):
        E.recursive_doubling_allreduce_bytes_sent(S, 6)
    assert E.allreduce_bytes_sent(S, 4) == E.ring_allreduce_bytes_sent(S, 4) == 1500
    assert E.allreduce_bytes_sent(S, 4, algorithm="naive_ring") == 3000
    assert E.allreduce_bytes_sent(S, 4, algorithm="reduce_broadcast") == 3000
    assert E.allreduce_bytes_sent(S, 4, algorithm="reduce_broadcast", root=False) == S
    assert E.allreduce_bytes_sent(S, 4, algorithm="recursive_doubling") == 2000
    with pytest.raises(ValueError, match=r"algorithm = 'tree'.*ring, naive_ring, reduce_broadcast"):
        E.allreduce_bytes_sent(S, 4, algorithm="tree")


def test_hierarchical_allreduce():
    s, g, n = 2 * 10**9, 8, 4
    a_in, a_out, b_in, b_out = 5e-6, 20e-6, 450e9, 50e9
    kw = dict(
        nodes=n, gpus_per_node=g, intra_GBps=450, inter_GBps=50, alpha_intra=a_in, alpha_inter=a_out
    )
    bd = E.hierarchical_allreduce_breakdown(s, **kw)
    intra = (g - 1) * (a_in + s / g / b_in)  # ring reduce-scatter in the node
    inter = 2 * (n - 1) * a_out + 2 * (n - 1) / n * (s / g) / b_out  # ring across nodes, S/G each
    assert bd["reduce_scatter_intra_s"] == pytest.approx(intra, rel=1e-12)
    assert bd["all_gather_intra_s"] == bd["reduce_scatter_intra_s"]
    assert bd["allreduce_inter_s"] == pytest.approx(inter, rel=1e-12)
    assert bd["hierarchical_s"] == pytest.approx(2 * intra + inter, rel=1e-12)
    assert E.hierarchical_allreduce_time(s, **kw) == bd["hierarchical_s"]
    ng = n * g
    assert bd["flat_rings_s"] == pytest.approx(
        2 * (ng - 1) * a_out + 2 * (ng - 1) / ng * (s / g) / b_out, rel=1e-12
    )
    # one node: the plain ring over its G GPUs
    one = E.hierarchical_allreduce_time(
        s, nodes=1, gpus_per_node=g, intra_GBps=450, inter_GBps=50, alpha_intra=a_in
    )
    assert one == pytest.approx(E.allreduce_time(s, g, alpha=a_in, bandwidth=b_in), rel=1e-12)
    with pytest.raises(ValueError, match="gpus_per_node = 0: expected an int >= 1"):
        E.hierarchical_allreduce_time(s, nodes=2, gpus_per_node=0, intra_GBps=1, inter_GBps=1)
    with pytest.raises(ValueError, match="inter_GBps = .*: expected a number > 0"):
        E.hierarchical_allreduce_time(s, nodes=2, gpus_per_node=2, intra_GBps=1, inter_GBps=0)
    with pytest.raises(ValueError, match="alpha_s = .*: expected .*>= 0"):
        E.hierarchical_allreduce_time(
            s, nodes=2, gpus_per_node=2, intra_GBps=1, inter_GBps=1, alpha_intra=-1.0
        )


def test_ddp_exposed_comm_time_pipeline():
    # 3 buckets of 100 B ready at 1, 2, 3 s; each all-reduce 0.5 + 100 * 0.005 = 1 s: no queue
    t = E.ddp_exposed_comm_time(100, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.005)
    assert t == pytest.approx(1.0)
    # 2.5 s per all-reduce: they queue behind each other and end at 1 + 3 * 2.5 = 8.5 s
    assert E.ddp_exposed_comm_time(
        100, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.02
    ) == pytest.approx(5.5)
    # one bucket: nothing overlaps
    assert E.ddp_exposed_comm_time(
        10**6, grad_bytes=300, backward_s=3.0, alpha=0.5, beta=0.01
    ) == pytest.approx(3.5)
    # ceil(250 / 100) = 3 buckets: 100, 100, 50
    assert E.ddp_exposed_comm_time(
        100, grad_bytes=250, backward_s=0.0, alpha=1.0, beta=0.0
    ) == pytest.approx(3.0)
    # fast links hide everything but the last bucket's call
    assert E.ddp_exposed_comm_time(
        10, grad_bytes=100, backward_s=10.0, alpha=0.0, beta=0.001
    ) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="bucket_bytes = 0: expected an int >= 1"):
        E.ddp_exposed_comm_time(0, grad_bytes=1, backward_s=1, alpha=0, beta=0)
    with pytest.raises(ValueError, match="backward_s = -1: expected .*>= 0"):
        E.ddp_exposed_comm_time(1, grad_bytes=1, backward_s=-1, alpha=0, beta=0)
    with pytest.raises(ValueError, match="beta = .*: expected .*>= 0"):
        E.ddp_exposed_comm_time(1, grad_bytes=1, backward_s=1, alpha=0, beta=-1e-9)


def test_pipeline_bubble():
    assert E.pipeline_bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert E.pipeline_bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert E.pipeline_bubble_fraction(1, 8) == 0
    with pytest.raises(ValueError, match="microbatches = .*: expected an int >= 1"):
        E.pipeline_bubble_fraction(4, 0)


def test_alpha_beta_models():
    assert E.alpha_beta_time(1e6, alpha_s=1e-5, bandwidth=1e9) == pytest.approx(1e-5 + 1e-3)
    assert E.alpha_beta_time(1e6, alpha_s=0, beta_s_per_byte=2e-9) == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="exactly one of beta_s_per_byte"):
        E.alpha_beta_time(1, bandwidth=1e9, beta_s_per_byte=1e-9)
    a, bw, S, p = 5e-6, 1e10, 1e8, 8
    assert E.allreduce_time(S, p, alpha=a, bandwidth=bw) == pytest.approx(14 * a + 1.75 * S / bw)
    assert E.allreduce_time(S, p, alpha=a, bandwidth=bw, algorithm="tree") == pytest.approx(
        6 * (a + S / bw)
    )
    assert E.allreduce_time(
        S, p, alpha=a, bandwidth=bw, algorithm="recursive_doubling"
    ) == pytest.approx(3 * (a + S / bw))
    # small messages: latency-bound, recursive doubling wins; large: ring wins
    assert E.allreduce_time(
        8, 64, alpha=a, bandwidth=bw, algorithm="recursive_doubling"
    ) < E.allreduce_time(8, 64, alpha=a, bandwidth=bw)
    assert E.allreduce_time(1e9, 64, alpha=a, bandwidth=bw) < E.allreduce_time(
        1e9, 64, alpha=a, bandwidth=bw, algorithm="recursive_doubling"
    )
    with pytest.raises(ValueError, match="algorithm = 'butterfly'.*ring, tree, recursive_doubling"):
        E.allreduce_time(S, p, bandwidth=bw, algorithm="butterfly")


def test_fit_alpha_beta_recovers_line():
    sizes = [1e3, 1e4, 1e5, 1e6]
    times = [2e-5 + s * 3e-10 for s in sizes]
    alpha, beta = E.fit_alpha_beta(sizes, times)
    assert alpha == pytest.approx(2e-5) and beta == pytest.approx(3e-10)
    with pytest.raises(ValueError, match="2 distinct sizes"):
        E.fit_alpha_beta([1, 1], [1, 2])


def test_busbw_nccl_tests_convention():
    assert E.busbw(100.0, "all_reduce", 8) == pytest.approx(175.0)
    assert E.busbw(100.0, "all_gather", 8) == pytest.approx(87.5)
    assert E.busbw(100.0, "reduce_scatter", 4) == pytest.approx(75.0)
    assert E.busbw(100.0, "broadcast", 4) == pytest.approx(100.0)
    assert E.algbw(1e9, 0.5) == pytest.approx(2e9)


def test_link_speeds_and_allreduce_on_link():
    assert (
        E.LINK_SPEEDS["NVLink H100"].headline_GBps == 900
        and E.LINK_SPEEDS["InfiniBand NDR"].headline_GBps == 50
    )
    # NVLink's and PCIe's headlines are both directions added; IB and Ethernet are per direction
    assert E.LINK_SPEEDS["NVLink H100"].per_direction_GBps == 450
    assert E.LINK_SPEEDS["PCIe 5.0 x16"].headline_GBps == 128  # NVIDIA's "PCIe Gen5: 128 GB/s"
    assert E.LINK_SPEEDS["PCIe 5.0 x16"].per_direction_GBps == 64
    for k in E.LINK_SPEEDS.values():
        both = k.name.startswith(("NVLink", "PCIe"))
        assert k.headline_is == ("bidirectional" if both else "per direction"), k.name
        assert k.headline_GBps == (2 if both else 1) * k.per_direction_GBps, k.name
    assert {"PCIe 4.0 x16", "PCIe 5.0 x16", "NVLink A100", "InfiniBand HDR", "100 GbE"} <= set(
        E.LINK_SPEEDS
    )
    assert all(link.source for link in E.LINK_SPEEDS.values())
    two_gb = 2e9  # bf16 gradients of a 1B-parameter model
    assert round(E.allreduce_time_on_link(two_gb, 8, 900) * 1e3, 1) == 3.9
    assert round(E.allreduce_time_on_link(two_gb, 8, 450) * 1e3, 1) == 7.8  # per direction
    assert round(E.allreduce_time_on_link(two_gb, 8, 50) * 1e3) == 70
    assert E.link_speed("nvlink h100").per_direction_GBps == 450
    with pytest.raises(ValueError, match="name = 'NVLink 9': expected"):
        E.link_speed("NVLink 9")


# ---- FLOPs, roofline, formatting --------------------------------------------------------------
def test_flops_and_roofline():
    assert E.matmul_flops(2, 3, 4) == 48
    assert E.training_flops_per_token(10) * 100 == 6000
    assert E.matmul_arithmetic_intensity(1024, 1024, 1024, dtype_bytes=2) == pytest.approx(
        2 * 1024**3 / (2 * 3 * 1024**2)
    )
    assert E.ridge_point(100e12, 2e12) == 50
    assert E.attainable_flops(10, 100e12, 2e12) == 20e12
    assert E.attainable_flops(1000, 100e12, 2e12) == 100e12
    assert E.roofline_time(1e12, 1e9, 100e12, 2e12) == pytest.approx(0.01)


def test_matmul_bytes_and_elementwise_cost():
    assert E.matmul_bytes(8, 16, 32, dtype_bytes=2) == 2 * (8 * 32 + 32 * 16 + 8 * 16)
    assert E.matmul_bytes(8, 16, 32) == 2 * E.matmul_bytes(8, 16, 32, dtype_bytes=2)
    assert E.matmul_arithmetic_intensity(8, 16, 32, dtype_bytes=2) == E.matmul_flops(
        8, 16, 32
    ) / E.matmul_bytes(8, 16, 32, dtype_bytes=2)
    with pytest.raises(ValueError, match="dtype_bytes = 0: expected an int >= 1"):
        E.matmul_bytes(2, 2, 2, dtype_bytes=0)
    with pytest.raises(ValueError, match="m = -1: expected .*>= 0"):
        E.matmul_bytes(-1, 2, 2)
    flops, nbytes = E.elementwise_cost(1000, flops_per_element=8)
    assert (flops, nbytes) == (8000, 8000) and isinstance(flops, int)
    gelu = E.elementwise_cost(1000, flops_per_element="gelu", dtype_bytes=2)
    assert gelu.flops == E.ELEMENTWISE_FLOPS["gelu"] * 1000 and gelu.bytes == 4000
    assert E.elementwise_cost(10, flops_per_element=2.5).flops == 25
    assert E.elementwise_cost(3, flops_per_element=0.5).flops == pytest.approx(1.5)
    with pytest.raises(
        ValueError, match=r"flops_per_element = 'relu'.*expected one of gelu, layernorm"
    ):
        E.elementwise_cost(10, flops_per_element="relu")
    with pytest.raises(ValueError, match="flops_per_element = .*: expected .*>= 0"):
        E.elementwise_cost(10, flops_per_element=-1)
    with pytest.raises(ValueError, match="numel = .*: expected .*>= 0"):
        E.elementwise_cost(-10, flops_per_element=1)


def test_fmt_bytes():
    assert E.fmt_bytes(3 * 2**30) == "3.00 GiB"
    assert E.fmt_bytes(512) == "512 B"
    assert E.fmt_bytes(1536, "KiB", digits=1) == "1.5 KiB"
    assert E.fmt_bytes(120e9, "GB", digits=1) == "120.0 GB"
    with pytest.raises(ValueError, match="unit = 'gb'.*GiB"):
        E.fmt_bytes(1, "gb")
    assert not math.isnan(E.GB)


def test_relative_fit_recovers_alpha_that_ordinary_least_squares_loses():
    # alpha = 50 us, 1 GB/s; +/-5 % noise on each point (alternating sign)
    alpha, beta = 50e-6, 1e-9
    sizes = [2**k for k in range(10, 25, 2)]
    times = [(alpha + beta * s) * (1.05 if i % 2 else 0.95) for i, s in enumerate(sizes)]
    a_rel, b_rel = E.fit_alpha_beta(sizes, times, relative=True)
    a_ols, b_ols = E.fit_alpha_beta(sizes, times)
    assert abs(a_rel / alpha - 1) < 0.1 and abs(b_rel / beta - 1) < 0.1
    assert abs(a_ols / alpha - 1) > 1  # the largest message's 5 % swamps alpha entirely
    # exact data: both fits are exact
    exact = [alpha + beta * s for s in sizes]
    for rel in (False, True):
        a, b = E.fit_alpha_beta(sizes, exact, relative=rel)
        assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)
    with pytest.raises(ValueError, match="times"):
        E.fit_alpha_beta([1, 2], [0.0, 1.0], relative=True)
