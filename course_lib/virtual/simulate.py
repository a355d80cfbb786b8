"""``simulate_step``: one training step of PyTorch's real FSDP2 / tensor-parallel code, as one
rank of a cluster that does not exist, in one process.

    from course_lib import virtual
    step = virtual.simulate_step(virtual.PRESETS["llama2-70b"], world_size=512, strategy="fsdp",
                                 mixed_precision="bf16", batch=1, seq=512)
    step.title        # 'virtual cluster (simulated, not measured on GPUs): fsdp, 512 ranks, ...'
    step.to_frame()   # bytes on rank 0: one row per category, one column per moment

How: a fake process group (``dist.init_process_group("fake", ...)``: every collective returns
at once and moves nothing), the device mesh built before ``FakeTensorMode`` (tensors with shapes
and dtypes but no storage), then the same ``fully_shard`` / ``parallelize_module`` /
``replicate`` calls and optimizer a real job makes. PyTorch's memory trackers count the bytes
each tensor would occupy on rank 0 (``FSDPMemTracker``: sharded/unsharded parameters,
gradients, optimizer state, activations, all-gather and reduce-scatter buffers) and
``CommDebugMode`` counts the collectives. The sharding, padding, dtype casts and buffers are
PyTorch's own, which is what the formulas of ``course_lib.measure.estimate`` leave out.

What it is not: a measurement of a GPU. No kernel runs, so there is no time per step, no CUDA
context, no allocator fragmentation (add ~10-20 % on a real GPU; see notebooks/03), and
activations are those of the CPU kernels PyTorch would pick (the fused attention's saved
tensors differ between CPU and flash-attention). Every result says so: the ``label`` column is
``"virtual"`` and its title starts with "virtual cluster".

Each call runs in a fresh process started by :func:`course_lib.launch` (one rank, whose real
1-rank group is swapped for the fake one), so the caller never gets a default process group or
a fake mode left behind, and the memory of the traced model is returned to the OS when the call
ends. Arguments are checked before that process starts.

Introduced in notebooks/10_zero_fsdp.ipynb; used again in 11 (tensor parallelism) and 14
(planning a run).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from course_lib import validate as _v
from course_lib.virtual._types import RECOMPUTE, MixedPrecision, SimSpec, StepResult, Strategy
from course_lib.virtual.result import COLUMNS, LABEL, ROWS, SimulatedStep

__all__ = ["simulate_step", "SimulatedStep", "STRATEGIES", "ROWS", "COLUMNS", "LABEL"]

#: strategy -> what it is
STRATEGIES = {
    "fsdp": "FSDP2 fully_shard on every block and the root: parameters, gradients and optimizer "
    "state sharded (ZeRO-3); parameters re-gathered for backward",
    "fsdp_no_reshard": "fully_shard with reshard_after_forward=False: parameters stay gathered "
    "from forward to the end of backward (closest FSDP2 gets to ZeRO-2)",
    "tp": "tensor parallelism over all ranks (parallelize_module: wq/wk/wv/w1/w3 column-wise, "
    "wo/w2 row-wise); embeddings and norms replicated",
    "fsdp+tp": "2-D: tensor parallelism inside groups of tp ranks, FSDP2 across the "
    "world_size / tp groups",
    "ddp": "replicate (FSDP2's data-parallel twin): every rank holds everything (ZeRO stage 0)",
}
OPTIMIZERS = ("adamw", "adam", "sgd")
MIXED_PRECISION = (None, "bf16", "fp16")
#: activation checkpointing of every block (estimate's Recompute; None: "none", kept one release)
CHECKPOINT = (None, *RECOMPUTE)


def _count_text(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_arguments(
    model_fn: Any,
    *,
    world_size: Any,
    strategy: Any,
    mixed_precision: Any,
    batch: Any,
    seq: Any,
    tp: Any,
    reshard_after_forward: Any,
    optimizer: Any,
    vocab: Any,
    timeout: Any,
    checkpoint: Any = None,
    fast_chunks: bool = True,
    count_comm: bool = True,
    seq_len: Any = None,
) -> SimSpec:
    """Every check, before any process starts; returns the normalised spec."""
    if not callable(model_fn):
        raise TypeError(
            f"model_fn = {_v.describe(model_fn)}: expected a callable that returns an "
            "nn.Module, e.g. course_lib.virtual.llama_like(...)"
        )
    strategy = _v.choice("strategy", strategy, STRATEGIES)
    world_size = _v.count("world_size", world_size, minimum=1)
    mixed_precision = _v.choice("mixed_precision", mixed_precision, MIXED_PRECISION)
    optimizer = _v.choice("optimizer", optimizer, OPTIMIZERS, case_insensitive=True)
    checkpoint = None if _v.choice("checkpoint", checkpoint, CHECKPOINT) == "none" else checkpoint
    batch = _v.count("batch", batch, minimum=1)
    seq = _v.count(*seq_argument(seq, seq_len), minimum=1)
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(
            f"reshard_after_forward = {_v.describe(reshard_after_forward)}: expected True or False"
        )
    return SimSpec(
        model_fn=model_fn,
        world_size=world_size,
        strategy=strategy,
        tp=_check_tp(model_fn, strategy, world_size, tp),
        mixed_precision=mixed_precision,
        batch=batch,
        seq=seq,
        vocab=_check_vocab(model_fn, vocab),
        reshard_after_forward=reshard_after_forward,
        optimizer=optimizer,
        checkpoint=checkpoint,
        timeout=float(_v.number("timeout", timeout, positive=True)),
        fast_chunks=bool(fast_chunks),
        count_comm=bool(count_comm),
    )


def seq_argument(seq: Any, seq_len: Any, *, default: int | None = None) -> tuple[str, Any]:
    """``seq`` or ``seq_len``, its old name (kept one release): (the name the caller gave, the
    value). Giving both is an error; giving neither is ``default`` (an error when None)."""
    if seq is not None and seq_len is not None:
        raise TypeError(
            f"seq = {seq!r}, seq_len = {seq_len!r}: expected seq alone (seq_len is its old "
            "name, kept one release; give one of them)"
        )
    if seq is None and seq_len is None and default is None:
        raise TypeError("seq = None: expected the tokens per sequence, an int >= 1 (seq=...)")
    return ("seq", default if seq is None else seq) if seq_len is None else ("seq_len", seq_len)


def _check_vocab(model_fn: Any, vocab: Any) -> int:
    if vocab is None:
        vocab = getattr(model_fn, "vocab", None)
        if vocab is None:
            raise ValueError(
                "vocab = None: expected the model's vocabulary size (token ids are "
                "drawn from range(vocab)); model_fn has no .vocab to read it from"
            )
    return _v.count("vocab", vocab, minimum=1)


def _check_tp(model_fn: Any, strategy: str, world_size: int, tp: Any) -> int:
    uses_tp = strategy in ("tp", "fsdp+tp")
    if tp is None:
        if strategy == "fsdp+tp":
            raise ValueError(
                f"tp = None: expected the tensor-parallel degree for strategy "
                f"'fsdp+tp', one of {', '.join(map(str, _divisors(world_size)[1:]))} "
                f"(divisors of world_size = {world_size})"
            )
        tp = world_size if strategy == "tp" else 1
    tp = _v.count("tp", tp, minimum=1)
    if not uses_tp and tp != 1:
        raise ValueError(
            f"tp = {tp}: expected 1 for strategy '{strategy}' (tensor parallelism: "
            "strategy 'tp' or 'fsdp+tp')"
        )
    if strategy == "tp" and tp != world_size:
        raise ValueError(
            f"tp = {tp}: expected {world_size} (= world_size) for strategy 'tp', "
            "which splits every block over all ranks; 'fsdp+tp' combines the two"
        )
    if strategy == "fsdp+tp" and world_size % tp:
        raise ValueError(
            f"tp = {tp}: expected a divisor of world_size = {world_size}, one of "
            f"{', '.join(map(str, _divisors(world_size)))}"
        )
    if uses_tp:
        problems = getattr(model_fn, "tp_problems", None)
        if problems is None:
            raise TypeError(
                f"model_fn = {_v.describe(model_fn)}: strategy '{strategy}' needs a "
                "course_lib.virtual.llama_like(...) model (its blocks carry the "
                "column/row-parallel plan)"
            )
        found = problems(tp)
        if found:
            valid = [t for t in model_fn.valid_tp(limit=world_size) if world_size % t == 0]
            raise ValueError(
                f"tp = {tp}: expected a degree that divides the model's heads, "
                f"kv_heads and ffn ({'; '.join(found)}); valid here: "
                f"{', '.join(map(str, valid))}"
            )
    return int(tp)


def simulate_step(
    model_fn: Callable[[], Any],
    *,
    world_size: int,
    strategy: Strategy,
    mixed_precision: MixedPrecision = None,
    batch: int,
    seq: int | None = None,
    tp: int | None = None,
    reshard_after_forward: bool = True,
    optimizer: str = "adamw",
    checkpoint: str | None = None,  # a Recompute: "none" (None kept), "selective", "full"
    vocab: int | None = None,
    timeout: float = 300.0,
    fast_chunks: bool = True,
    count_comm: bool = True,
    seq_len: int | None = None,
) -> SimulatedStep:
    """Per-rank memory of one training step on a virtual cluster of ``world_size`` ranks.

    Args:
        model_fn: builds the model when called with no arguments (built inside
            ``FakeTensorMode``: no memory is allocated). A :func:`llama_like` config is one; any
            callable returning a module that maps (B, T) int64 token ids to (B, T, vocab)
            logits works for "fsdp", "fsdp_no_reshard" and "ddp" (FSDP wraps each module of
            ``model.layers`` if it has that ModuleList, then the root).
        world_size: number of ranks simulated.
        strategy: one of :data:`STRATEGIES` ("fsdp", "fsdp_no_reshard", "tp", "fsdp+tp", "ddp").
        mixed_precision: None (fp32 everywhere), "bf16" or "fp16": FSDP2/replicate
            ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32)`` over fp32 parameters
            (fp32 master weights + Adam = the ZeRO paper's accounting); "tp" uses autocast.
        batch, seq: the micro-batch of token ids each rank sees: ``batch`` sequences of
            ``seq`` tokens (both required; ``seq_len`` may name ``seq`` for one release).
        tp: tensor-parallel degree. None: world_size for "tp", 1 for the others; required
            for "fsdp+tp" (a divisor of world_size, and of the model's heads, kv_heads, ffn).
        reshard_after_forward: FSDP2's option ("fsdp_no_reshard" forces False).
        optimizer: "adamw", "adam" (both: 2 fp32 moments per parameter) or "sgd" (no state);
            foreach implementation, as on GPU. Its state is created before the measured step.
        checkpoint: activation checkpointing of every block of ``model.layers``, applied as
            torchtitan does (``checkpoint_wrapper``, non-reentrant, after tensor parallelism and
            before ``fully_shard``): "none" (off; None too), "full" (a block keeps its inputs
            and recomputes the rest in backward) or "selective" (also keeps the outputs of the
            matmuls and of the fused attention: ``_build.SELECTIVE_SAVE``). Introduced in
            notebooks/06_activation_checkpointing.ipynb.
        vocab: size of the token-id range; read from ``model_fn.vocab`` when None.
        timeout: seconds for the whole simulation (its own process is stopped after that).
        fast_chunks: skip building the world_size - 1 shards FSDP2 makes and throws away at
            set-up (same result, ~2x faster at 512 ranks; see ``_patches._LazyChunks``).
        count_comm: count collectives with ``CommDebugMode`` (``comm``; None when False,
            which saves ~10 % of the time).
        seq_len: the old name of ``seq``, kept one release (giving both is a TypeError).

    Returns:
        :class:`~course_lib.virtual.result.SimulatedStep`: ``to_frame()`` has one row per
        category of :data:`ROWS` and columns ``category`` (str), ``at_peak``, ``max``,
        ``after_forward``, ``after_backward``, ``after_step`` (int bytes on rank 0) and ``label``
        (= "virtual"). ``at_peak`` is the breakdown at the moment the rank's total peaked during
        forward and backward (the optimizer step is left out: see ``step_peak_bytes_traced``,
        inflated by DTensor's global-shape propagation, which a GPU does not allocate); ``max``
        each category's largest value at the tracker's sampling points (every module's pre/post
        forward/backward and its own peaks, and after forward/backward/step), so rows of ``max``
        do not add up to the total. ``after_backward``: before the optimizer step, the model
        states ZeRO's accounting counts (params + grads + optimizer). The optimizer row is the
        state kept between steps; tensors the step allocates and frees are counted in
        ``temporaries`` (as ``MemoryMeter`` does). Its fields: title, strategy, world_size, tp,
        dp, mixed_precision, optimizer, checkpoint, batch, seq (``seq_len`` still reads it, one
        release), model, n_params (when ``model_fn`` knows it), n_params_local, comm
        (collective counts from ``CommDebugMode``: total / forward / backward), simulate_s (CPU
        seconds of the process), launch_s (whole call), rss_peak_bytes (the process's peak
        resident memory), torch,
        activation_peak_bytes (the largest activations + temporaries during forward and
        backward, which need not fall at the total's peak; with ``checkpoint`` the rebuilt
        tensors count as activations) and activation_peak (every row at that moment).

    Raises:
        TypeError / ValueError: bad arguments, before any process starts.
        course_lib.LaunchError: the simulation failed or ran past ``timeout``.
    """
    spec = check_arguments(
        model_fn,
        world_size=world_size,
        strategy=strategy,
        mixed_precision=mixed_precision,
        batch=batch,
        seq=seq,
        seq_len=seq_len,
        tp=tp,
        reshard_after_forward=reshard_after_forward,
        optimizer=optimizer,
        vocab=vocab,
        timeout=timeout,
        checkpoint=checkpoint,
        fast_chunks=fast_chunks,
        count_comm=count_comm,
    )
    from course_lib.runtime.launch import launch
    from course_lib.virtual._rank import rank_entry

    t0 = time.perf_counter()
    (raw,) = launch(rank_entry, 1, spec, backend="gloo", timeout=spec.timeout)
    return to_result(raw, spec, launch_s=time.perf_counter() - t0)


def _title(spec: SimSpec) -> str:
    model, tp, world = spec.model_fn, spec.tp, spec.world_size
    n_params = getattr(model, "n_params", None)
    return (
        f"virtual cluster (simulated, not measured on GPUs): {spec.strategy}, "
        f"{world} ranks"
        + (f" (dp {world // tp} x tp {tp})" if tp > 1 else "")
        + f", {getattr(model, 'name', type(model).__name__)}"
        + (f" {_count_text(n_params)} params" if n_params else "")
        + f", {spec.mixed_precision or 'fp32'}, {spec.optimizer}, "
        + f"checkpoint {spec.checkpoint or 'none'}, "
        + f"batch {spec.batch} x seq {spec.seq}; "
        "bytes on rank 0"
    )


def _columns(raw: StepResult) -> dict[str, list[int]]:
    state = raw.after_step.get("optimizer", 0)  # what the optimizer keeps between steps
    columns: dict[str, list[int]] = {}
    for col in COLUMNS:
        snap = dict(getattr(raw, col))
        extra = snap.get("optimizer", 0) - state
        if extra > 0:  # the step's own transients (foreach scratch): temporaries, not state
            snap["optimizer"] = state
            snap["temporaries"] = snap.get("temporaries", 0) + extra
        snap.setdefault("total", sum(v for k, v in snap.items() if k != "total"))
        columns[col] = [int(snap.get(row, 0)) for row in ROWS]
    return columns


def to_result(raw: StepResult, spec: SimSpec, *, launch_s: float | None = None) -> SimulatedStep:
    """The plain answer of one simulation as a :class:`SimulatedStep`."""
    model = spec.model_fn
    act = raw.activation_peak
    columns = _columns(raw)
    return SimulatedStep(
        title=_title(spec),
        strategy=spec.strategy,
        world_size=spec.world_size,
        tp=spec.tp,
        mixed_precision=spec.mixed_precision,
        optimizer=spec.optimizer,
        checkpoint=spec.checkpoint,
        batch=spec.batch,
        seq=spec.seq,
        model=getattr(model, "name", type(model).__name__),
        n_params=getattr(model, "n_params", None),
        n_params_local=raw.n_params_local,
        breakdown={c: dict(zip(ROWS, columns[c])) for c in COLUMNS},
        comm=raw.comm,
        simulate_s=raw.wall_s,
        launch_s=launch_s,
        rss_peak_bytes=raw.rss_peak_bytes,
        torch=raw.torch,
        step_peak_bytes_traced=raw.step_peak_total,
        activation_peak_bytes=int(act.get("activations", 0) + act.get("temporaries", 0)),
        activation_peak={k: int(act.get(k, 0)) for k in ROWS},
    )
