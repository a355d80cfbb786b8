"""The capstone's real 3-D run: the tiny GPT trained with dp × tp × pp ranks at once, on one mesh.

Introduced in notebooks/14_planning_a_run.ipynb. Every piece is the course's own:

* :class:`course_lib.parallel.mesh.Mesh` lays the ranks out as ``(pp, dp, tp)`` (tp innermost)
  and gives each rank its three process groups;
* :func:`course_lib.parallel.tensor.parallelize_gpt` splits every block's attention and MLP over
  the tp group (Megatron column/row layers, 2 all-reduces forward and 2 backward per block);
* :class:`course_lib.parallel.pipeline.PipelineRank` and :func:`~course_lib.parallel.pipeline.run_schedule`
  cut the model into ``pp`` stages and run GPipe over the micro-batches, with send/recv to the
  ranks of this rank's pp group (the stage owner is a global rank taken from the mesh);
* :func:`course_lib.parallel.ddp.allreduce_gradients` averages the gradients over the dp group
  after the pipeline's backward;
* :class:`~course_lib.measure.memory.MemoryMeter` measures each rank's parameters, gradients
  and optimizer state, :class:`~course_lib.measure.comm.CommMeter` what it sends.

The model is cut as ``[embeddings] + blocks + [ln_f, lm_head]``: stage 0 holds the embeddings
and the first L/pp blocks, the last stage the last blocks, the final LayerNorm and the head.
The output matrix is not tied to the embedding (a tied one would live on two stages and need
its own all-reduce between them). :func:`run_3d` trains ``steps`` steps and returns, with each
rank's measurements, the full parameters after training reassembled from the shards, so
:func:`reference_3d` (one process, full batch, same seed) can be compared with it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_lib import validate
from course_lib.models import GPT, GPTConfig
from course_lib.plan.specs import ModelSpec

__all__ = [
    "tiny_config",
    "tiny_spec",
    "make_batch",
    "reference_3d",
    "run_3d",
    "parity_3d",
    "memory_table",
    "comm_table",
    "LOSS_RTOL",
    "PARAM_TOL",
]

#: parity tolerances. Loss: |diff| <= LOSS_RTOL × |reference loss| (fp32 sums in another
#: order). Parameters after Adam: |diff| <= PARAM_TOL × lr × steps. Adam moves a parameter by
#: about lr per step whatever the size of its gradient (g / sqrt(v)), so a last-bit difference
#: in a tiny gradient shows up at the scale of lr; we allow 1% of the largest possible movement.
LOSS_RTOL = 1e-5
PARAM_TOL = 1e-2


def tiny_config(
    *, layers: int = 2, width: int = 32, heads: int = 4, vocab: int = 64, seq: int = 16
) -> GPTConfig:
    """The GPT of the 3-D run: untied head (see the module docstring), no dropout."""
    return GPTConfig(
        vocab_size=vocab,
        block_size=seq,
        n_layer=layers,
        n_head=heads,
        n_embd=width,
        tie_weights=False,
    )


def tiny_spec(config: GPTConfig) -> ModelSpec:
    """The same model as the planner describes it (GeLU MLP, biases, LayerNorm, learned
    positions, untied output)."""
    return ModelSpec(
        name="tiny GPT (3-D run)",
        layers=config.n_layer,
        hidden=config.n_embd,
        heads=config.n_head,
        kv_heads=config.n_head,
        ffn=4 * config.n_embd,
        vocab=config.vocab_size,
        seq_len=config.block_size,
        gated_mlp=False,
        bias=config.bias,
        tied_embeddings=config.tie_weights,
        learned_positions=True,
        norm="layernorm",
    )


def make_batch(step: int, rows: int, config: GPTConfig, seed: int = 0):
    """Step ``step``'s full batch: (rows, seq) token ids and next-token targets, the same in
    every process."""
    gen = torch.Generator().manual_seed(1000 * seed + step)
    tokens = torch.randint(0, config.vocab_size, (rows, config.block_size + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _build(config: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def _optimizer(params, lr: float):
    return torch.optim.Adam(params, lr=lr)


def reference_3d(
    *,
    steps: int = 2,
    batch: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    config: GPTConfig | None = None,
) -> dict:
    """One process, the full batch: losses per step and the parameters after ``steps``."""
    config = config or tiny_config()
    model = _build(config, seed)
    opt = _optimizer(model.parameters(), lr)
    losses = []
    for step in range(steps):
        x, y = make_batch(step, batch, config, seed)
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {
        "losses": losses,
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
    }


class _Embed(nn.Module):
    def __init__(self, model: GPT):
        super().__init__()
        self.wte, self.wpe = model.wte, model.wpe
        self.register_buffer("pos", model.pos, persistent=False)

    def forward(self, idx):  # (b, s) int64 -> (b, s, h)
        return self.wte(idx) + self.wpe(self.pos[: idx.shape[1]])


class _Head(nn.Module):
    def __init__(self, model: GPT):
        super().__init__()
        self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x):  # (b, s, h) -> (b, s, vocab)
        return self.lm_head(self.ln_f(x))


def _layers(model: GPT) -> nn.Sequential:
    """The model as a list of pipeline layers: embeddings, blocks, head."""
    return nn.Sequential(_Embed(model), *model.blocks, _Head(model))


def _full_name(index: int, rest: str, n_layer: int) -> str:
    """Name in the unsplit GPT of parameter ``rest`` of pipeline layer ``index``."""
    if index == 0 or index == n_layer + 1:
        return rest
    return f"blocks.{index - 1}.{rest}"


def _ce(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _mean_loss(loss: torch.Tensor | None, dp_group: Any, dp: int) -> float | None:
    """The step's loss: the last stage's (mean over its replica's rows), then over dp; None on
    the other stages (which still join the all-reduce)."""
    import torch.distributed as dist

    value = torch.zeros(1) if loss is None else loss.detach().reshape(1)
    dist.all_reduce(value, group=dp_group)
    return value.item() / dp if loss is not None else None


def _full_params(
    shards: dict[str, torch.Tensor], split: list[range], n_layer: int
) -> dict[str, torch.Tensor]:
    """This rank's gathered stage parameters under their names in the unsplit GPT."""
    full = {}
    for name, t in shards.items():
        _, stage, j, rest = name.split(".", 3)  # stages.<k>.<j>.<rest>
        full[_full_name(split[int(stage)].start + int(j), rest, n_layer)] = t
    return full


def _rank_fn(rank, world_size, dp, tp, pp, steps, batch, microbatches, lr, seed, config):
    from course_lib.measure.comm import CommMeter
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel.ddp import allreduce_gradients
    from course_lib.parallel.mesh import Mesh
    from course_lib.parallel.pipeline import PipelineRank, gpipe_order, split_layers
    from course_lib.parallel.tensor import gather_full, parallelize_gpt

    mesh = Mesh(dp=dp, tp=tp, pp=pp)
    tp_group, dp_group = mesh.group("tp"), mesh.group("dp")
    pp_ranks = mesh.ranks("pp")  # global ranks of this rank's pipeline, by stage

    model = parallelize_gpt(_build(config, seed), group=tp_group)  # same seed everywhere
    n_layer = config.n_layer
    split = split_layers(n_layer + 2, pp, sizes=_stage_sizes(n_layer, pp))
    pipe = PipelineRank(
        _layers(model), split, mesh.rank, pp, owner=lambda stage, ranks: pp_ranks[stage % ranks]
    )
    del model
    opt = _optimizer(pipe.parameters(), lr)
    order = gpipe_order(mesh.pp_rank, pp, microbatches)
    rows = batch // dp
    shape = (rows // microbatches, config.block_size, config.n_embd)
    losses = []
    with CommMeter(dispatch=False) as comm, MemoryMeter(pipe, opt) as mem:
        for step in range(steps):
            x, y = make_batch(step, batch, config, seed)
            x, y = (t[mesh.dp_rank * rows : (mesh.dp_rank + 1) * rows] for t in (x, y))
            opt.zero_grad()
            loss = run_schedule_3d(pipe, order, x, y, microbatches, shape, mesh.pp_rank, pp)
            allreduce_gradients(pipe, group=dp_group)  # mean over the dp replicas
            opt.step()
            losses.append(_mean_loss(loss, dp_group, dp))
    full = _full_params(gather_full(pipe, "param", group=tp_group), split, n_layer)
    return {
        "rank": rank,
        "coords": tuple(mesh.coords),
        "losses": losses,
        "memory": {k: mem.end_breakdown[k] for k in ("params", "grads", "optimizer")},
        "peak_bytes": mem.peak_bytes,
        "params_numel": sum(p.numel() for p in pipe.parameters()),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in pipe.buffers()),
        "comm": comm.summary(),
        "calls": comm.calls,
        "params": full if mesh.tp_rank == 0 else None,
    }


def run_schedule_3d(pipe, order, x, y, microbatches, shape, pp_rank, pp):
    """One GPipe step of this rank's stage: the first stage reads the token ids, the last the
    targets; every message is one (b/m, s, h) activation or its gradient."""
    from course_lib.parallel.pipeline import run_schedule

    return run_schedule(
        pipe,
        order,
        x if pp_rank == 0 else None,
        y if pp_rank == pp - 1 else None,
        microbatches=microbatches,
        loss_fn=_ce,
        message_shape=shape,
    )


def _stage_sizes(n_layer: int, pp: int) -> list[int]:
    """Pipeline layers (embeddings, blocks, head) of each stage: L/pp blocks each, the
    embeddings with the first, the head with the last."""
    sizes = [n_layer // pp] * pp
    sizes[0] += 1
    sizes[-1] += 1
    return sizes


def run_3d(
    dp: int = 2,
    tp: int = 2,
    pp: int = 2,
    steps: int = 2,
    *,
    batch: int = 8,
    microbatches: int = 2,
    lr: float = 1e-3,
    seed: int = 0,
    config: GPTConfig | None = None,
    timeout: float = 120.0,
) -> dict:
    """Train the tiny GPT ``steps`` steps on dp × tp × pp ranks (``course_lib.launch``, gloo).

    Returns ``{"ranks": [per-rank dict], "losses": [loss per step], "params": full parameters
    after training, reassembled from the shards}``. Each rank's dict: coords (pp, dp, tp),
    losses (None off the last stage), memory (MemoryMeter's params/grads/optimizer bytes at the
    end), peak_bytes, params_numel, comm (CommMeter's summary: model and wire bytes sent),
    calls (op -> count).
    """
    import course_lib

    config = config or tiny_config()
    dp = validate.count("dp", dp, minimum=1)
    tp = validate.count("tp", tp, minimum=1)
    pp = validate.count("pp", pp, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    m = validate.count("microbatches", microbatches, minimum=1)
    batch = validate.count("batch", batch, minimum=1)
    if config.n_layer % pp:
        raise ValueError(f"pp = {pp}: expected a divisor of n_layer = {config.n_layer}")
    if batch % (dp * m):
        raise ValueError(
            f"batch = {batch}: expected a multiple of dp × microbatches = {dp} × {m} = {dp * m}"
        )
    from course_lib.parallel.tensor import check_tp

    check_tp(config, tp)
    ranks = course_lib.launch(
        _rank_fn, dp * tp * pp, dp, tp, pp, steps, batch, m, lr, seed, config, timeout=timeout
    )
    last = [r for r in ranks if r["coords"][0] == pp - 1]
    params = {}
    for r in ranks:
        if r["params"] is not None and r["coords"][1] == 0:
            params.update(r["params"])
    return {
        "ranks": ranks,
        "losses": last[0]["losses"],
        "params": params,
        "layout": dict(dp=dp, tp=tp, pp=pp),
        "config": config,
        "setup": dict(steps=steps, batch=batch, microbatches=m, lr=lr, seed=seed),
    }


def _replica_diff(ranks: list[dict[str, Any]]) -> float:
    """Largest difference between the parameters of two dp replicas of the same stage (0.0
    when the gradient all-reduce keeps them bit-identical)."""
    replicas: dict[int, dict[str, torch.Tensor]] = {}  # stage -> the first replica's parameters
    diff = 0.0
    for r in ranks:
        if r["params"] is None:
            continue
        stage = r["coords"][0]
        if stage in replicas:
            diff = max(
                diff,
                max((r["params"][k] - replicas[stage][k]).abs().max().item() for k in r["params"]),
            )
        else:
            replicas[stage] = r["params"]
    return diff


def parity_3d(
    result: dict,
    reference: dict | None = None,
    *,
    loss_rtol: float = LOSS_RTOL,
    param_tol: float = PARAM_TOL,
) -> dict:
    """Compare a :func:`run_3d` result with one process on the full batch (:func:`reference_3d`
    with the same settings): the loss of every step (|diff| <= loss_rtol × |loss|) and every
    parameter after training (|diff| <= param_tol × lr × steps, see :data:`PARAM_TOL`). Also
    checks that the dp replicas hold bit-identical parameters. Returns the largest differences
    and ``ok``."""
    s = result["setup"]
    ref = reference or reference_3d(
        steps=s["steps"], batch=s["batch"], lr=s["lr"], seed=s["seed"], config=result["config"]
    )
    loss_diff = max(abs(a - b) for a, b in zip(ref["losses"], result["losses"]))
    loss_ok = all(abs(a - b) <= loss_rtol * abs(a) for a, b in zip(ref["losses"], result["losses"]))
    missing = sorted(set(ref["params"]) ^ set(result["params"]))
    param_atol = param_tol * s["lr"] * s["steps"]
    worst, worst_name = 0.0, None
    for name, want in ref["params"].items():
        got = result["params"].get(name)
        if got is None or got.shape != want.shape:
            missing.append(name)
            continue
        diff = (got - want).abs().max().item()
        if diff >= worst:
            worst, worst_name = diff, name
    replica_diff = _replica_diff(result["ranks"])
    ok = loss_ok and not missing and worst <= param_atol and replica_diff == 0.0
    return {
        "ok": ok,
        "reference_losses": ref["losses"],
        "losses": result["losses"],
        "max_loss_diff": loss_diff,
        "max_param_diff": worst,
        "worst_param": worst_name,
        "param_tolerance": param_atol,
        "replica_param_diff": replica_diff,
        "missing": missing,
        "loss_rtol": loss_rtol,
        "param_tol": param_tol,
    }


# the tables read a result of run_3d; they live in three_d_tables and are re-exported here
from course_lib.plan.three_d_tables import comm_table, memory_table  # noqa: E402
