"""What the planner plans for: a model (:class:`ModelSpec`, dense or mixture of experts), a
cluster (:class:`ClusterSpec`) and a layout of the GPUs in five dimensions (:class:`Layout`:
dp x tp x pp x cp, with ep carved out of dp). Presets from the papers and data sheets are in
``plan.presets``.

Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from course_lib import validate as _v
from course_lib.dims import ParallelDims
from course_lib.measure import estimate
from course_lib.measure.estimate.activations import RECOMPUTE, Recompute
from course_lib.measure.estimate.context import CP_METHODS, CpMethod
from course_lib.shape import ModelShape

__all__ = [
    "ModelSpec",
    "ClusterSpec",
    "Layout",
    "RECOMPUTE",
    "ATTENTION",
    "attention_kernel",
    "recompute_flops",
    "divisors",
]

# RECOMPUTE (from estimate): the recomputation policies the planner weighs (Korthikanti et al.)

#: the attention kernels a layout can name (``Layout.attention``): "flash" keeps no score matrix
#: and moves none through memory, and its backward recomputes the scores tile by tile
#: (FlashAttention: Dao et al. 2022, arXiv:2205.14135, Sec. 3.1); "eager" writes the softmax
#: of the scores to memory, reads it back and keeps it for backward (what Korthikanti et al.
#: 2022's Eq. 1 counts: 5 a s / h bytes per token and layer with dropout)
ATTENTION = ("flash", "eager")


def attention_kernel(recompute: Recompute, attention: str | None = None) -> str:
    """The attention kernel a layout runs: ``attention`` when it names one (:data:`ATTENTION`),
    else the one its recomputation implied before the kernel could be named (the course's
    pairing, still :func:`plan.plan`'s search): FlashAttention with ``selective``, eager with
    ``none`` and ``full``."""
    if attention is not None:
        return str(_v.choice("attention", attention, ATTENTION))
    return "flash" if recompute == "selective" else "eager"


def recompute_flops(
    layer_params: int, layers: int, width: int, seq: int, recompute: Recompute, kernel: str
) -> int:
    """FLOPs per token that ``layers`` layers run again in backward, by recomputation and by the
    attention kernel (``estimate.recompute_flops_per_token``'s counts; w = ``width``):

    * eager: what ``recompute`` runs again: 0, the attention core's forward (4 s w,
      Korthikanti's selective) or the whole layer's forward (2 P + 4 s w);
    * flash: its backward recomputes the scores, priced as the core's forward again (4 s w,
      what selective recomputation costs: the course's count; FlashAttention's backward
      recomputes Q K^T, 2 s w of it), so ``none`` and ``selective`` cost the same (selective has
      nothing left to drop); ``full`` runs the layer's forward again and the kernel's backward
      recomputes its scores too (2 P + 8 s w)."""

    def run(rec: Recompute) -> int:
        return estimate.recompute_flops_per_token(
            layer_params, layers=layers, hidden=width, seq=seq, recompute=rec
        )

    if kernel == "eager":
        return run(recompute)
    return run("selective") + (run("full") if recompute == "full" else 0)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending (trial division up to sqrt(n), so a global batch
    of a million sequences costs a thousand steps, not a million)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class ModelSpec(ModelShape):
    """A decoder-only transformer's shape (:class:`course_lib.shape.ModelShape`, every field of
    it) and what the planner adds: dropout, the published count and its source. ``seq_len`` is
    the old name of ``seq``, kept one release (attribute, constructor and :meth:`replace`)."""

    dropout: bool = False  # dropout in training (adds 1-byte masks to activations)
    published_params: float | None = None  # the count the authors report
    published_active: float | None = None  # the active count they report (mixture of experts)
    source: str = ""  # where the shape and the count come from

    @property
    def seq_len(self) -> int:
        """The old name of ``seq`` (kept one release)."""
        return self.seq

    def params(self) -> dict[str, int]:
        """Parameter count by part (``estimate.transformer_param_count``)."""
        return dict(_params(self))

    def layer_params(self) -> dict[str, int]:
        """Parameters of one layer: ``dense`` (attention, norms, an MLP of width ffn:
        ``params()["per_layer"]``); for an MoE layer ``moe`` (the dense layer with its MLP
        replaced by the router, the shared and the routed experts: ``estimate.moe_param_count``),
        ``moe_active`` (what one token uses: top_k routed experts) and ``routed`` (the routed
        experts, what expert parallelism splits). A dense model's MoE entries are its dense
        layer's, ``routed`` 0."""
        return dict(_layer_params(self))

    def _count(self) -> dict[str, int]:
        return estimate.transformer_param_count(**self.dense())

    def _count_layer(self) -> dict[str, int]:
        dense = self.params()["per_layer"]
        if not self.experts:
            return {"dense": dense, "moe": dense, "moe_active": dense, "routed": 0}
        kw: dict[str, Any] = dict(gated_mlp=self.gated_mlp, bias=self.bias)
        mlp = estimate.moe_param_count(self.hidden, self.ffn, 1, top_k=1, **kw)["expert"]
        moe = estimate.moe_param_count(
            self.hidden,
            self.expert_ffn,
            self.experts,
            top_k=self.top_k,
            shared_experts=self.shared_experts,
            **kw,
        )
        base = dense - mlp
        return {
            "dense": dense,
            "moe": base + moe["total"],
            "moe_active": base + moe["active"],
            "routed": self.experts * moe["expert"],
        }

    @property
    def n_params(self) -> int:
        """Every parameter, the routed experts included."""
        lp = self.layer_params()
        return self.params()["total"] + self.moe_layers * (lp["moe"] - lp["dense"])

    @property
    def active_params(self) -> int:
        """The parameters one token uses: :attr:`n_params` less the routed experts it does not
        go through (E - top_k of them in each MoE layer); the embedding and the output layer
        counted, as DeepSeek-AI and Qwen count their "activated" parameters."""
        lp = self.layer_params()
        return self.n_params - self.moe_layers * (lp["moe"] - lp["moe_active"])

    def kv_replicated(self, tp: int) -> int:
        """Parameters per layer that tensor parallelism over ``tp`` ranks adds by replicating
        K/V heads when tp > kv_heads (each rank keeps one whole K/V head, as Megatron does for
        multi- and grouped-query attention; PaLM ran multi-query attention on 12-way model
        parallelism): the K/V projections' P_kv (tp / kv_heads - 1), summed over the tp ranks
        (each holds P_kv / kv_heads instead of P_kv / tp). 0 when kv_heads divides by tp."""
        t = _v.count("tp", tp, minimum=1)
        if t <= self.kv_heads:
            return 0
        kv = estimate.attention_param_count(**attention_fields(self))["kv"]
        kv += 2 * self.kv_hidden if self.bias else 0
        return kv * (t - self.kv_heads) // self.kv_heads

    def flops_per_token(
        self, recompute: Recompute = "none", attention: str | None = None
    ) -> tuple[int, int]:
        """(model FLOPs, hardware FLOPs) per trained token. Model FLOPs are what MFU counts, the
        PaLM way (Chowdhery et al. 2022, arXiv:2204.02311, App. B): 6 N + 12 L s w (PaLM's
        12 L H Q T; w = ``attention_width``, h for heads of h / a, MLA's own), where N is
        the parameters a matrix product uses (every layer's and the output layer's V h; the
        embedding lookup is not a product). Hardware FLOPs (HFU's count) add what ``recompute``
        runs again (``estimate.recompute_flops_per_token``): a run that recomputes everything
        does about 8 N, so its hardware rate is about 4/3 of its model rate. ``attention``: the
        kernel (:func:`attention_kernel`; what it recomputes: :func:`recompute_flops`).
        An MoE layer counts the parameters a token uses (``layer_params()["moe_active"]``)."""
        lp, n_moe = self.layer_params(), self.moe_layers
        n_dense = self.layers - n_moe
        matmul_params = n_dense * lp["dense"] + n_moe * lp["moe_active"] + self.vocab * self.hidden
        w = self.attention_width
        model = estimate.training_flops_per_token(
            matmul_params, layers=self.layers, hidden=w, seq=self.seq
        )
        kernel = attention_kernel(recompute, attention)
        extra = sum(
            recompute_flops(params, n, w, self.seq, recompute, kernel)
            for params, n in ((lp["dense"], n_dense), (lp["moe_active"], n_moe))
        )
        return model, model + extra

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with ``changes`` (``seq_len`` still names ``seq``, one release)."""
        if "seq_len" in changes:
            changes["seq"] = changes.pop("seq_len")
        return dataclasses.replace(self, **changes)


def attention_fields(model: ModelShape) -> dict[str, Any]:
    """The keywords ``estimate.attention_param_count`` takes, from ``model``."""
    keys = ("hidden", "heads", "kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank")
    return {k: getattr(model, k) for k in (*keys, "rope_head_dim", "v_head_dim")}


_spec_init = ModelSpec.__init__


@functools.wraps(_spec_init)
def _init_with_seq_len(self: ModelSpec, *args: Any, seq_len: int | None = None, **kw: Any) -> None:
    """ModelSpec(..., seq_len=s) still builds ModelSpec(..., seq=s) (one release)."""
    if seq_len is not None:
        kw["seq"] = seq_len
    _spec_init(self, *args, **kw)


ModelSpec.__init__ = _init_with_seq_len  # type: ignore[method-assign]


_ALPHA = {name: link.alpha_us * 1e-6 for name, link in estimate.LINK_SPEEDS.items()}


@functools.cache
def _params(model: ModelSpec) -> dict[str, int]:  # a frozen spec: count it once
    return model._count()


@functools.cache
def _layer_params(model: ModelSpec) -> dict[str, int]:
    return model._count_layer()


@dataclass(frozen=True)
class ClusterSpec:
    """GPUs, their memory and speed, and the links between them (bandwidths per direction)."""

    name: str
    gpus_per_node: int  # GPUs in one node (one NVLink/NVSwitch domain)
    nodes: int  # nodes in the cluster
    memory_bytes: int  # memory per GPU in bytes (80 GB = 80e9)
    peak_flops: float  # dense bf16 peak per GPU in FLOP/s
    intra_GBps: float  # GPU-to-GPU inside a node, per direction, GB/s (1e9 B/s), as NCCL reaches
    inter_GBps: float  # each GPU's share of the network, per direction, GB/s
    source: str = ""
    # latency of one ring step in seconds, inside a node and across the network: NCCL's cost
    # model (estimate.link_speed(...).alpha_us, NVIDIA/nccl src/graph/tuning.cc)
    alpha_intra_s: float = _ALPHA["NVLink H100"]
    alpha_inter_s: float = _ALPHA["InfiniBand NDR"]
    mem_GBps: float = 3350.0  # memory bandwidth per GPU, GB/s (the H100 SXM's HBM3)
    fp8_peak_flops: float = 0.0  # dense FP8 peak in FLOP/s (0: twice peak_flops, Hopper's ratio)
    sms: int = 132  # streaming multiprocessors, one GEMM output tile each per wave (0: none)

    def __post_init__(self) -> None:
        _v.count("gpus_per_node", self.gpus_per_node, minimum=1)
        _v.count("nodes", self.nodes, minimum=1)
        _v.count("memory_bytes", self.memory_bytes, minimum=1)
        _v.count("sms", self.sms, minimum=0)
        for f in ("peak_flops", "intra_GBps", "inter_GBps", "mem_GBps"):
            _v.number(f, getattr(self, f), positive=True, finite=True)
        for f in ("alpha_intra_s", "alpha_inter_s", "fp8_peak_flops"):
            _v.number(f, getattr(self, f), minimum=0, finite=True)

    @property
    def fp8_flops(self) -> float:
        """The dense FP8 peak: ``fp8_peak_flops``, or twice the bf16 peak where it is 0."""
        return self.fp8_peak_flops or 2 * self.peak_flops

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def with_gpus(self, gpus: int) -> "ClusterSpec":
        """The same hardware with ``gpus`` GPUs (whole nodes, or part of one node)."""
        n = _v.count("gpus", gpus, minimum=1)
        if n <= self.gpus_per_node:
            if self.gpus_per_node % n:
                raise ValueError(
                    f"gpus = {n}: expected a divisor of gpus_per_node = "
                    f"{self.gpus_per_node} or a multiple of it"
                )
            return dataclasses.replace(self, gpus_per_node=n, nodes=1)
        if n % self.gpus_per_node:
            raise ValueError(
                f"gpus = {n}: expected a multiple of gpus_per_node = {self.gpus_per_node}"
            )
        return dataclasses.replace(self, nodes=n // self.gpus_per_node)


@dataclass(frozen=True)
class Layout:
    """How a run uses its GPUs: dp x tp x pp x cp ranks (tp innermost, then cp, dp, pp), expert
    parallelism over ep of the dp ranks (the experts split ep ways, as Megatron carves its
    expert-parallel group out of the data-parallel one) or, with ``etp`` >= 1, folded over the
    tp x cp x dp ranks with expert-TP etp (``course_lib.dims``), what each rank does to save
    memory, and the attention kernel it runs (``attention``, independent of ``recompute``:
    "flash" or "eager", :data:`ATTENTION`; None keeps the pairing of :func:`attention_kernel`)."""

    dp: int  # data-parallel replicas
    tp: int = 1  # tensor-parallel ranks (Megatron column/row split)
    pp: int = 1  # pipeline stages
    zero: int = 1  # ZeRO stage over the dp ranks: 0 (DDP), 1, 2, 3 (FSDP)
    recompute: Recompute = "selective"  # none, selective (the attention core), full
    micro_batch: int = 1  # sequences per micro-batch
    virtual_stages: int = 1  # interleaved pipeline: chunks per rank (v)
    sequence_parallel: bool = True  # split LayerNorm/dropout activations over tp too
    cp: int = 1  # context parallelism: each sequence split over cp ranks
    ep: int = 1  # expert parallelism: the routed experts split over ep of the dp ranks
    cp_method: CpMethod = "allgather"  # how attention meets the other ranks' keys (Llama 3's)
    grad_bytes: int = 2  # gradient width kept: 2 (bf16), 4 (Megatron's fp32 main grads)
    etp: int = 0  # experts folded over tp x cp x dp with this expert-TP (0: ep out of dp)
    # the attention kernel, "flash" or "eager" (ATTENTION); None: the one recompute implies
    attention: str | None = None

    def __post_init__(self) -> None:
        _v.count("micro_batch", self.micro_batch, minimum=1)
        _ = self.dims  # checks dp, tp, pp, cp, ep, virtual_stages, etp (ep divides dp, or folds)
        _v.choice("zero", self.zero, (0, 1, 2, 3))
        _v.choice("recompute", self.recompute, RECOMPUTE)
        _v.choice("cp_method", self.cp_method, CP_METHODS)
        _v.choice("grad_bytes", self.grad_bytes, (2, 4))
        if self.attention is not None:
            _v.choice("attention", self.attention, ATTENTION)

    @property
    def kernel(self) -> str:
        """The attention kernel this layout runs (:func:`attention_kernel`): ``attention``, or
        where it is None the one ``recompute`` implies (flash with selective, else eager)."""
        return attention_kernel(self.recompute, self.attention)

    @functools.cached_property
    def dims(self) -> ParallelDims:
        """The layout's axes (:class:`course_lib.dims.ParallelDims`, the one owner of rank
        order): what ``parallel.mesh.Mesh``, ``plan.three_d.run_3d`` and the virtual cluster
        take."""
        return ParallelDims(
            self.dp, self.tp, self.pp, self.cp, self.ep, self.virtual_stages, self.etp
        )

    @classmethod
    def from_dims(cls, dims: ParallelDims, **settings: Any) -> Layout:
        """The layout of ``dims`` with ``settings`` (zero, recompute, micro_batch, ...)."""
        if not isinstance(dims, ParallelDims):
            raise TypeError(f"dims = {_v.describe(dims)}: expected a course_lib.dims.ParallelDims")
        return cls(
            dp=dims.dp,
            tp=dims.tp,
            pp=dims.pp,
            cp=dims.cp,
            ep=dims.ep,
            virtual_stages=dims.virtual_stages,
            etp=dims.etp,
            **settings,
        )

    @property
    def gpus(self) -> int:
        return self.dims.world_size

    @property
    def expert_split(self) -> tuple[int, int]:
        """(ranks one MoE layer's routed experts are split over, ranks that hold the same
        shard): tp x ep and dp cp / ep when ep is carved out of dp (the experts split over tp
        like every layer); folded (``etp`` >= 1), ep x etp and tp cp dp / (ep etp)."""
        if self.etp:
            split = self.ep * self.etp
            return split, self.tp * self.cp * self.dp // split
        return self.tp * self.ep, self.dp * self.cp // self.ep
