"""The layouts :func:`plan.plan` weighs, and the checks on its inputs. Introduced in
notebooks/14_planning_a_run.ipynb."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from course_lib import validate as _v
from course_lib.plan.memory import stage_layers
from course_lib.plan.specs import RECOMPUTE, ClusterSpec, Layout, ModelSpec, divisors

__all__ = ["MIN_CP_TOKENS", "DIMENSIONS", "candidates", "plan_inputs", "no_layout_message"]

#: context parallelism is weighed while each rank keeps at least this many tokens of a sequence
#: (Llama 3 split only its 128K phase, 8K tokens per rank at cp 16: arXiv:2407.21783 Table 4)
MIN_CP_TOKENS = 8192
#: what ``only`` may narrow
DIMENSIONS = ("tp", "cp", "pp", "ep", "micro_batch", "v", "zero", "recompute")


def _only(only: Mapping[str, Sequence[Any]] | None) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for key, values in (only or {}).items():
        _v.choice("only", key, DIMENSIONS)
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"only[{key!r}] = {values!r}: expected a list of values")
        out[key] = set(values)
    return out


def _keep(keys: dict[str, set[Any]], name: str, values: Sequence[Any]) -> list[Any]:
    return [x for x in values if name not in keys or x in keys[name]]


def _cps(model: ModelSpec) -> list[int]:
    s = model.seq_len
    return [
        c for c in (1, 2, 4, 8, 16, 32, 64) if c == 1 or (s % c == 0 and s // c >= MIN_CP_TOKENS)
    ]


def _tps(model: ModelSpec, cluster: ClusterSpec, across: bool) -> list[int]:
    g = math.gcd(model.heads, model.kv_heads)
    return [t for t in divisors(g) if across or t <= cluster.gpus_per_node]


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
    """Every layout :func:`plan.plan` weighs (see its docstring)."""
    keys, seqs = _only(only), global_batch_tokens // model.seq_len
    pps = range(1, model.layers + 1) if uneven_stages else divisors(model.layers)
    for tp in _keep(keys, "tp", _tps(model, cluster, allow_tp_across_nodes)):
        for cp in _keep(keys, "cp", _cps(model)):
            for pp in _keep(keys, "pp", list(pps)):
                dp, rest = divmod(gpus, tp * cp * pp)
                if rest or seqs % dp:
                    continue
                eps = divisors(math.gcd(dp, model.experts)) if model.experts else [1]
                n = stage_layers(model, pp, uneven_stages=uneven_stages)[0]
                mbs = [d for d in divisors(seqs // dp) if d <= max_micro_batch]
                for ep in _keep(keys, "ep", eps):
                    for mb in _keep(keys, "micro_batch", mbs):
                        m = seqs // (dp * mb)
                        vs = [v for v in (1, 2, 4, 8) if n % v == 0 and (v == 1 or m >= pp)]
                        for v in _keep(keys, "v", vs if pp > 1 else [1]):
                            for zero in _keep(keys, "zero", (0, 1, 2, 3)):
                                for rec in _keep(keys, "recompute", RECOMPUTE):
                                    yield Layout(dp, tp, pp, zero, rec, mb, v, cp=cp, ep=ep)


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
    if tokens % model.seq_len:
        raise ValueError(
            f"global_batch_tokens = {tokens}: expected a multiple of seq_len = "
            f"{model.seq_len} (whole sequences)"
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
        f"global batch of {tokens // model.seq_len} sequences"
    )
