"""Context parallelism: bytes each rank sends per attention layer for ring attention,
all-gather K/V and Ulysses; activation bytes per rank with the sequence split over ``cp``
ranks; the causal attention work of each rank under a layout.

Introduced in notebooks/15_context_parallelism.ipynb. Sources: Liu et al. 2023, "Ring
Attention" (arXiv:2310.01889); Brandon et al. 2023, "Striped Attention" (arXiv:2311.09431);
Jacobs et al. 2023, "DeepSpeed Ulysses" (arXiv:2309.14509); Llama Team 2024, "The Llama 3 Herd
of Models" (arXiv:2407.21783), Sec. 3.3.2; Korthikanti et al. 2022 (arXiv:2205.05198), Eq. 1-3.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal

from course_lib import validate as _v
from course_lib.measure.estimate.activations import activation_bytes_transformer_layer
from course_lib.measure.estimate.units import exact

__all__ = [
    "CpMethod",
    "CP_METHODS",
    "CpLayout",
    "CP_LAYOUTS",
    "cp_collectives_per_layer",
    "cp_comm_bytes_per_layer",
    "cp_activation_bytes_per_layer",
    "cp_attention_work",
    "attention_saved_bytes",
]

#: how attention gets the keys of the other ranks
CpMethod = Literal["ring", "allgather", "ulysses"]
CP_METHODS: tuple[CpMethod, ...] = ("ring", "allgather", "ulysses")
#: how the tokens are laid out over the ranks
CpLayout = Literal["contiguous", "zigzag"]
CP_LAYOUTS: tuple[CpLayout, ...] = ("contiguous", "zigzag")


def cp_collectives_per_layer(cp: int, *, method: CpMethod = "ring") -> dict[str, dict[str, int]]:
    """Communication calls one rank makes per attention layer and step, as
    ``parallel.context`` makes them, ``{"forward": {op: n}, "backward": {op: n}}``.

    * ring: each step sends the stacked K/V to the next rank and receives from the previous
      one: cp - 1 ``isend`` (and as many ``irecv``) in forward; backward sends K/V cp - 1
      times and the dK/dV accumulators cp times;
    * allgather: one ``all_gather`` of K/V forward, one ``all_to_all`` of dK/dV backward
      (a reduce-scatter written as a direct exchange plus a local sum);
    * ulysses: ``all_to_all`` of q, of K/V together, and of the output back (3 forward; the
      same three reversed in backward).
    One rank alone (cp = 1) makes no calls."""
    c = _v.count("cp", cp, minimum=1)
    m = _v.choice("method", method, CP_METHODS)
    if c == 1:
        return {"forward": {}, "backward": {}}
    if m == "ring":
        return {
            "forward": {"isend": c - 1, "irecv": c - 1},
            "backward": {"isend": 2 * c - 1, "irecv": 2 * c - 1},
        }
    if m == "allgather":
        return {"forward": {"all_gather": 1}, "backward": {"all_to_all": 1}}
    return {"forward": {"all_to_all": 3}, "backward": {"all_to_all": 3}}


def cp_comm_bytes_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    cp: int,
    *,
    kv_heads: int | None = None,
    tp: int = 1,
    method: CpMethod = "ring",
    dtype_bytes: int = 2,
) -> dict[str, Any]:
    """Bytes one rank sends for one attention layer's forward and backward, with the sequence
    of ``seq`` tokens split over ``cp`` ranks (and the heads over ``tp``: context parallelism
    inside each tensor-parallel rank's heads).

    With n = seq / cp local tokens, d = hidden / heads, p = ``dtype_bytes``:
    ``kv_shard`` = 2 b n (kv_heads / tp) d p (this rank's K and V), ``q_shard`` = b n (heads /
    tp) d p.

    * ring: forward (cp-1) kv_shard; backward (cp-1) kv_shard + cp kv_shard (the dK/dV
      accumulators travel one step more, home) -- every rank sends the same;
    * allgather: forward (cp-1) kv_shard (all-gather); backward (cp-1) kv_shard (reduce-scatter:
      the cp-1 chunks of the gathered dK/dV other ranks own);
    * ulysses: each all-to-all sends (cp-1)/cp of its tensor: forward (cp-1)/cp (2 q_shard +
      kv_shard) (q, K/V, output), backward the same. Needs heads/tp and kv_heads/tp divisible
      by cp.

    Returns ``{"kv_shard", "q_shard", "calls", "sent_forward", "sent_backward", "sent"}``
    (bytes, ints: every division above comes out even)."""
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    g = a if kv_heads is None else _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    c, t = _v.count("cp", cp, minimum=1), _v.count("tp", tp, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    m = _v.choice("method", method, CP_METHODS)
    for name, value, by in (("seq", s, c), ("hidden", h, a), ("heads", a, t), ("kv_heads", g, t)):
        if value % by:
            raise ValueError(f"{name} = {value}: expected a multiple of {by}")
    if m == "ulysses" and (a // t % c or g // t % c):
        raise ValueError(
            f"cp = {c}: expected a divisor of the heads per tensor-parallel rank "
            f"({a // t} query, {g // t} key/value heads): Ulysses gives every rank whole heads"
        )
    n, d = s // c, h // a
    kv, q = 2 * b * n * (g // t) * d * p, b * n * (a // t) * d * p
    if m == "ring":
        fwd, bwd = (c - 1) * kv, ((c - 1) + (c if c > 1 else 0)) * kv
    elif m == "allgather":
        fwd = bwd = (c - 1) * kv
    else:
        fwd = bwd = (c - 1) * (2 * q + kv) // c
    return {
        "kv_shard": kv,
        "q_shard": q,
        "calls": cp_collectives_per_layer(c, method=m),
        "sent_forward": fwd,
        "sent_backward": bwd,
        "sent": fwd + bwd,
    }


def cp_activation_bytes_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    *,
    cp: int = 1,
    kv_heads: int | None = None,
    ffn: int | None = None,
    gated_mlp: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype_bytes: int = 2,
    dropout: bool = False,
    flash: bool = True,
    method: CpMethod = "ring",
) -> int | float:
    """Activation bytes one rank keeps for one transformer layer with ``seq`` tokens split over
    ``cp`` ranks: :func:`activation_bytes_transformer_layer` of the rank's seq/cp tokens, with
    the attention core as follows.

    * ``flash=True`` (FlashAttention, or the blockwise attention of ring): no score matrix is
      kept (Korthikanti's "selective" core); the all-gather method also keeps the gathered K/V
      of the other ranks for backward, (cp-1)/cp x 2 (kv_heads/heads) s b h p / tp bytes.
    * ``flash=False``: the local queries' softmax (and its dropout) over ALL s keys:
      5 a (s/cp) s b / tp with 16-bit values and dropout (Eq. 1's term, one factor s divided by
      cp, not both). Ulysses keeps all s queries of a/cp heads: the same bytes.

    Bytes: int when exact, else float."""
    s, c = _v.count("seq", seq, minimum=1), _v.count("cp", cp, minimum=1)
    m = _v.choice("method", method, CP_METHODS)
    if s % c:
        raise ValueError(f"seq = {s}: expected a multiple of cp = {c}")
    b, h = _v.count("batch", batch, minimum=1), _v.count("hidden", hidden, minimum=1)
    a, t = _v.count("heads", heads, minimum=1), _v.count("tp", tp, minimum=1)
    g = a if kv_heads is None else _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    n = s // c
    layer = activation_bytes_transformer_layer(
        n,
        b,
        h,
        a,
        kv_heads=g,
        ffn=ffn,
        gated_mlp=gated_mlp,
        tp=t,
        sequence_parallel=sequence_parallel,
        dtype_bytes=p,
        dropout=dropout,
        recompute="selective",
    )
    extra = Fraction(0)
    if flash and m == "allgather":
        extra = Fraction((c - 1) * 2 * g * n * b * h * p, a * t)
    elif not flash:
        extra = Fraction((2 * p + 1 if dropout else p) * a * n * s * b, t)
    return exact(Fraction(layer) + extra)


def cp_attention_work(
    cp: int, *, rank: int, layout: CpLayout = "zigzag", causal: bool = True
) -> dict[str, int | Fraction]:
    """The causal attention work of ``rank`` when a sequence is split over ``cp`` ranks and
    blocks the mask hides entirely are skipped (``parallel.context.ring_attention``):
    ``blocks`` (query-chunk x key-chunk products computed; a chunk is s/cp tokens contiguous,
    s/(2cp) zigzag), ``share`` (their score entries as a fraction of s^2, a Fraction; a
    diagonal block is computed whole and masked). Contiguous: rank r computes r + 1 blocks;
    zigzag: every rank 2 cp + 1 half-size blocks. Without ``causal``: cp or 4 cp blocks."""
    c = _v.count("cp", cp, minimum=1)
    r = _v.count("rank", rank, minimum=0, maximum=c - 1)
    lay = _v.choice("layout", layout, CP_LAYOUTS)
    if lay == "contiguous":
        blocks, size = (r + 1 if causal else c), Fraction(1, c * c)
    else:
        blocks, size = (2 * c + 1 if causal else 4 * c), Fraction(1, 4 * c * c)
    return {"blocks": blocks, "share": blocks * size}


def attention_saved_bytes(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    *,
    cp: int = 1,
    kv_heads: int | None = None,
    dtype_bytes: int = 4,
    blockwise: bool = True,
    causal: bool = True,
) -> int:
    """Bytes autograd keeps for the backward of ONE attention call on one rank, as the course
    computes it (``parallel.context``), with ``seq`` tokens split over ``cp`` ranks.

    * ``blockwise=True`` (``ring_attention``): this rank's q and output (b n a d values each),
      k and v (b n g d each) and the log-sum-exp (b n a), n = seq / cp: linear in n, no score
      matrix, since backward recomputes each block's probabilities from the lse;
    * ``blockwise=False`` (attention written out on one process, ``attention_block`` under
      autograd, cp = 1, g = a): q, k, v; the masked scores (kept by logsumexp) and the
      probabilities (kept by exp and by the product with v), b a s^2 values each; the lse; and
      with ``causal`` the 1-byte mask, s^2.
    """
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    g = a if kv_heads is None else _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    c, p = _v.count("cp", cp, minimum=1), _v.count("dtype_bytes", dtype_bytes, minimum=1)
    if h % a or s % c:
        raise ValueError(f"hidden, seq = {h}, {s}: expected multiples of heads ({a}), cp ({c})")
    d, n = h // a, s // c
    if blockwise:
        return p * (2 * b * n * a * d + 2 * b * n * g * d + b * n * a)
    if c != 1 or g != a:
        raise ValueError(
            f"cp, kv_heads = {c}, {g}: expected 1 and {a} (attention written out: one process)"
        )
    return p * (3 * b * s * a * d + 2 * b * a * s * s + b * a * s) + (s * s if causal else 0)
