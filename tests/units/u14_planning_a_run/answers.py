"""Hand-written answers to unit 14's tasks (the solution notebook's, kept here for the tests)."""

from __future__ import annotations

from course_lib.measure import estimate


def sized_run(gpus, total_tokens, budget_days):
    """The smallest TP, no pipeline, the most ZeRO and the least recomputation that leave a
    15 % margin under 76 GB, by the categories the planner counts."""
    from course_lib import plan as P

    model = P.model("Llama-2-70B")
    parts = model.params()
    s, h, V = model.seq, model.hidden, model.vocab

    def layer(tp, recompute):
        return estimate.activation_bytes_transformer_layer(
            s,
            1,
            h,
            model.heads,
            kv_heads=model.kv_heads,
            ffn=model.ffn,
            gated_mlp=True,
            dropout=False,
            tp=tp,
            sequence_parallel=False,
            recompute=recompute,
        )

    for tp in (1, 2, 4, 8):
        for zero in (1, 2, 3):
            for rec in ("selective", "full"):
                dp = gpus // tp
                n = -(-parts["total"] // tp)
                state = estimate.zero_state_breakdown_per_rank(n, stage=zero, world_size=dp)
                act = model.layers * layer(tp, rec) + (
                    layer(tp, "selective") if rec == "full" else 0
                )
                logits = 4 * s * V / tp
                buffers = 2 * 2 * parts["per_layer"] / tp if zero == 3 else 0
                memory = state["total"] + act + logits + buffers
                if memory <= 0.85 * 76e9:
                    return dict(dp=dp, tp=tp, pp=1, zero=zero, recompute=rec, micro_batch=1), memory
    raise ValueError(f"gpus = {gpus}: no layout without a pipeline fits")


def problems(model, cluster, layout, global_batch_tokens):
    found = set()
    if layout.tp > cluster.gpus_per_node:
        found.add("tp_across_nodes")
    seqs, rest = divmod(global_batch_tokens, model.seq)
    if rest or seqs % (layout.dp * layout.micro_batch):
        found.add("batch_not_divisible")
    elif seqs // (layout.dp * layout.micro_batch) < layout.pp:
        found.add("fewer_microbatches_than_stages")
    return found


def predict_mfu(parts, model, layout, new_seq):
    s, h, V = model.seq, model.hidden, model.vocab
    P = model.params()["per_layer"]
    n = model.layers // layout.pp

    def stage(seq):  # FLOPs per token of the slowest stage: model work, recomputation
        work = n * (6 * P + 12 * seq * h) + 6 * V * h
        extra = {"none": 0, "selective": n * 4 * seq * h, "full": n * (2 * P + 4 * seq * h)}
        return work, extra[layout.recompute]

    (w0, r0), (w1, r1) = stage(s), stage(new_seq)
    compute = parts["compute_s"] * w1 / w0
    recompute = parts["recompute_s"] * r1 / r0 if r0 else 0.0
    m = parts["microbatches"] * s // new_seq  # same tokens, longer sequences: fewer micro-batches
    # TP and P2P bytes per token unchanged; their per-message latency falls with the micro-batches
    latency = parts["latency_s"] * m / parts["microbatches"]
    busy = compute + recompute + parts["tp_comm_s"] + parts["p2p_s"] - parts["latency_s"] + latency
    bubble = (layout.pp - 1) / layout.virtual_stages * busy / m
    step = busy + bubble + parts["dp_comm_s"]
    matmul_params = model.layers * P + V * h  # PaLM's N: what matrix products use
    flops_old = 6 * matmul_params + 12 * model.layers * h * s  # model FLOPs per token
    flops_new = 6 * matmul_params + 12 * model.layers * h * new_seq
    return parts["mfu"] * parts["step_s"] / step * flops_new / flops_old
