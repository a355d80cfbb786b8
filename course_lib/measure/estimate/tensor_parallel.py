"""Tensor (and sequence) parallelism: activation memory, parameters and communication per rank.

Introduced in notebooks/11_tensor_parallelism.ipynb. Sources: Shoeybi et al. 2019, "Megatron-LM"
(arXiv:1909.08053), Sec. 3; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), Sec. 4.2, Eqs. 1-4.
"""

from __future__ import annotations

from typing import Any

from course_lib import validate as _v

__all__ = [
    "tp_activation_bytes_layer",
    "tp_activation_bytes_gpt",
    "tp_params_per_rank",
    "tp_collectives_per_layer",
    "tp_comm_bytes_per_layer",
    "tp_layer_state_bytes",
]


def tp_activation_bytes_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    *,
    sequence_parallel: bool = False,
    bytes_per_value: int = 2,
    dropout: bool = True,
    layernorm_stats: bool = False,
) -> int:
    """Activation bytes one rank keeps for one transformer layer split over ``tp`` ranks.

    Korthikanti et al. 2022, with 16-bit values and 1-byte dropout masks (the defaults):
    ``tp = 1``: ``sbh (34 + 5as/h)`` (Eq. 1); tensor parallel: ``sbh (10 + 24/t + 5as/(ht))``
    (Eq. 2); with sequence parallelism: ``sbh (34/t + 5as/(ht))`` (Eq. 3). By part, in values
    (``p = bytes_per_value``):

    * outside the parallel regions, on every rank unless ``sequence_parallel`` divides them by
      t: the two LayerNorm inputs and the two LayerNorm outputs (the attention and MLP inputs),
      4 sbh values, plus the two residual-dropout masks (2 sbh bytes);
    * inside (split by t): Q, K, V, the output projection's input, the MLP's first output and
      the GeLU output: 12 sbh values;
    * the attention core (split by t): the softmax output (a s^2 b values), its dropout mask
      (a s^2 b bytes) and the dropout output (a s^2 b values).

    ``dropout=False`` (the course's tiny GPT) drops the masks and the dropout output.
    ``layernorm_stats``: also count the mean and rstd of the two LayerNorms (4 sb values in
    float32, which the paper leaves out; the tiny GPT stores them). Exact int bytes; ``seq`` and
    ``heads`` need not divide by ``tp`` here (the model check does that)."""
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    t = _v.count("tp", tp, minimum=1)
    p = _v.count("bytes_per_value", bytes_per_value, minimum=1)
    sbh, as2b = s * b * h, a * s * s * b
    outside = 4 * p * sbh + (2 * sbh if dropout else 0) + (4 * 4 * s * b if layernorm_stats else 0)
    inside = 12 * p * sbh
    core = (2 * p + 1) * as2b if dropout else p * as2b
    total_x_t = (outside if sequence_parallel else t * outside) + inside + core
    return total_x_t // t if total_x_t % t == 0 else total_x_t / t


def tp_activation_bytes_gpt(
    config: Any,
    batch: int,
    seq: int | None = None,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype_bytes: int = 4,
    include_logits: bool = True,
) -> int:
    """Bytes one rank's autograd keeps after the forward of the tiny GPT split by
    ``parallel.tensor.parallelize_gpt`` over ``tp`` ranks (fp32, no dropout): per layer
    :func:`tp_activation_bytes_layer` with ``dropout=False, layernorm_stats=True``, plus the
    replicated ln_f (input, output, stats: 2 BTC + 2 BT values; with sequence parallelism the
    stream is gathered before it) and the logits B T V (the replicated head). At ``tp = 1`` it
    equals ``estimate.activation_bytes_gpt``."""
    for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
        if not hasattr(config, k):
            raise TypeError(
                f"config = {type(config).__name__}: expected a course_lib.models.GPTConfig"
            )
    B = _v.count("batch", batch, minimum=1)
    T = config.block_size if seq is None else _v.count("seq", seq, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    C = config.n_embd
    layer = tp_activation_bytes_layer(
        T,
        B,
        C,
        config.n_head,
        tp,
        bytes_per_value=p,
        sequence_parallel=sequence_parallel,
        dropout=False,
        layernorm_stats=False,
    )
    # mean and rstd of the two LayerNorms, in the model's dtype; split along T with SP
    stats = p * 4 * B * T // (tp if sequence_parallel else 1)
    head = p * (2 * B * T * C + 2 * B * T + (B * T * config.vocab_size if include_logits else 0))
    return config.n_layer * (layer + stats) + head


def _layer_params(config: Any) -> tuple[int, int]:
    """(sharded, replicated) parameters of one block of ``config``."""
    C = config.n_embd
    if hasattr(config, "ffn_hidden"):  # Llama: q, k, v, o; SwiGLU w1, w2, w3; two RMSNorms
        kv = C // config.n_head * getattr(config, "n_kv_head", config.n_head)  # k, v width
        return 2 * C * C + 2 * C * kv + 3 * C * config.ffn_hidden, 2 * C
    bias = 1 if config.bias else 0  # GPT: qkv, proj, fc, proj; column biases split
    ln = 2 * C if config.bias else C
    return 12 * C * C + bias * 7 * C, 2 * ln + bias * 2 * C  # row biases replicated


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
        raise ValueError(f"tp = {t}: the sharded parameters ({sharded}) do not divide evenly")
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
    bytes_per_value: int = 2,
    sequence_parallel: bool = False,
) -> dict:
    """Bytes per transformer layer and step: ``payload`` (one all-reduce's tensor, s b h p),
    and what one rank sends with the ring algorithms (``estimate.collective_bytes_sent``):
    ``sent_forward``, ``sent_backward``, ``sent`` (their sum). Tensor parallel: 4 all-reduces
    of 2(t-1)/t payload each. Sequence parallel: every all-gather and reduce-scatter of the
    (B, T, C) tensor sends (t-1)/t payload (so forward sends what tensor parallelism sends;
    backward sends 1.5 times as much, for the gathers done again)."""
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, t = _v.count("hidden", hidden, minimum=1), _v.count("tp", tp, minimum=1)
    payload = s * b * h * _v.count("bytes_per_value", bytes_per_value, minimum=1)
    calls = tp_collectives_per_layer(sequence_parallel=sequence_parallel)
    unit = {"all_reduce": 2 * (t - 1), "all_gather": t - 1, "reduce_scatter": t - 1}  # x S/t
    sent = {
        phase: sum(n * unit[op] * payload for op, n in ops.items()) for phase, ops in calls.items()
    }
    out = {"payload": payload, "calls": calls}
    for phase in ("forward", "backward"):
        out[f"sent_{phase}"] = sent[phase] // t if sent[phase] % t == 0 else sent[phase] / t
    out["sent"] = out["sent_forward"] + out["sent_backward"]
    return out


def tp_layer_state_bytes(config: Any, tp: int = 1, *, bytes_per_param: int = 16) -> dict:
    """Model state of ONE transformer layer on one rank: its split weights / ``tp`` plus its
    replicated norms (and biases), times ``bytes_per_param`` (16: bf16 weights and gradients,
    fp32 master weights and two Adam moments, Rajbhandari et al. 2020). Returns
    ``{"params": parameters on the rank, "bytes": params x bytes_per_param}``."""
    t = _v.count("tp", tp, minimum=1)
    k = _v.count("bytes_per_param", bytes_per_param, minimum=1)
    sharded, replicated = _layer_params(config)
    if sharded % t:
        raise ValueError(f"tp = {t}: the layer's sharded parameters ({sharded}) do not divide")
    params = sharded // t + replicated
    return {"params": params, "bytes": params * k}
