"""Hand-written answers to unit 14's tasks (the solution notebook's, kept here for the tests)."""

from __future__ import annotations

from course_lib.measure import estimate


def sized_run():
    layout = dict(dp=16, tp=4, pp=1, zero=2, recompute="selective", micro_batch=1)
    n, s, h, a, kv, f, V, L = 68_976_648_192, 4096, 8192, 64, 8, 28672, 32000, 80
    state = estimate.zero_state_breakdown_per_rank(n // 4, stage=2, world_size=16)["total"]
    act = L * estimate.activation_bytes_transformer_layer(
        s,
        1,
        h,
        a,
        kv_heads=kv,
        ffn=f,
        gated_mlp=True,
        dropout=False,
        tp=4,
        sequence_parallel=True,
        recompute="selective",
    )
    logits = 4 * s * V / 4
    return layout, state + act + logits


def problems(model, cluster, layout, global_batch_tokens):
    found = set()
    if layout.tp > cluster.gpus_per_node:
        found.add("tp_across_nodes")
    seqs, rest = divmod(global_batch_tokens, model.seq_len)
    if rest or seqs % (layout.dp * layout.micro_batch):
        found.add("batch_not_divisible")
    elif seqs // (layout.dp * layout.micro_batch) < layout.pp:
        found.add("fewer_microbatches_than_stages")
    return found


def predict_mfu(parts, model, layout, new_seq):
    s, h, V = model.seq_len, model.hidden, model.vocab
    P = model.params()["per_layer"]
    n = model.layers // layout.pp

    def stage(seq):  # FLOPs per token of the slowest stage: model work, recomputation
        work = n * (6 * P + 12 * seq * h) + 6 * V * h
        extra = {"none": 0, "selective": n * 4 * seq * h, "full": n * (2 * P + 4 * seq * h)}
        return work, extra[layout.recompute]

    (w0, r0), (w1, r1) = stage(s), stage(new_seq)
    compute = parts["compute_s"] * w1 / w0
    recompute = parts["recompute_s"] * r1 / r0 if r0 else 0.0
    busy = compute + recompute + parts["tp_comm_s"] + parts["p2p_s"]  # per token: TP, P2P unchanged
    m = parts["microbatches"] * s // new_seq  # same tokens, longer sequences: fewer micro-batches
    bubble = (layout.pp - 1) / layout.virtual_stages * busy / m
    step = busy + bubble + parts["dp_comm_s"]
    flops_old = 6 * model.n_params + 12 * model.layers * h * s  # model FLOPs per token
    flops_new = 6 * model.n_params + 12 * model.layers * h * new_seq
    return parts["mfu"] * parts["step_s"] / step * flops_new / flops_old
