"""Tensor (and sequence) parallelism: parameters and communication per rank (activations:
``activation_bytes_transformer_layer`` and ``activation_bytes_gpt`` take ``tp``).

Introduced in notebooks/11_tensor_parallelism.ipynb. Sources: Shoeybi et al. 2019, "Megatron-LM"
(arXiv:1909.08053), Sec. 3; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), Sec. 4.2, Eqs. 1-4.
"""

from __future__ import annotations

from typing import Any

from course_lib import validate as _v
from course_lib.measure.estimate.activations import RECOMPUTE, Recompute
from course_lib.measure.estimate.planning import transformer_param_count
from course_lib.shape import ModelShape

__all__ = [
    "tp_params_per_rank",
    "tp_collectives_per_layer",
    "tp_comm_bytes_per_layer",
    "tp_payload_bytes_per_layer",
    "tp_layer_state_bytes",
]


def _shape(config: Any) -> ModelShape:
    """``config`` as a shape: a ModelShape as it is, a GPTConfig or LlamaConfig by ``.shape()``,
    and any object with a Llama config's field names (``n_embd``, ``n_head``, ``n_kv_head``,
    ``ffn_hidden``, ``n_layer``, ``vocab_size``) as the Llama layer they describe."""
    if isinstance(config, ModelShape):
        return config
    if callable(getattr(config, "shape", None)):
        return _shape(config.shape())
    if all(hasattr(config, f) for f in ("n_embd", "n_head", "ffn_hidden", "n_layer", "vocab_size")):
        h, a = config.n_embd, config.n_head
        kv, f = getattr(config, "n_kv_head", a), config.ffn_hidden
        return ModelShape("config", config.n_layer, h, a, kv, f, config.vocab_size, seq=1)
    raise TypeError(
        f"config = {_v.describe(config)}: expected a ModelShape, GPTConfig or LlamaConfig"
    )


def _layer_params(config: Any) -> tuple[int, int]:
    """(sharded, replicated) parameters of one block of ``config``: the block's count
    (``transformer_param_count``) less what stays whole on every rank, the two norms and the
    row layers' biases (attention output, MLP down)."""
    shape = _shape(config)
    per_layer = transformer_param_count(**shape.dense())["per_layer"]
    norm = 2 * shape.hidden if shape.norm == "layernorm" and shape.bias else shape.hidden
    replicated = 2 * norm + (2 * shape.hidden if shape.bias else 0)
    return per_layer - replicated, replicated


def tp_params_per_rank(config: Any, tp: int = 1) -> dict[str, int]:
    """Parameters on one rank when ``config``'s blocks are split over ``tp`` ranks: ``sharded``
    (the weights of the column and row layers: qkv, attention output, MLP; and the column layers'
    biases), ``replicated`` (LayerNorms / RMSNorms, the row layers' biases, and the embeddings and
    head: replicated for a GPTConfig, as in ``parallelize_gpt``; split over the vocabulary for
    a LlamaConfig, as Megatron does at scale), and ``per_rank`` = sharded/t + replicated."""
    t = _v.count("tp", tp, minimum=1)
    C, L, V = config.n_embd, config.n_layer, config.vocab_size
    layer_sharded, layer_replicated = _layer_params(config)
    if hasattr(config, "ffn_hidden"):
        sharded, replicated = L * layer_sharded + 2 * V * C, L * layer_replicated + C
    else:
        ln = 2 * C if config.bias else C
        sharded = L * layer_sharded
        replicated = (
            L * layer_replicated
            + ln
            + (V + config.block_size) * C
            + (0 if config.tie_weights else V * C)
        )
    if sharded % t:
        raise ValueError(f"tp = {t}: expected a divisor of the sharded parameters ({sharded})")
    return {"sharded": sharded, "replicated": replicated, "per_rank": sharded // t + replicated}


def tp_collectives_per_layer(*, sequence_parallel: bool = False) -> dict[str, dict[str, int]]:
    """Collective calls per transformer layer and training step, ``{"forward": {op: n},
    "backward": {op: n}}``. Tensor parallelism (Shoeybi et al. 2019, Sec. 3): g after attention
    and after the MLP (2 all-reduces forward), f before each (2 backward). Sequence parallelism
    as ``parallel.tensor`` does it: each all-reduce of forward becomes an all-gather (before
    the column layer) and a reduce-scatter (after the row layer); backward reduce-scatters the
    column layers' input gradients, all-gathers the row layers' output gradients, and gathers
    the column layers' inputs again (Korthikanti et al. save only the local chunk): 4 all-gathers
    and 2 reduce-scatters. The gradient all-reduce of the LayerNorms is once per step, not per
    layer."""
    if sequence_parallel:
        return {
            "forward": {"all_gather": 2, "reduce_scatter": 2},
            "backward": {"all_gather": 4, "reduce_scatter": 2},
        }
    return {"forward": {"all_reduce": 2}, "backward": {"all_reduce": 2}}


def tp_comm_bytes_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    tp: int,
    *,
    dtype_bytes: int = 2,
    sequence_parallel: bool = False,
    recompute: Recompute = "none",
) -> dict[str, Any]:
    """Bytes per transformer layer and step: ``payload`` (one all-reduce's tensor, s b h p),
    ``payloads`` (the summed payloads of the layer's all-reduces: 4, 6 with ``full``
    recomputation, which runs the forward's two again; sequence parallelism moves the same
    total as all-gathers and reduce-scatters, Korthikanti et al. Sec. 4.2.2), and what one rank
    sends with the ring algorithms (``estimate.collective_bytes_sent``): ``sent_forward``,
    ``sent_backward`` (the recomputed forward's collectives included), ``sent`` (their sum).
    Tensor parallel: 4 all-reduces of 2(t-1)/t payload each. Sequence parallel: every all-gather
    and reduce-scatter of the (B, T, C) tensor sends (t-1)/t payload (so forward sends what
    tensor parallelism sends; backward sends 1.5 times as much, for the gathers done again)."""
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, t = _v.count("hidden", hidden, minimum=1), _v.count("tp", tp, minimum=1)
    payload = s * b * h * _v.count("dtype_bytes", dtype_bytes, minimum=1)
    rec = _v.choice("recompute", recompute, RECOMPUTE, case_insensitive=True)
    calls = tp_collectives_per_layer(sequence_parallel=sequence_parallel)
    if rec == "full":  # backward runs the forward again, its collectives with it
        back = dict(calls["backward"])
        for op, n in calls["forward"].items():
            back[op] = back.get(op, 0) + n
        calls = {"forward": calls["forward"], "backward": back}
    unit = {"all_reduce": 2 * (t - 1), "all_gather": t - 1, "reduce_scatter": t - 1}  # x S/t
    sent = {
        phase: sum(n * unit[op] * payload for op, n in ops.items()) for phase, ops in calls.items()
    }
    out: dict[str, Any] = {"payload": payload, "payloads": (6 if rec == "full" else 4) * payload}
    out["calls"] = calls
    for phase in ("forward", "backward"):
        out[f"sent_{phase}"] = sent[phase] // t if sent[phase] % t == 0 else sent[phase] / t
    out["sent"] = out["sent_forward"] + out["sent_backward"]
    return out


def tp_payload_bytes_per_layer(
    seq: int, batch: int, hidden: int, *, recompute: Recompute = "none", dtype_bytes: int = 2
) -> int:
    """The summed payloads of one layer's tensor-parallel all-reduces per micro-batch (4 of
    s b h values, 6 with ``full`` recomputation): the old name, kept one release, of
    ``tp_comm_bytes_per_layer(seq, batch, hidden, tp, recompute=...)["payloads"]`` (Shoeybi et
    al. 2019, arXiv:1909.08053; pass each payload's size to an all-reduce time model)."""
    out = tp_comm_bytes_per_layer(
        seq, batch, hidden, 1, recompute=recompute, dtype_bytes=dtype_bytes
    )
    return int(out["payloads"])


def tp_layer_state_bytes(config: Any, tp: int = 1, *, bytes_per_param: int = 16) -> dict[str, int]:
    """Model state of ONE transformer layer on one rank: its split weights / ``tp`` plus its
    replicated norms (and biases), times ``bytes_per_param`` (16: bf16 weights and gradients,
    fp32 master weights and two Adam moments, Rajbhandari et al. 2020). Returns
    ``{"params": parameters on the rank, "bytes": params x bytes_per_param}``."""
    t = _v.count("tp", tp, minimum=1)
    k = _v.count("bytes_per_param", bytes_per_param, minimum=1)
    sharded, replicated = _layer_params(config)
    if sharded % t:
        raise ValueError(
            f"tp = {t}: expected a divisor of the layer's sharded parameters ({sharded})"
        )
    params = sharded // t + replicated
    return {"params": params, "bytes": params * k}
