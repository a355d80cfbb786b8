"""Unit 15's graded checks (solutions/15_context_parallelism.ipynb,
exercises/15_context_parallelism.ipynb).

1. ``check_merge``: the learner's online-softmax merge of two partial attention results,
   graded on random blocks (some with scores large enough that exp overflows float32) against
   attention over all the keys; the course's ``merge_attention`` is out of reach;
2. ``check_ring_block``: the ring step whose causal mask was applied to the wrong block, fixed:
   a ring over 2, 3 and 4 ranks simulated in one process with the learner's step must equal
   causal attention on the full sequence;
3. ``check_llama_cp``: Llama 3 405B at a drawn context-parallel size and sequence length
   (the lecture prints cp 1 and 16 at 128K):
   activation bytes of one layer per GPU and bytes one GPU sends per layer with all-gather
   K/V, both ints, against ``estimate`` (whose context functions are out of reach).
Each check prints one deterministic line or raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner

__all__ = ["check_merge", "check_ring_block", "check_llama_cp"]

UNIT = "u15_context_parallelism"

MERGE_REFERENCES = ("course_lib.parallel.context_blocks:merge_attention",)
RING_REFERENCES = (
    "course_lib.parallel.context_ring:RingAttention.forward",
    "course_lib.parallel.context_ring:ring_attention",
)
SCALE_REFERENCES = (
    "course_lib.measure.estimate.context:cp_activation_bytes_per_layer",
    "course_lib.measure.estimate.context:cp_comm_bytes_per_layer",
)
RTOL, ATOL = 1e-5, 1e-5  # float32


def _close(task: int, what: str, got, want) -> None:
    import torch

    if not isinstance(got, torch.Tensor):
        fail(task, f"{what}: expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        fail(task, f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.allclose(got.float(), want.float(), rtol=RTOL, atol=ATOL):
        worst = float((got.float() - want.float()).abs().max())
        fail(task, f"{what} differs from attention over all keys by up to {worst:.3g}")


# ---- task 1 --------------------------------------------------------------------------------
def check_merge(merge, task: int = 1) -> None:
    """Task: ``merge(out_a, lse_a, out_b, lse_b) -> (out, lse)``: attention over two disjoint
    key sets, each given as its output (B, H, m, D) and log-sum-exp (B, H, m), combined into
    the attention over their union. Graded on 6 random splits, two with scores scaled by 40
    (log-sum-exps near 100: exp overflows float32), float32."""
    import torch

    from course_lib.grading.seeds import case_rng
    from course_lib.parallel.context_blocks import attention_block

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    for case in range(6):
        scale = 40.0 if case >= 4 else 1.0
        m, na, nb = (int(x) for x in torch.randint(2, 9, (3,), generator=g))
        q = torch.randn(2, 3, m, 8, generator=g) * scale
        k = torch.randn(2, 3, na + nb, 8, generator=g)
        v = torch.randn(2, 3, na + nb, 8, generator=g)
        a = attention_block(q, k[:, :, :na], v[:, :, :na])
        b = attention_block(q, k[:, :, na:], v[:, :, na:])
        got = run_learner(task, merge, *a, *b, forbid=MERGE_REFERENCES)
        if not isinstance(got, tuple) or len(got) != 2:
            fail(task, f"expected (out, lse), got {type(got).__name__}")
        want_out, want_lse = attention_block(q, k, v)
        _close(task, f"case {case + 1}: out", got[0], want_out)
        _close(task, f"case {case + 1}: lse", got[1], want_lse)
    passed(
        task,
        "your merge equals attention over all keys on 6 random splits, large scores included "
        f"(rtol={RTOL}, atol={ATOL})",
    )


# ---- task 2 --------------------------------------------------------------------------------
def _simulated_ring(step, world_size: int, q, k, v, task: int):
    """Every rank's queries over every rank's K/V block, in ring order, merged by the
    course's rule; the learner's ``step(q, k, v, rank=, src=)`` gives (out, lse) or None."""
    import torch

    from course_lib.parallel.context_blocks import merge_attention

    qs, ks, vs = (t.chunk(world_size, dim=2) for t in (q, k, v))
    outs = []
    for r in range(world_size):
        acc = None
        for i in range(world_size):
            src = (r - i) % world_size
            part = run_learner(
                task, step, qs[r], ks[src], vs[src], rank=r, src=src, forbid=RING_REFERENCES
            )
            if part is None:
                continue
            if not (
                isinstance(part, tuple)
                and len(part) == 2
                and all(isinstance(t, torch.Tensor) for t in part)
            ):
                fail(task, f"rank {r}, block of rank {src}: expected None or (out, lse) tensors")
            acc = part if acc is None else merge_attention(*acc, *part)
        if acc is None:
            fail(task, f"rank {r} of {world_size} computed no block at all")
        outs.append(acc[0])
    return torch.cat(outs, dim=2)


def check_ring_block(step, task: int = 2) -> None:
    """Task: ``step(q, k, v, *, rank, src) -> (out, lse) or None``: causal attention of rank
    ``rank``'s queries (contiguous layout) over the K/V block that came from rank ``src``
    (None for a block the mask hides entirely). Graded by running a ring of 2, 3 and 4 ranks
    with it in one process: the merged outputs must equal causal attention on the whole
    sequence (float32)."""
    import torch
    import torch.nn.functional as F

    from course_lib.grading.seeds import case_rng

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    for w in (2, 3, 4):
        q, k, v = (torch.randn(1, 2, 4 * w, 8, generator=g) for _ in range(3))
        got = _simulated_ring(step, w, q, k, v, task)
        _close(
            task,
            f"{w} ranks: the output",
            got,
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
        )
    passed(task, "your ring step gives causal attention on 2, 3 and 4 simulated ranks")


# ---- task 3 --------------------------------------------------------------------------------
#: (cp, tokens per sequence) task 3 draws from: never the lecture's cp 1 or 16
LLAMA_PLANS = tuple((cp, seq) for cp in (2, 4, 8, 32) for seq in (2**15, 2**16, 2**17, 2**18))


def check_llama_cp(fn, task: int = 3) -> None:
    """Task: ``fn(cp, seq) -> (activation_bytes, sent_bytes)`` for one Llama 3 405B layer
    (width 16,384, 128 heads, 8 key/value heads, SwiGLU FFN 53,248) on sequences of ``seq``
    tokens (one sequence per micro-batch, bf16), tp 8 with sequence parallelism, context
    parallelism ``cp``: the activation bytes one GPU keeps with FlashAttention (no score
    matrix, no dropout), and the bytes one GPU sends per layer, forward + backward, with
    all-gather K/V. Two ints, for a (cp, seq) drawn from the grading seed."""
    from course_lib.grading.seeds import case_rng

    cp, seq = case_rng(task, UNIT).choice(LLAMA_PLANS)
    where = f"cp {cp}, {seq // 1024}K tokens: "
    got = run_learner(task, fn, cp, seq, forbid=SCALE_REFERENCES)
    if not isinstance(got, tuple) or len(got) != 2:
        fail(task, f"{where}expected (activation_bytes, sent_bytes), got {got!r}")
    act = expect_int(task, "activation_bytes", got[0])
    sent = expect_int(task, "sent_bytes", got[1])
    from course_lib.measure import estimate

    shape: dict[str, Any] = dict(kv_heads=8, tp=8)
    want_act = estimate.cp_activation_bytes_per_layer(
        seq, 1, 16384, 128, cp=cp, ffn=53248, gated_mlp=True, sequence_parallel=True, **shape
    )
    want_sent = estimate.cp_comm_bytes_per_layer(
        seq, 1, 16384, 128, cp, method="allgather", **shape
    )["sent"]
    for what, value, want in (("activation_bytes", act, want_act), ("sent_bytes", sent, want_sent)):
        if value != want:
            fail(task, f"{where}{what} = {value:,}: too {'large' if value > want else 'small'}")
    passed(
        task,
        "Llama 3 405B, tp 8, at a drawn cp and length: activation and all-gather bytes per GPU",
    )
