"""The layouts :func:`plan.plan` weighs, and the checks on its inputs. Introduced in
notebooks/14_planning_a_run.ipynb."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from course_lib import validate as _v
from course_lib.plan.memory import check_layout, stage_layers, tp_choices
from course_lib.plan.specs import RECOMPUTE, ClusterSpec, Layout, ModelSpec, divisors

__all__ = [
    "MIN_CP_TOKENS",
    "DIMENSIONS",
    "MAX_BATCH_SEQUENCES",
    "MAX_MICRO_BATCH",
    "candidates",
    "check_only",
    "plan_inputs",
    "no_layout_message",
]

#: context parallelism is weighed while each rank keeps at least this many tokens of a sequence
#: (Llama 3 split only its 128K phase, 8K tokens per rank at cp 16: arXiv:2407.21783 Table 4)
MIN_CP_TOKENS = 8192
#: what ``only`` may narrow
DIMENSIONS = ("tp", "cp", "pp", "ep", "micro_batch", "v", "zero", "recompute")
#: the largest global batch the planner searches, in sequences: far above any published run
#: (DeepSeek-V3's 15,360 sequences) and small enough that the search always answers in seconds
#: (10^8 sequences took 26 s before this bound, 10^12 never answered)
MAX_BATCH_SEQUENCES = 10**7
#: the largest ``max_micro_batch``: every micro-batch size up to it that divides a replica's
#: share is weighed in every layout (published runs use 1 to 8 sequences; the default is 8)
MAX_MICRO_BATCH = 64


def _only(only: Mapping[str, Sequence[Any]] | None) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for key, values in (only or {}).items():
        _v.choice("only", key, DIMENSIONS)
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"only[{key!r}] = {values!r}: expected a list of values")
        out[key] = set(values)
    return out


def check_only(
    model: ModelSpec, only: Mapping[str, Sequence[Any]] | None, uneven_stages: bool
) -> None:
    """Refuse, before searching, a value of ``only`` that no layout of ``model`` can have, with
    :func:`plan.check_layout`'s message: pp above the layers or (without ``uneven_stages``) not
    dividing them, tp not dividing the heads, cp not dividing the sequence, ep not dividing the
    experts, a ZeRO stage or recomputation that does not exist."""
    for name, values in _only(only).items():
        for value in sorted(values, key=repr):
            if name in ("zero", "recompute"):
                _v.choice(name, value, (0, 1, 2, 3) if name == "zero" else RECOMPUTE)
                continue
            n = _v.count("virtual_stages" if name == "v" else name, value, minimum=1)
            if name == "pp":
                stage_layers(model, n, uneven_stages=uneven_stages)
            elif name in ("tp", "cp", "ep"):
                one: dict[str, Any] = {name: n}  # dp = n, so that ep divides it
                check_layout(model, Layout(n, **one))


def _keep(keys: dict[str, set[Any]], name: str, values: Sequence[Any]) -> list[Any]:
    return [x for x in values if name not in keys or x in keys[name]]


def _cps(model: ModelSpec) -> list[int]:
    s = model.seq
    return [
        c for c in (1, 2, 4, 8, 16, 32, 64) if c == 1 or (s % c == 0 and s // c >= MIN_CP_TOKENS)
    ]


def _tps(model: ModelSpec, cluster: ClusterSpec, across: bool) -> list[int]:
    return [t for t in tp_choices(model) if across or t <= cluster.gpus_per_node]


def _pps(model: ModelSpec, per_replica: int, uneven_stages: bool) -> list[int]:
    """Pipeline depths that divide ``per_replica`` GPUs (dp x pp of them) and that the layers
    allow: at most L, and dividing L unless stages may be uneven."""
    return [
        p
        for p in divisors(per_replica)
        if p <= model.layers and (uneven_stages or model.layers % p == 0)
    ]


def _eps(model: ModelSpec, dp: int, stage: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs: ep dividing dp and the experts (etp 0: carved out of dp), and the ep
    that only folding over a stage's tp x cp x dp ranks allows, with expert-TP 1 (Megatron-Core's
    parallel folding, ``course_lib.dims``)."""
    if not model.experts:
        return [(1, 0)]
    carved = divisors(math.gcd(dp, model.experts))
    folded = [e for e in divisors(math.gcd(stage, model.experts)) if e not in carved]
    return [(e, 0) for e in carved] + [(e, 1) for e in folded]


def candidates(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    global_batch_tokens: int,
    uneven_stages: bool,
    max_micro_batch: int,
    allow_tp_across_nodes: bool,
    only: Mapping[str, Sequence[Any]] | None,
) -> Iterator[Layout]:
    """Every layout :func:`plan.plan` weighs (see its docstring), each one that
    :func:`plan.check_layout` accepts."""
    keys, seqs = _only(only), global_batch_tokens // model.seq
    for tp in _keep(keys, "tp", _tps(model, cluster, allow_tp_across_nodes)):
        for cp in _keep(keys, "cp", _cps(model)):
            if gpus % (tp * cp):
                continue
            for pp in _keep(keys, "pp", _pps(model, gpus // (tp * cp), uneven_stages)):
                dp = gpus // (tp * cp * pp)
                if seqs % dp:
                    continue
                eps = _eps(model, dp, tp * cp * dp)
                n = stage_layers(model, pp, uneven_stages=uneven_stages)[0]  # as check_layout
                q = seqs // dp
                mbs = [d for d in range(1, min(q, max_micro_batch) + 1) if q % d == 0]
                for ep, etp in (e for e in eps if e[0] in keys.get("ep", {e[0]})):
                    for mb in _keep(keys, "micro_batch", mbs):
                        m = q // mb
                        vs = [v for v in (1, 2, 4, 8) if n % v == 0 and (v == 1 or m >= pp)]
                        for v in _keep(keys, "v", vs if pp > 1 else [1]):
                            for zero in _keep(keys, "zero", (0, 1, 2, 3)):
                                for rec in _keep(keys, "recompute", RECOMPUTE):
                                    yield Layout(
                                        dp, tp, pp, zero, rec, mb, v, cp=cp, ep=ep, etp=etp
                                    )


def plan_inputs(
    model: ModelSpec, cluster: ClusterSpec, gpus: int | None, global_batch_tokens: int
) -> tuple[int, int]:
    """(GPUs, global batch in tokens) after checking :func:`plan.plan`'s arguments."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model = {model!r}: expected a ModelSpec (e.g. plan.model('Llama-2-7B'))")
    if not isinstance(cluster, ClusterSpec):
        raise TypeError(f"cluster = {cluster!r}: expected a ClusterSpec (e.g. plan.cluster(...))")
    n_gpus = (
        cluster.gpus if gpus is None else _v.count("gpus", gpus, minimum=1, maximum=cluster.gpus)
    )
    tokens = _v.count("global_batch_tokens", global_batch_tokens, minimum=1)
    if tokens % model.seq:
        raise ValueError(
            f"global_batch_tokens = {tokens}: expected a multiple of seq = "
            f"{model.seq} (whole sequences)"
        )
    if tokens // model.seq > MAX_BATCH_SEQUENCES:
        raise ValueError(
            f"global_batch_tokens = {tokens}: expected at most {MAX_BATCH_SEQUENCES:,} "
            f"sequences of seq = {model.seq} ({MAX_BATCH_SEQUENCES * model.seq:,} "
            "tokens), the largest global batch the planner searches"
        )
    return n_gpus, tokens


def no_layout_message(
    model: ModelSpec, gpus: int, tokens: int, only: Mapping[str, Sequence[Any]] | None
) -> str:
    """Why :func:`candidates` yielded nothing."""
    narrowed = f" within only = {dict(only)}" if only else ""
    return (
        f"gpus = {gpus}: no dp x tp x pp x cp layout divides it{narrowed} with tp dividing "
        f"the heads ({model.heads}, KV {model.kv_heads}) and dp dividing the "
        f"global batch of {tokens // model.seq} sequences"
    )
