"""Unit 15's graded checks (solutions/15_context_parallelism.ipynb,
exercises/15_context_parallelism.ipynb).

1. ``check_merge``: the learner's merge of THREE partial attention results, some of whose
   queries see no key of a block (lse = -inf, out = 0: the case the lecture's two-part merge
   turns into NaN), graded on random masks (some with scores large enough that exp overflows
   float32) against masked attention over all the keys; the course's merge is out of reach;
2. ``check_ring_block``: the ring step whose causal mask was applied to the wrong block, fixed:
   a ring over 2, 3 and 4 ranks simulated in one process with the learner's step must equal
   causal attention on the full sequence;
3. ``check_llama_cp``: Llama 3 405B at a drawn context-parallel size and sequence length
   (the lecture prints cp 1 and 16 at 128K):
   activation bytes of one layer per GPU and bytes one GPU sends per layer with all-gather
   K/V, both ints, against ``estimate`` (whose context functions are out of reach);
4. ``check_ring_overlap`` (``checks_overlap``): the shortest context at which ring attention
   hides its K/V transfer, at drawn models, degrees and links.
Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function
on the drawn inputs and hands back what it returned (task 2: every block of every simulated rank,
unmerged: the course's merge is absent from the grade's sandbox); ``judge_X`` draws the same
inputs, computes the answer with the course's reference and prints one deterministic line or
raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.plain import learner_value, type_name
from course_lib.grading.split import need_list, split_check
from course_lib.units.u15_context_parallelism.checks_overlap import check_ring_overlap

__all__ = ["check_merge", "check_ring_block", "check_llama_cp", "check_ring_overlap"]

UNIT = "u15_context_parallelism"

MERGE_REFERENCES = ("course_lib.parallel.context.blocks:merge_attention",)
RING_REFERENCES = (
    "course_lib.parallel.context.ring:RingAttention.forward",
    "course_lib.parallel.context.ring:ring_attention",
)
SCALE_REFERENCES = (
    "course_lib.measure.estimate.context:cp_activation_bytes_per_layer",
    "course_lib.measure.estimate.context:cp_comm_bytes_per_layer",
)
RTOL, ATOL = 1e-5, 1e-5  # float32


def _close(task: int, what: str, got, want) -> None:
    import torch

    if not isinstance(got, torch.Tensor):
        fail(task, f"{what}: expected a tensor, got {type_name(got, short=True)}")
    if tuple(got.shape) != tuple(want.shape):
        fail(task, f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.allclose(got.float(), want.float(), rtol=RTOL, atol=ATOL):
        worst = float((got.float() - want.float()).abs().max())
        fail(task, f"{what} differs from attention over all keys by up to {worst:.3g}")


# ---- task 1 --------------------------------------------------------------------------------
MERGE_CASES = 6
NEG_INF = float("-inf")


def masked_part(q, k, v, hidden):
    """(out, lse) of queries q (B, H, m, D) over one block of keys with ``hidden`` (m, n) True
    where a key is masked out; a query that sees no key of the block gets lse = -inf, out = 0."""
    import math

    import torch

    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(hidden, NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(nan=0.0)  # a fully hidden row: 0
    return p @ v, lse


def _merge_cases(task: int):
    """(q, k, v, sizes, hidden) of each case: three key blocks of ``sizes``; ``hidden`` (m, n)
    masks random keys and hides whole blocks from some queries (the first two blocks from one,
    the last from another, all but the middle from a third); every query sees some key; the
    last two cases scale the scores by 40."""
    import torch

    from course_lib.grading.seeds import case_rng

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    for case in range(MERGE_CASES):
        scale = 40.0 if case >= 4 else 1.0
        m = int(torch.randint(4, 9, (1,), generator=g))
        sizes = [int(x) for x in torch.randint(2, 7, (3,), generator=g)]
        n = sum(sizes)
        hidden = torch.rand(m, n, generator=g) < 0.3
        a, b = sizes[0], sizes[0] + sizes[1]
        hidden[0, :b] = True  # query 0 sees only the last block
        hidden[1, b:] = True  # query 1 sees nothing of the last block
        hidden[2, :a] = True  # query 2 sees only the middle block
        hidden[2, b:] = True
        for i in range(m):  # every query sees some key, of a block it is meant to see
            if bool(hidden[i].all()):
                j = {0: b, 2: a}.get(i, 0)
                hidden[i, j] = False
        q = torch.randn(2, 3, m, 8, generator=g) * scale
        k = torch.randn(2, 3, n, 8, generator=g)
        v = torch.randn(2, 3, n, 8, generator=g)
        yield q, k, v, sizes, hidden


def _parts(q, k, v, sizes, hidden) -> list:
    out, start = [], 0
    for size in sizes:
        cut = slice(start, start + size)
        out.append(masked_part(q, k[:, :, cut], v[:, :, cut], hidden[:, cut]))
        start += size
    return out


def collect_merge(merge_all, task: int = 1) -> list[Any]:
    """Task: ``merge_all(parts) -> (out, lse)``: the attention over three disjoint key blocks
    from each block's (out (B, H, m, D), lse (B, H, m)); a query that sees no key of a block
    has lse = -inf and out = 0 there. Graded on 6 random cases, every one with queries hidden
    from whole blocks, two with scores scaled by 40 (lse near 100), float32."""
    return [
        learner_value(run_learner(task, merge_all, _parts(*c), forbid=MERGE_REFERENCES))
        for c in _merge_cases(task)
    ]


def judge_merge(data: Any, task: int = 1) -> None:
    for case, ((q, k, v, _sizes, hidden), got) in enumerate(
        zip(_merge_cases(task), need_list(task, data, MERGE_CASES, "merge"))
    ):
        if not isinstance(got, tuple) or len(got) != 2:
            fail(task, f"expected (out, lse), got {type_name(got, short=True)}")
        want_out, want_lse = masked_part(q, k, v, hidden)
        _close(task, f"case {case + 1}: out", got[0], want_out)
        _close(task, f"case {case + 1}: lse", got[1], want_lse)
    passed(
        task,
        "your merge equals masked attention over all keys on 6 random cases, queries hidden "
        f"from whole blocks and large scores included (rtol={RTOL}, atol={ATOL})",
    )


check_merge = split_check(collect_merge, judge_merge)


# ---- task 2 --------------------------------------------------------------------------------
RING_SIZES = (2, 3, 4)


def _ring_inputs(task: int):
    """(world size, q, k, v) of each simulated ring: the whole sequence, 4 tokens a rank."""
    import torch

    from course_lib.grading.seeds import case_rng

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    for w in RING_SIZES:
        q, k, v = (torch.randn(1, 2, 4 * w, 8, generator=g) for _ in range(3))
        yield w, q, k, v


def _ring_order(world_size: int, rank: int) -> list[int]:
    """The ranks whose K/V block ``rank`` sees, in ring order (its own first)."""
    return [(rank - i) % world_size for i in range(world_size)]


def collect_ring_block(step, task: int = 2) -> list[list[list[Any]]]:
    """Task: ``step(q, k, v, *, rank, src) -> (out, lse) or None``: causal attention of rank
    ``rank``'s queries (contiguous layout) over the K/V block that came from rank ``src``
    (None for a block the mask hides entirely). Graded by running a ring of 2, 3 and 4 ranks
    with it in one process: the merged outputs must equal causal attention on the whole
    sequence (float32)."""
    out = []
    for w, q, k, v in _ring_inputs(task):
        qs, ks, vs = (t.chunk(w, dim=2) for t in (q, k, v))
        out.append(
            [
                [
                    learner_value(
                        run_learner(
                            task,
                            step,
                            qs[r],
                            ks[src],
                            vs[src],
                            rank=r,
                            src=src,
                            forbid=RING_REFERENCES,
                        )
                    )
                    for src in _ring_order(w, r)
                ]
                for r in range(w)
            ]
        )
    return out


def _merged_ring(task: int, world_size: int, blocks: Any):
    """Every rank's blocks (``blocks[rank][i]``, ring order) merged by the course's rule, the
    ranks' outputs concatenated along the sequence; a ✗ verdict for a malformed block."""
    import torch

    from course_lib.parallel.context.blocks import merge_attention

    ranks = need_list(task, blocks, world_size, f"blocks of a {world_size}-rank ring")
    outs = []
    for r, parts in enumerate(ranks):
        acc = None
        for src, part in zip(
            _ring_order(world_size, r), need_list(task, parts, world_size, "block")
        ):
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


def judge_ring_block(data: Any, task: int = 2) -> None:
    import torch.nn.functional as F

    rings = need_list(task, data, len(RING_SIZES), "ring")
    for (w, q, k, v), blocks in zip(_ring_inputs(task), rings):
        _close(
            task,
            f"{w} ranks: the output",
            _merged_ring(task, w, blocks),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
        )
    passed(task, "your ring step gives causal attention on 2, 3 and 4 simulated ranks")


check_ring_block = split_check(collect_ring_block, judge_ring_block)


# ---- task 3 --------------------------------------------------------------------------------
#: (cp, tokens per sequence) task 3 draws from: never the lecture's cp 1 or 16
LLAMA_PLANS = tuple((cp, seq) for cp in (2, 4, 8, 32) for seq in (2**15, 2**16, 2**17, 2**18))


def _llama_plan(task: int) -> tuple[int, int]:
    from course_lib.grading.seeds import case_rng

    return case_rng(task, UNIT).choice(LLAMA_PLANS)


def collect_llama_cp(fn, task: int = 3) -> Any:
    """Task: ``fn(cp, seq) -> (activation_bytes, sent_bytes)`` for one Llama 3 405B layer
    (width 16,384, 128 heads, 8 key/value heads, SwiGLU FFN 53,248) on sequences of ``seq``
    tokens (one sequence per micro-batch, bf16), tp 8 with sequence parallelism, context
    parallelism ``cp``: the activation bytes one GPU keeps with FlashAttention (no score
    matrix, no dropout), and the bytes one GPU sends per layer, forward + backward, with
    all-gather K/V. Two ints, for a (cp, seq) drawn from the grading seed."""
    cp, seq = _llama_plan(task)
    return {"answer": learner_value(run_learner(task, fn, cp, seq, forbid=SCALE_REFERENCES))}


def judge_llama_cp(data: Any, task: int = 3) -> None:
    from course_lib.measure import estimate

    if not isinstance(data, dict) or "answer" not in data:
        fail(task, "the run handed back no answer")
    cp, seq = _llama_plan(task)
    where = f"cp {cp}, {seq // 1024}K tokens: "
    got = data["answer"]
    if not isinstance(got, tuple) or len(got) != 2:
        fail(task, f"{where}expected (activation_bytes, sent_bytes), got {got!r}")
    act = expect_int(task, "activation_bytes", got[0])
    sent = expect_int(task, "sent_bytes", got[1])
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


check_llama_cp = split_check(collect_llama_cp, judge_llama_cp)
