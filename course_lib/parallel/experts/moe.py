"""A mixture-of-experts layer on one process: router, top-k, capacity, experts, combine.

Each token's router scores pick ``top_k`` of ``n_experts`` MLPs (the GPT MLP: d_model -> d_ff
-> GELU -> d_model); the token's output is the weighted sum of what they return (plus the
shared experts every token uses). Parameters grow with ``n_experts``, the work per token with
``top_k`` only: memory follows the total, compute the active parameters.

* ``router="softmax"`` (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961; GShard,
  Lepikhin et al. 2020, arXiv:2006.16668; Mixtral, arXiv:2401.04088): probabilities =
  softmax(logits); the top-k of them, renormalised to sum to 1 when top_k > 1 (Mixtral's
  softmax over the top-k logits is the same thing), kept as they are when top_k = 1 (Switch).
* ``router="sigmoid"`` (DeepSeek-V3, arXiv:2412.19437, Sec. 2.1.2): scores = sigmoid(logits);
  the top-k of scores + ``bias`` choose (the bias is not trained by gradient: see
  :func:`update_bias`, the auxiliary-loss-free balancing), the chosen scores, normalised to
  sum to 1, weigh.
* ``capacity_factor``: each expert takes at most ceil(cf x tokens x top_k / n_experts)
  assignments; first choices are served before second ones, tokens in order; the rest are
  dropped (the token gets nothing from that expert). None: no token is ever dropped.
* The auxiliary load-balancing loss (Switch Eq. 4, GShard's in its top-k form):
  ``n_experts * sum_i f_i P_i``, f_i the share of the kept and dropped assignments routed to
  expert i, P_i the mean router probability of expert i (sigmoid: the scores normalised per
  token). Uniform routing gives 1.0; collapse onto one expert gives n_experts; a batch of no
  tokens gives 0 (nothing to balance; still a function of the router, with zero gradient).

:func:`route` is the routing alone, so ``dispatch.py`` routes exactly as this does.
Introduced in notebooks/16_mixture_of_experts.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from course_lib import validate
from course_lib.measure.estimate.moe import moe_capacity

__all__ = [
    "Router",
    "ROUTERS",
    "Routing",
    "Expert",
    "MoE",
    "route",
    "capacity",
    "load_balancing_loss",
    "update_bias",
    "shared_sum",
    "check_tokens",
]

#: how the router turns logits into scores
Router = Literal["softmax", "sigmoid"]
ROUTERS: tuple[Router, ...] = ("softmax", "sigmoid")


@dataclass(frozen=True)
class Routing:
    """Where the tokens of one batch go (T tokens, k = top_k)."""

    experts: torch.Tensor
    """(T, k) int64: the experts chosen, best first"""
    weights: torch.Tensor
    """(T, k): the combine weights (differentiable with respect to the router)"""
    keep: torch.Tensor
    """(T, k) bool: False where the capacity dropped the assignment"""
    probs: torch.Tensor
    """(T, E): router probabilities (softmax; sigmoid: scores normalised per token)"""
    aux_loss: torch.Tensor
    """scalar: the load-balancing loss of this batch"""


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Assignments one expert takes: ceil(capacity_factor x tokens x top_k / n_experts)
    (``estimate.moe_capacity``)."""
    return moe_capacity(tokens, n_experts, top_k=top_k, capacity_factor=capacity_factor)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``E * sum_i f_i P_i``: probs (T, E), experts (T, k); f_i from the choices (no gradient),
    P_i the mean probability (the gradient flows through it)."""
    n = probs.shape[1]
    if experts.numel() == 0:  # no tokens: 0, not 0/0 (the sum keeps the graph, grad 0)
        return probs.sum() * 0
    f = torch.bincount(experts.reshape(-1), minlength=n).to(probs.dtype) / experts.numel()
    return n * (f * probs.mean(0)).sum()


def _keep_mask(experts: torch.Tensor, n_experts: int, cap: int) -> torch.Tensor:
    # priority: all first choices (tokens in order), then all second choices, ...
    order = experts.t().reshape(-1)  # (k T,): choice-major
    one_hot = F.one_hot(order, n_experts)  # (k T, E)
    position = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # place in its expert's queue
    return (position < cap).reshape(experts.shape[1], -1).t()  # (T, k)


def route(
    logits: torch.Tensor,
    top_k: int,
    *,
    router: Router = "softmax",
    bias: torch.Tensor | None = None,
    capacity_factor: float | None = None,
) -> Routing:
    """Route T tokens from their router ``logits`` (T, E); see the module docstring."""
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(
            "router logits = non-finite values (NaN or inf): expected finite numbers; "
            "check the input and the router's weights"
        )
    t, n = logits.shape
    if router == "softmax":
        probs = logits.softmax(-1)  # (T, E)
        w, experts = probs.topk(top_k, dim=-1)  # (T, k)
        if top_k > 1:
            w = w / w.sum(-1, keepdim=True)
    else:
        scores = logits.sigmoid()  # (T, E)
        choose = scores if bias is None else scores + bias
        experts = choose.topk(top_k, dim=-1).indices  # (T, k)
        w = scores.gather(1, experts)
        w = w / w.sum(-1, keepdim=True)
        probs = scores / scores.sum(-1, keepdim=True)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if capacity_factor is not None and t:  # no tokens: nothing to drop
        keep = _keep_mask(experts, n, capacity(t, n, top_k, capacity_factor))
    return Routing(experts, w, keep, probs, load_balancing_loss(probs, experts))


def update_bias(bias: torch.Tensor, experts: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing step: raise the bias of the experts that got
    fewer assignments than the mean by ``rate``, lower the others' (in place; returns bias)."""
    load = torch.bincount(experts.reshape(-1), minlength=bias.numel()).to(bias.dtype)
    bias += rate * torch.sign(load.mean() - load)
    return bias


def check_tokens(x: object, d_model: int, like: torch.Tensor | None) -> torch.Tensor:
    """Refuse tokens an MoE layer cannot take, before any work (or collective): ``x`` must be a
    floating-point tensor (..., d_model) with the dtype (outside autocast) and device of
    ``like``, a parameter of the layer. ``MoE`` and ``ExpertParallel`` share these messages."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x = {validate.describe(x)}: expected a tensor of tokens (..., {d_model})")
    if x.dim() == 0 or x.shape[-1] != d_model:
        got = "none" if x.dim() == 0 else x.shape[-1]
        raise ValueError(
            f"x.shape = {tuple(x.shape)}: expected (..., {d_model}), a last dimension of "
            f"d_model = {d_model} (got {got})"
        )
    if not x.dtype.is_floating_point:
        raise TypeError(f"x.dtype = {x.dtype}: expected a floating-point dtype")
    if like is None:
        return x
    if x.dtype != like.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"x.dtype = {x.dtype}: expected the layer's dtype, {like.dtype} (convert x or the "
            "layer, or run under autocast)"
        )
    if x.device != like.device:
        raise ValueError(f"x.device = {x.device}: expected the layer's device, {like.device}")
    return x


def shared_sum(shared: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """The shared experts' outputs summed, for tokens x (T, d_model) (zeros without any)."""
    out = torch.zeros_like(x)
    for e in shared:
        out = out + e(x)
    return out


class Expert(nn.Module):
    """One expert: the GPT MLP, d_model -> d_ff -> GELU -> d_model."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.c_fc = nn.Linear(d_model, d_ff)
        self.c_proj = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.c_proj(F.gelu(self.c_fc(x)))  # (n, d_model)
        return out


class MoE(nn.Module):
    """The reference MoE layer on one process: ``forward(x) -> (y, aux_loss)``, x (..., d_model).

    ``shared_experts`` MLPs see every token (DeepSeek-V3's shared expert). ``bias`` (a buffer
    of zeros, E) is used by the sigmoid router only. ``last_routing`` keeps the last
    :class:`Routing` for inspection."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int,
        *,
        capacity_factor: float | None = None,
        router: Router = "softmax",
        shared_experts: int = 0,
    ):
        super().__init__()
        self.d_model = validate.count("d_model", d_model, minimum=1)
        d_ff = validate.count("d_ff", d_ff, minimum=1)
        self.n_experts = validate.count("n_experts", n_experts, minimum=1)
        self.top_k = validate.count("top_k", top_k, minimum=1, maximum=self.n_experts)
        self.capacity_factor = (
            None
            if capacity_factor is None
            else validate.number("capacity_factor", capacity_factor, positive=True)
        )
        self.router_kind: Router = validate.choice("router", router, ROUTERS)
        shared = validate.count("shared_experts", shared_experts, minimum=0)
        self.router = nn.Linear(self.d_model, self.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(self.d_model, d_ff) for _ in range(self.n_experts))
        self.shared = nn.ModuleList(Expert(self.d_model, d_ff) for _ in range(shared))
        self.bias: torch.Tensor
        self.register_buffer("bias", torch.zeros(self.n_experts))
        self.last_routing: Routing | None = None

    def route(self, x: torch.Tensor) -> Routing:
        """The routing of tokens x (T, d_model)."""
        r = route(
            self.router(x),
            self.top_k,
            router=self.router_kind,
            bias=self.bias if self.router_kind == "sigmoid" else None,
            capacity_factor=self.capacity_factor,
        )
        self.last_routing = r
        return r

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_tokens(x, self.d_model, next(self.parameters(), None))
        flat = x.reshape(-1, self.d_model)  # (T, d)
        r = self.route(flat)
        out = shared_sum(self.shared, flat)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero((r.experts == e) & r.keep, as_tuple=True)
            if tok.numel():
                y = expert(flat[tok]) * r.weights[tok, slot, None]  # (n, d)
                out = out.index_add(0, tok, y)
        return out.reshape(x.shape), r.aux_loss
