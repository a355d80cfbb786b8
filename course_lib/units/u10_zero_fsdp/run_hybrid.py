"""Unit 10, ZeRO-3 vs HSDP vs ZeRO++ on 4 ranks arranged as 2 "nodes" x 2 ranks: the bytes each
rank sends inside its node and across nodes, measured, beside the formula; and parity.

The schemes are ``parallel.zero.hybrid.HierarchicalSharded`` (the course's ZeRO-3 placed on
nodes). Every message is the course's ring or a pairwise exchange: each send goes to one peer in
a measurement window of its own (``CommMeter``: bytes the process wrote while the send and its
matching receive ran), and that peer's node says whether the bytes crossed a node boundary.
Used by notebooks/10_zero_fsdp.ipynb through :mod:`run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from course_lib import kit, validate
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u10_zero_fsdp._setup import _memory_batch, _memory_model

#: what :func:`hybrid_table` runs: name -> HierarchicalSharded's scheme
HYBRID_CONFIGS = {"ZeRO-3": "zero3", "HSDP": "hsdp", "ZeRO++": "zero++"}
HYBRID_LR = 0.05  #: SGD learning rate of the hybrid runs (an exact update: parity is simple)
WEIGHT_BITS, GRAD_BITS, BLOCK = 8, 4, 64  #: ZeRO++ as in the paper: int8 weights, int4 gradients


@dataclass(frozen=True)
class HybridRow:
    """One rank and configuration of :func:`hybrid_table` (bytes of the second step)."""

    rank: int
    node: int
    config: str
    wire_bytes: int | None
    intra: int
    inter: int
    other: int
    intra_msgs: int
    inter_msgs: int
    secondary_bytes: int
    max_diff: float
    rel_error: float
    formula_intra: float
    formula_inter: float


def wire_by_link(meter: Any, node_of: Callable[[int], int]) -> dict[str, int]:
    """Measured bytes of ``meter``'s windows, split by where their sends went: ``intra`` (a peer
    on this rank's node), ``inter`` (another node), ``other`` (a window with no send, or sends
    to both kinds of peer: not attributed)."""
    me = node_of(meter.rank)
    out = {"intra": 0, "inter": 0, "other": 0, "intra_msgs": 0, "inter_msgs": 0}
    for window in meter.wire_windows:
        peers = [meter.records[i].peer for i in window.records]
        sends = [p for p, op in zip(peers, window.ops) if op in ("send", "isend")]
        kinds = {"intra" if node_of(p) == me else "inter" for p in sends}
        kind = kinds.pop() if len(kinds) == 1 else "other"
        out[kind] += window.wire_sent
        if kind != "other":
            out[f"{kind}_msgs"] += len(sends)
    return out


def _hybrid_worker(rank: int, world_size: int, per_node: int, steps: int) -> list[HybridRow]:
    import torch

    from course_lib.measure import estimate
    from course_lib.measure.comm import CommMeter
    from course_lib.parallel.zero.hybrid import HierarchicalSharded, node_groups
    from course_lib.units.u10_zero_fsdp._setup import units_of

    nodes = node_groups(per_node)
    units = units_of(_memory_model())
    psi = sum(map(sum, units)) + estimate.zero_padding(units, world_size)
    reference = _memory_model()  # one process, full batches: what every scheme must reproduce
    opt = torch.optim.SGD(reference.parameters(), lr=HYBRID_LR)
    start = {n: p.detach().clone() for n, p in reference.named_parameters()}
    for step in range(steps):
        H.mse_loss(reference, _memory_batch(step)).backward()
        opt.step()
        opt.zero_grad()
    rows = []
    for config, scheme in HYBRID_CONFIGS.items():
        model = HierarchicalSharded(
            _memory_model(), nodes=nodes, scheme=scheme, weight_bits=WEIGHT_BITS,
            grad_bits=GRAD_BITS, block=BLOCK, optimizer=torch.optim.SGD, lr=HYBRID_LR,
        )  # fmt: skip
        secondary = 0
        for step in range(steps):
            with CommMeter(dispatch=False) as meter:
                H.mse_loss(model, H.shard_batch(_memory_batch(step), rank, world_size)).backward()
                secondary = max(secondary, model.secondary_bytes())
                model.step()
            model.zero_grad()
            if step == 1:  # the second step is the one kept (the first opens connections)
                split = wire_by_link(meter, lambda r: r // per_node)
                total = meter.wire_bytes_sent
        got = model.full_tensors()
        ref = {n: p.detach() for n, p in reference.named_parameters()}
        diff = torch.cat([(got[n] - ref[n]).reshape(-1) for n in ref])  # vs one process
        update = torch.cat([(ref[n] - start[n]).reshape(-1) for n in ref])  # its whole update
        formula = hybrid_formula(config, psi, world_size // per_node, per_node)
        rows.append(
            HybridRow(
                rank, nodes.node, config, total, **split, secondary_bytes=secondary,
                max_diff=float(diff.abs().max()), rel_error=float(diff.norm() / update.norm()),
                formula_intra=formula["intra"], formula_inter=formula["inter"],
            )
        )  # fmt: skip
    return rows


def hybrid_formula(
    config: str, psi: float, nodes: int, per_node: int, *, width: int = 4, block: int | None = BLOCK
) -> dict[str, float]:
    """FORMULA: bytes one rank sends per step, averaged over ranks, split intra/inter node, for
    ``psi`` parameters of ``width`` bytes (ZeRO++: codes of WEIGHT_BITS / GRAD_BITS bits plus a
    4-byte scale per ``block`` values; ``block=None``: no scales, the paper's count). Flat rings
    over N ranks placed node by node: m of their N links cross nodes, so 1/g of a ring's bytes,
    averaged over ranks. Times g: what one node sends to other nodes."""
    config = validate.choice("config", config, tuple(HYBRID_CONFIGS))
    m, g = nodes, per_node
    n = m * g
    full = width * psi  # Psi in bytes
    extra = 0.0 if block is None else 4 / block  # scale bytes per value
    qw = psi * (WEIGHT_BITS / 8 + extra)  # qwZ: int8 codes (+ scales)
    qg = psi * (GRAD_BITS / 8 + extra)  # qgZ: int4 codes (+ scales)
    ring = (n - 1) / n  # a flat ring over n ranks: m of its n links cross a node boundary
    if config == "ZeRO-3":
        return {"intra": 3 * ring * full * (g - 1) / g, "inter": 3 * ring * full / g}
    if config == "HSDP":
        return {"intra": 3 * (g - 1) / g * full, "inter": 2 * (m - 1) / m * full / g}
    fwd = ring * qw  # qwZ
    return {
        "intra": fwd * (g - 1) / g + (g - 1) / g * full + (g - 1) / g * qg,  # + hpZ + qgZ hop 1
        "inter": fwd / g + (m - 1) / n * qg,  # qwZ's node-crossing links + qgZ hop 2
    }


def hybrid_table(*, nodes: int = 2, per_node: int = 2, steps: int = 3) -> pd.DataFrame:
    """ZeRO-3, HSDP and ZeRO++ (:data:`HYBRID_CONFIGS`) on ``nodes`` x ``per_node`` ranks, the
    float32 memory model (Psi = 34,003) trained ``steps`` SGD steps. One row per rank and
    config: wire_bytes (MEASURED: the second step), intra / inter / other (its windows split by
    the sends' peers) and intra_msgs / inter_msgs (their sends), secondary_bytes (hpZ's copy,
    measured from the tensors kept), max_diff (largest |parameter - one process's| after
    ``steps`` steps), rel_error (||parameters - one process's|| / ||one process's update||),
    formula_intra / formula_inter (:func:`hybrid_formula`, Psi padded for N ranks)."""
    from course_lib.measure import estimate
    from course_lib.units.u10_zero_fsdp._setup import units_of

    m = validate.count("nodes", nodes, minimum=2)
    g = validate.count("per_node", per_node, minimum=2)
    steps = validate.count("steps", steps, minimum=2)
    res = launch(_hybrid_worker, m * g, g, steps)
    df = kit.frame(kit.rows_of(res, HybridRow), HybridRow)
    units = units_of(_memory_model())
    psi = sum(map(sum, units)) + estimate.zero_padding(units, m * g)
    df.attrs.update(psi=psi, nodes=m, per_node=g)
    return df


def hybrid_at_scale(
    params: float = 70e9, nodes: int = 64, per_node: int = 8, width: int = 2
) -> dict[str, float]:
    """FORMULA: bytes one node sends to other nodes per step, for each of
    :data:`HYBRID_CONFIGS`, with ``width``-byte (bf16) weights and gradients and ZeRO++'s codes
    counted without their scales (the paper's accounting)."""
    return {
        c: per_node * hybrid_formula(c, params, nodes, per_node, width=width, block=None)["inter"]
        for c in HYBRID_CONFIGS
    }
