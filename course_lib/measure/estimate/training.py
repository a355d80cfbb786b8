"""Training at scale: parameter counts, training FLOPs, MFU, GPUs for a run, accelerator specs,
memory tiers, and the batch-size rules (linear learning-rate scaling, warm-up, noise scale).

Introduced in notebooks/01_backprop_memory.ipynb (parameter count, model state at 7B-175B) and
notebooks/02_batch_size_and_accumulation.ipynb (6ND, MFU, GPUs for a run, memory tiers, ridge
points, the learning rate against the batch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib import validate as _v
from course_lib.measure.estimate.planning import gpu_hours, gpus_for_days, transformer_param_count

__all__ = [
    "gpt_param_count",
    "training_flops_per_token",
    "mfu",
    "mfu_from_gpu_hours",
    "gpus_for_training",
    "training_days",
    "GpuSpec",
    "GPU_SPECS",
    "gpu_spec",
    "MemoryTier",
    "MEMORY_TIERS_A100",
    "compute_bound_batch",
    "linear_scaled_lr",
    "warmup_lr",
    "simple_noise_scale",
]

SECONDS_PER_DAY = 86_400


# --------------------------------------------------------------------------------------------
# parameters and FLOPs
# --------------------------------------------------------------------------------------------
def gpt_param_count(
    *,
    n_layer: int,
    n_embd: int,
    vocab_size: int,
    block_size: int,
    bias: bool = True,
    tie_weights: bool = True,
) -> int:
    """Parameters of our GPT-2 shaped model (``course_lib.models.GPT``): the old name, kept one
    release, of ``transformer_param_count(**GPTConfig(...).shape().dense())["total"]``, which
    counts it term by term:

    * per block: attention q, k, v and output projections ``4 C^2`` and the MLP ``8 C^2`` (its
      hidden layer is 4C wide) -- the ``12 L C^2`` of Kaplan et al. 2020 (arXiv:2001.08361
      Sec. 2.1); with biases ``3C + C + 4C + C`` more, and two LayerNorms ``2 x 2C``
      (``2C`` without bias): ``12 C^2 + 13 C`` per block with bias;
    * token embedding ``V C`` (shared with the output head when ``tie_weights``, else twice),
      position embedding ``block_size x C``, final LayerNorm ``2C`` (``C`` without bias).
    """
    C = _v.count("n_embd", n_embd, minimum=1)
    return transformer_param_count(
        layers=_v.count("n_layer", n_layer, minimum=1),
        hidden=C,
        heads=1,
        kv_heads=1,
        ffn=4 * C,
        vocab=_v.count("vocab_size", vocab_size, minimum=1),
        seq=_v.count("block_size", block_size, minimum=1),
        gated_mlp=False,
        bias=bias,
        tied_embeddings=tie_weights,
        learned_positions=True,
        norm="layernorm",
    )["total"]


def training_flops_per_token(
    n_params: int, *, layers: int = 0, hidden: int = 0, seq: int = 0
) -> int:
    """Training FLOPs per token of a dense transformer, the model FLOPs that MFU counts:
    ``6 N`` (2 forward + 4 backward per parameter; Kaplan et al. 2020, arXiv:2001.08361 Sec. 2.1)
    plus, when the shape is given, the attention products QK^T and AV, 2 s h each in the
    forward, times 3 for forward + backward: ``12 L s h`` (Chowdhery et al. 2022, PaLM,
    arXiv:2204.02311 App. B). Leave ``layers``/``hidden``/``seq`` at 0 for ``6 N`` alone; a run
    of D tokens costs D times this (6ND). A causal model computes only half of the s x s scores;
    the convention counts all of them. Recomputation is not model FLOPs (it is hardware FLOPs:
    ``recompute_flops_per_token``)."""
    N = _v.count("n_params", n_params)
    L, h, s = (_v.count("layers", layers), _v.count("hidden", hidden), _v.count("seq", seq))
    return 6 * N + 12 * L * s * h


def mfu(flops_per_step: float, step_s: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s (the model's FLOPs per step over the step's
    time) as a fraction of the hardware peak (Chowdhery et al. 2022, App. B). Rematerialized
    FLOPs do not count: that is the difference with "hardware FLOPs utilization"."""
    return (
        _v.number("flops_per_step", flops_per_step, minimum=0)
        / _v.number("step_s", step_s, positive=True)
        / _v.number("peak_flops", peak_flops, positive=True)
    )


def mfu_from_gpu_hours(total_flops: float, hours: float, *, peak_flops: float) -> float:
    """The MFU a reported GPU-hour figure implies: F / (hours * 3600 * peak). Llama-2-7B:
    6 x 6.74e9 x 2e12 over 184,320 A100-hours (Touvron et al. 2023, arXiv:2307.09288, Table 2)
    at 312 TFLOP/s: 39 %. The one MFU formula, :func:`mfu`, with the hours in seconds."""
    f = _v.number("total_flops", total_flops, positive=True)
    return mfu(f, _v.number("hours", hours, positive=True) * 3600, peak_flops)


def training_days(total_flops: float, *, gpus: int, peak_flops: float, mfu: float) -> float:
    """Days a run of ``total_flops`` takes on ``gpus`` GPUs of ``peak_flops`` at utilization
    ``mfu``: ``total / (gpus x peak x mfu) / 86,400``, i.e. ``gpu_hours(...) / (24 gpus)``
    (the old name, kept one release: use :func:`gpu_hours`)."""
    g = _v.count("gpus", gpus, minimum=1)
    if _v.number("total_flops", total_flops, minimum=0) == 0:
        return 0.0  # gpu_hours counts a run that does something
    return gpu_hours(total_flops, peak_flops=peak_flops, mfu=mfu) / (24 * g)


def gpus_for_training(
    n_params: int, tokens: int, *, days: float, peak_flops: float, mfu: float
) -> int:
    """Fewest GPUs that train ``n_params`` on ``tokens`` in ``days`` at utilization ``mfu``:
    ``ceil(6 N D / (days x 86,400 x peak x mfu))``, i.e. ``ceil(gpus_for_days(6 N D, ...))``
    (the old name, kept one release: use :func:`gpus_for_days`). The worked example of the
    sources (175B parameters, 300B tokens = 3.15e23 FLOPs, 30 days, 50 % MFU) needs 1,944.4
    V100, 779.02 A100 or 245.8 H100, so 1,945 / 780 / 246 whole GPUs (dense fp16/bf16
    tensor-core peaks from :data:`GPU_SPECS`)."""
    total = training_flops_per_token(n_params) * _v.count("tokens", tokens, minimum=1)
    return math.ceil(gpus_for_days(total, days=days, peak_flops=peak_flops, mfu=mfu))


# --------------------------------------------------------------------------------------------
# accelerators and memory tiers
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuSpec:
    """Published figures of one accelerator: dense 16-bit tensor-core peak (FLOP/s, no
    sparsity), HBM bandwidth (bytes/s) and capacity (bytes), and where they come from."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    hbm_bytes: int
    source: str

    @property
    def ridge(self) -> float:
        """Ridge point in FLOP/byte: peak / bandwidth."""
        return self.peak_flops / self.hbm_bytes_per_s


GPU_SPECS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec(
            "V100",
            125e12,
            900e9,
            32 * 10**9,
            "NVIDIA Tesla V100 SXM2 datasheet: 125 TFLOPS fp16 tensor, 900 GB/s HBM2",
        ),
        GpuSpec(
            "A100",
            312e12,
            2.039e12,
            80 * 10**9,
            "NVIDIA A100 80GB SXM datasheet: 312 TFLOPS bf16 dense (624 with sparsity), 2,039 GB/s",
        ),
        GpuSpec(
            "H100",
            989e12,
            3.35e12,
            80 * 10**9,
            "NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 dense (1,979 with sparsity), 3.35 TB/s HBM3",
        ),
    ]
}


def gpu_spec(name: str) -> GpuSpec:
    """Look up a :data:`GPU_SPECS` entry by name (case-insensitive)."""
    by_name = {key.lower(): spec for key, spec in GPU_SPECS.items()}
    return by_name[_v.choice("name", name, by_name, case_insensitive=True)]


@dataclass(frozen=True)
class MemoryTier:
    """One level of the memory hierarchy: capacity and bandwidth (None where not published)."""

    name: str
    capacity_bytes: int
    bytes_per_s: float | None
    source: str


#: The tiers of an A100 40GB server, fastest first. SRAM, HBM and host DRAM are the figures of
#: Dao et al. 2022 (FlashAttention, arXiv:2205.14135, Fig. 1); registers from the A100
#: whitepaper (256 KB register file per SM x 108 SMs); the host link is PCIe 4.0 x16.
MEMORY_TIERS_A100 = (
    MemoryTier(
        "registers",
        256 * 1024 * 108,
        None,
        "NVIDIA A100 whitepaper (2020): 64K 32-bit registers = 256 KB per SM, 108 SMs",
    ),
    MemoryTier(
        "SRAM (shared memory / L1)",
        20 * 10**6,
        19e12,
        "Dao et al. 2022, FlashAttention, Fig. 1: 19 TB/s, 20 MB (192 KB per SM x 108)",
    ),
    MemoryTier(
        "HBM (GPU global memory)", 40 * 10**9, 1.5e12, "Dao et al. 2022, Fig. 1: 1.5 TB/s, 40 GB"
    ),
    MemoryTier(
        "host DRAM (over PCIe 4.0 x16)",
        10**12,
        12.8e9,
        "Dao et al. 2022, Fig. 1: 12.8 GB/s, > 1 TB (the PCIe link itself: ~31.5 GB/s per direction)",
    ),
)


def compute_bound_batch(width: int, ridge: float, *, dtype_bytes: int = 2) -> int:
    """Smallest batch (rows, i.e. tokens for a transformer) at which a ``(B x d) @ (d x d)``
    Linear layer reaches the ridge point: ``2 B d^2 >= ridge x dtype_bytes x (2 B d + d^2)``,
    so ``B >= ridge b d / (2 d - 2 ridge b)``; about ``ridge x b / 2`` when ``d`` is large.
    Raises ValueError when no batch gets there (``d <= ridge x b``: the weights alone cost more
    bytes than the matmul can reuse)."""
    d = _v.count("width", width, minimum=1)
    r = _v.number("ridge", ridge, positive=True)
    b = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    denom = 2 * d - 2 * r * b
    if denom <= 0:
        raise ValueError(
            f"width = {d}: expected more than ridge x dtype_bytes = {r * b:g}; "
            "a narrower layer never becomes compute-bound"
        )
    return math.ceil(r * b * d / denom - 1e-9)


# --------------------------------------------------------------------------------------------
# the learning rate against the batch
# --------------------------------------------------------------------------------------------
def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """Linear scaling rule: multiply the learning rate by the factor the batch grew by
    (Goyal et al. 2017, arXiv:1706.02677 Sec. 2.1). Holds up to a problem-dependent batch
    (8k images for ResNet-50 ImageNet in that paper), beyond which it breaks down."""
    return (
        _v.number("base_lr", base_lr, positive=True)
        * _v.count("batch", batch, minimum=1)
        / _v.count("base_batch", base_batch, minimum=1)
    )


def warmup_lr(step: int, lr: float, *, warmup_steps: int) -> float:
    """Gradual warm-up (Goyal et al. 2017 Sec. 2.2): the learning rate rises linearly from
    ``lr / warmup_steps`` at step 0 to ``lr`` at step ``warmup_steps - 1``, then stays."""
    s = _v.count("step", step)
    w = _v.count("warmup_steps", warmup_steps)
    peak = _v.number("lr", lr, positive=True)
    if w == 0 or s >= w:
        return peak
    return peak * (s + 1) / w


def simple_noise_scale(trace_cov: float, grad_sq_norm: float) -> float:
    """The simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` of McCandlish et al.
    2018 (arXiv:1812.06162, Eq. 2.8): ``trace_cov`` is the summed variance of the per-example
    gradient, ``grad_sq_norm`` the squared norm of the true gradient. Batches well below it
    gain almost linearly from more samples per step; batches well above it waste compute. The
    critical batch of a run is of this order."""
    return _v.number("trace_cov", trace_cov, minimum=0) / _v.number(
        "grad_sq_norm", grad_sq_norm, positive=True
    )
