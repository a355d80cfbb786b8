"""The planner's memory prediction beside the virtual cluster, for one layout.

``compare_with_virtual(model, layout)`` runs :func:`course_lib.virtual.simulate_step` on the same
layout (ZeRO-3 over dp = FSDP2 ``fully_shard``; with tp > 1, DTensor's column/row split inside
groups of tp ranks: strategy "fsdp+tp") for a copy of the model cut to 1 and 2 layers of the real
width, and compares the model state one rank holds (params + grads + optimizer) with
:func:`course_lib.plan.predict_memory` for the same cut models. The difference of the two runs
is one layer's state; the 1-layer run minus one layer is the rest (embedding, output layer,
final norm). Activations are not compared (the CPU kernels the virtual cluster traces are not
the GPU's: see notebooks/10).

Residuals, each named in the table:

* per layer: none beyond Adam's 4-byte ``step`` counter per tensor and, under TP, the two
  RMSNorm weights, which stay whole on every tp rank while the planner divides them by tp;
* rest: the virtual cluster's TP plan leaves the embedding and the output layer replicated over
  the tp ranks (sharded by FSDP over dp only); the planner splits them over tp too, as Megatron's
  vocabulary-parallel embedding does. At tp = 1 the two agree;
* the 16 B/param split differs (FSDP2: fp32 params 4 + fp32 grads 4 + Adam 8; ZeRO: bf16 2 +
  bf16 2 + fp32 master and Adam 12): the totals are compared, not the rows.

Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from course_lib import validate as _v
from course_lib.plan.memory import predict_memory
from course_lib.plan.specs import Layout, ModelSpec

__all__ = ["compare_with_virtual", "TOLERANCE"]

#: relative tolerance of the per-layer model state (planner vs virtual cluster)
TOLERANCE = 0.001


def _check(model: ModelSpec, layout: Layout) -> None:
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model = {model!r}: expected a ModelSpec")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout = {layout!r}: expected a Layout")
    if layout.zero != 3:
        raise ValueError(
            f"zero = {layout.zero}: expected 3 (the virtual cluster runs FSDP2's "
            "fully_shard, ZeRO-3)"
        )
    if layout.pp != 1:
        raise ValueError(f"pp = {layout.pp}: expected 1 (the virtual cluster has no pipeline)")
    odd = [
        f"{f} = {getattr(model, f)!r}"
        for f, ok in (
            ("gated_mlp", True),
            ("bias", False),
            ("tied_embeddings", False),
            ("learned_positions", False),
            ("norm", "rmsnorm"),
            ("embedding_norm", False),
        )
        if getattr(model, f) != ok
    ]
    if odd:
        raise ValueError(
            f"model = {model.name}: expected a Llama-shaped model (SwiGLU, RMSNorm, "
            f"no biases, untied output); got {', '.join(odd)}"
        )


def _predicted_state(model: ModelSpec, layout: Layout) -> int | float:
    m = predict_memory(model, layout)
    return m["params"] + m["grads"] + m["optimizer"]


def compare_with_virtual(
    model: ModelSpec,
    layout: Layout,
    *,
    seq: int | None = None,
    timeout: float = 120.0,
    seq_len: int | None = None,
) -> pd.DataFrame:
    """Model state per rank, planner vs virtual cluster, for ``layout`` (zero 3, pp 1), each
    rank's micro-batch one sequence of ``seq`` tokens (128; ``seq_len``, its old name, is
    kept one release).

    Returns a DataFrame with rows ``per layer``, ``rest`` (embedding, output, final norm) and
    ``1 layer + rest`` / ``2 layers + rest`` and columns ``predicted_B`` (predict_memory),
    ``virtual_B`` (simulate_step after backward: params + grads + optimizer, see
    ``virtual.model_states``), ``ratio`` (virtual / predicted), ``residual_B`` and ``note``.
    ``attrs``: label "virtual", title, tolerance (:data:`TOLERANCE`, on the per-layer row),
    sim_cpu_s (CPU seconds of the two simulations), gathered (the most gathered bf16 parameter bytes at once in
    the 2-layer run, beside the planner's ``buffers``).
    """
    from course_lib import virtual
    from course_lib.virtual.simulate import seq_argument

    _check(model, layout)
    name, tokens = seq_argument(seq, seq_len, default=128)
    tokens = _v.count(name, tokens, minimum=1)
    pred, virt, runs = {}, {}, {}
    for k in (1, 2):
        pred[k] = _predicted_state(model.replace(layers=k), layout)
        runs[k] = _simulate(model, layout, k, seq=tokens, timeout=timeout)
        st = virtual.model_states(runs[k])
        virt[k] = st["total"] - st["gathered"]
    out = pd.DataFrame(_rows(pred, virt, layout))
    out.attrs.update(
        label="virtual",
        tolerance=TOLERANCE,
        gathered=virtual.model_states(runs[2])["gathered"],
        sim_cpu_s=sum(step.simulate_s for step in runs.values()),
        predicted_buffers=predict_memory(model.replace(layers=2), layout)["buffers"],
        title=f"virtual cluster (simulated) vs planner: {model.name} at dp {layout.dp}"
        f" x tp {layout.tp}, ZeRO-3; model state per rank, B",
    )
    return out


def _simulate(
    model: ModelSpec, layout: Layout, layers: int, *, seq: int, timeout: float
) -> pd.DataFrame:
    """One bf16 FSDP (or FSDP + TP) training step of ``model`` cut to ``layers`` layers, traced
    on the virtual cluster at ``layout``'s dp x tp ranks."""
    from course_lib import virtual

    cut = model.replace(layers=layers, name=f"{model.name}, {layers} layer{'s' * (layers > 1)}")
    return virtual.simulate_layout(  # zero 3: "fsdp", or "fsdp+tp" when tp > 1
        cut,
        layout,
        mixed_precision="bf16",
        batch=1,
        seq=seq,
        checkpoint=None,
        timeout=timeout,
        count_comm=False,
    )


def _rows(
    pred: dict[int, int | float], virt: dict[int, int], layout: Layout
) -> list[dict[str, Any]]:
    """The comparison's rows from the 1- and 2-layer model states, predicted and virtual."""
    rows = [
        (
            "per layer",
            pred[2] - pred[1],
            virt[2] - virt[1],
            "Adam step counters; under TP the norms stay whole on each rank",
        ),
        (
            "rest",
            2 * pred[1] - pred[2],
            2 * virt[1] - virt[2],
            "embedding + output: TP leaves them replicated over tp (planner: split)"
            if layout.tp > 1
            else "embedding + output + final norm, sharded over dp",
        ),
        ("1 layer + rest", pred[1], virt[1], ""),
        ("2 layers + rest", pred[2], virt[2], ""),
    ]
    return [
        {
            "part": p,
            "predicted_B": int(a),
            "virtual_B": int(b),
            "ratio": b / a,
            "residual_B": int(b - a),
            "note": n,
        }
        for p, a, b, n in rows
    ]
