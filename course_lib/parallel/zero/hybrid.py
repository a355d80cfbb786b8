"""HSDP and ZeRO++: ZeRO-3 that knows which ranks share a node.

Ranks are numbered node by node: ``per_node`` = g consecutive ranks form a node, m = N / g nodes
(the layout of ``mesh.py``: the node is the innermost dimension). :func:`node_groups` makes the
two groups each rank needs: its node (``intra``: g ranks) and the ranks of the same local index
on every node (``inter``: m ranks, one per node). :class:`HierarchicalSharded` is the course's
ZeRO-3 (:class:`~course_lib.parallel.zero.full.FullySharded`) with one of three ``scheme`` s:

* ``"zero3"``: sharded over all N ranks (the baseline). Every collective is a flat ring over the
  N ranks, so m of its N links cross a node boundary.
* ``"hsdp"``: hybrid sharding (PyTorch FSDP's ``ShardingStrategy.HYBRID_SHARD``): shard within
  the node, replicate across nodes. The gathers and the reduce-scatter stay inside the node; the
  node's gradient shard is then all-reduced over ``inter`` (1/g of the gradients crosses nodes).
* ``"zero++"``: ZeRO++ (Wang et al. 2023, arXiv:2306.10209, Sec. 3): sharded over all N ranks,
  with **qwZ** (Sec. 3.1: the forward all-gather carries blockwise-quantized weights),
  **hpZ** (Sec. 3.2: a secondary copy of the gathered weights, sharded within the node, which
  backward all-gathers inside the node instead of across nodes) and **qgZ** (Sec. 3.3: the
  gradient reduce-scatter as two all-to-alls of quantized gradients, first inside the node, then
  across nodes, each followed by a dequantised sum).

Quantization here is symmetric blockwise absmax (:func:`quantize`: one fp32 scale per ``block``
values, codes of ``bits`` = 8 or 4 bits) written in plain torch; it stands in for the paper's
fused CUDA kernels. The master shards stay fp32 and are updated by the optimizer.

Every collective is the course's ring or a pairwise exchange (``parallel.collectives``: ``ring.py``, ``p2p.py``):
each message goes to one known peer, so ``CommMeter`` measures every send's bytes in a window of
its own and a caller can tell intra-node from inter-node traffic (unit 10). Gathers are
synchronous (no ``prefetch``). Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.parallel.collectives import ring_all_gather, ring_all_reduce
from course_lib.parallel.collectives.p2p import exchange
from course_lib.parallel.ddp import broadcast_parameters
from course_lib.parallel.mesh import Dim, rank_groups
from course_lib.parallel.zero.common import Unit
from course_lib.parallel.zero.full import FullySharded

__all__ = [
    "SCHEMES",
    "NodeGroups",
    "node_groups",
    "quantize",
    "dequantize",
    "packed_bytes",
    "HierarchicalSharded",
]

SCHEMES = ("zero3", "hsdp", "zero++")


class NodeGroups(NamedTuple):
    """This rank's place among nodes of ``per_node`` ranks: node index, local index, and the two
    process groups (``intra``: its node; ``inter``: the same local index on every node)."""

    nodes: int
    per_node: int
    node: int
    local: int
    intra: dist.ProcessGroup
    inter: dist.ProcessGroup


def node_groups(per_node: int) -> NodeGroups:
    """Build the intra- and inter-node groups for nodes of ``per_node`` consecutive ranks. A
    collective call: every rank calls it, in the same order."""
    per_node = validate.count("per_node", per_node, minimum=1)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % per_node:
        raise ValueError(f"per_node = {per_node}: expected a divisor of world_size = {world}")
    nodes = world // per_node
    made: dict[str, dist.ProcessGroup] = {}
    dims: tuple[tuple[str, Dim], ...] = (("intra", "tp"), ("inter", "dp"))
    for kind, dim in dims:  # the mesh (dp = nodes, tp = per_node): tp is a node
        for ranks in rank_groups(dim, dp=nodes, tp=per_node):
            group = dist.new_group(ranks)  # every rank takes part in making every group
            if rank in ranks:
                made[kind] = group
    return NodeGroups(nodes, per_node, rank // per_node, rank % per_node, **made)


# ---- blockwise absmax quantization --------------------------------------------------------------
def packed_bytes(numel: int, bits: int, block: int) -> int:
    """Bytes of :func:`quantize`'s buffer: the codes, then one fp32 scale per block."""
    return -(-numel * bits // 8) + 4 * -(-numel // block)


def quantize(x: torch.Tensor, bits: int, block: int) -> torch.Tensor:
    """``x`` as one uint8 buffer: ``bits``-bit signed codes (8, or 4 packed two per byte), then
    the fp32 scales (absmax / (2^(bits-1) - 1)) of its blocks of ``block`` values."""
    flat = x.detach().reshape(-1).float()
    n = flat.numel()
    blocks = -(-n // block)
    padded = torch.nn.functional.pad(flat, (0, blocks * block - n)).view(blocks, block)
    qmax = 2 ** (bits - 1) - 1
    scale = padded.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / qmax  # (blocks,)
    codes = torch.round(padded / scale[:, None]).clamp(-qmax, qmax).to(torch.int8).view(-1)[:n]
    if bits == 8:
        packed = codes.view(torch.uint8)
    else:  # two 4-bit codes per byte, offset by 8 so that they are unsigned
        nibbles = torch.nn.functional.pad((codes + 8).to(torch.uint8), (0, n % 2))
        packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return torch.cat([packed, scale.view(torch.uint8)])


def dequantize(buf: torch.Tensor, numel: int, bits: int, block: int) -> torch.Tensor:
    """The fp32 values (``numel``,) of a :func:`quantize` buffer."""
    code_bytes = -(-numel * bits // 8)
    blocks = -(-numel // block)
    scale = buf[code_bytes : code_bytes + 4 * blocks].clone().view(torch.float32)  # (blocks,)
    if bits == 8:
        codes = buf[:code_bytes].view(torch.int8).float()
    else:
        packed = buf[:code_bytes]
        pairs = torch.stack([packed & 15, packed >> 4], dim=1).view(-1)[:numel]
        codes = pairs.to(torch.int16).float() - 8
    return codes * scale.repeat_interleave(block)[:numel]


# ---- the wrapper --------------------------------------------------------------------------------
class HierarchicalSharded(FullySharded):
    """ZeRO-3 placed on nodes (module docstring). ``nodes``: this rank's :class:`NodeGroups`;
    ``scheme``: one of :data:`SCHEMES`; ``weight_bits`` / ``grad_bits`` (8 or 4) and ``block``:
    ZeRO++'s quantization. Other keywords as ``ZeroDataParallel`` (stage 3, no prefetch)."""

    def __init__(
        self,
        module: nn.Module,
        *,
        nodes: NodeGroups,
        scheme: str = "zero3",
        weight_bits: int = 8,
        grad_bits: int = 4,
        block: int = 64,
        **kwargs: Any,
    ) -> None:
        if not isinstance(nodes, NodeGroups):
            raise TypeError(f"nodes = {validate.describe(nodes)}: expected node_groups(per_node)")
        self.scheme = validate.choice("scheme", scheme, SCHEMES)
        self.weight_bits = validate.choice("weight_bits", weight_bits, (8, 4))
        self.grad_bits = validate.choice("grad_bits", grad_bits, (8, 4))
        self.block = validate.count("block", block, minimum=1)
        prefetch, reshard = kwargs.get("prefetch", False), kwargs.get("reshard_after_forward", True)
        if prefetch or reshard is False:
            raise ValueError(
                f"prefetch, reshard_after_forward = {prefetch!r}, {reshard!r}: expected False, True "
                "(the defaults: these schemes gather without prefetch and reshard after forward)"
            )
        self.nodes = nodes
        self._backward = False  # which pass the next gather serves
        self._secondary: dict[int, torch.Tensor] = {}  # hpZ: id(unit) -> (N*s/g,) node shard
        broadcast_parameters(module)  # hsdp shards per node: every node starts from rank 0
        group = nodes.intra if self.scheme == "hsdp" else None
        super().__init__(module, stage=3, group=group, **kwargs)

    def secondary_bytes(self) -> int:
        """Bytes held by hpZ's secondary copies now (0 outside ZeRO++, and after ``step``)."""
        return sum(t.numel() * t.element_size() for t in self._secondary.values())

    def _pre_forward(self, i: int) -> None:
        self._backward = False
        super()._pre_forward(i)

    def _pre_backward(self, i: int) -> None:
        self._backward = True
        super()._pre_backward(i)

    def _all_gather(self, unit: Unit, *, wait: bool = True) -> torch.Tensor:
        """Fill ``unit.flat`` (N*s,) fp32: a ring over the sharding group; under ZeRO++ the
        forward gathers int8 codes over all ranks (qwZ) and backward gathers the secondary
        copy within the node (hpZ)."""
        if unit.flat is not None:
            return unit.flat
        shard = unit.shard.detach()  # (s,)
        if self.scheme != "zero++":
            unit.flat = shard.new_empty(self.world_size * shard.numel())
            ring_all_gather(unit.flat, shard, self.group)
        elif self._backward and id(unit) in self._secondary:  # hpZ: inside the node
            mine = self._secondary[id(unit)]
            unit.flat = mine.new_empty(self.nodes.per_node * mine.numel())
            ring_all_gather(unit.flat, mine, self.nodes.intra)
        else:  # qwZ: quantized, over all ranks
            unit.flat = self._quantized_gather(shard)
            g, i = self.nodes.per_node, self.nodes.local
            self._secondary[id(unit)] = unit.flat.view(g, -1)[i].clone()  # (N*s/g,)
        return unit.flat

    def _quantized_gather(self, shard: torch.Tensor) -> torch.Tensor:
        bits, block, s = self.weight_bits, self.block, shard.numel()
        q = quantize(shard, bits, block)  # (packed_bytes(s),) uint8
        words = torch.nn.functional.pad(q, (0, q.numel() % 2)).view(torch.float16)
        out = words.new_empty(self.world_size * words.numel())  # the ring checks a float dtype;
        ring_all_gather(out, words, self.group)  # it copies these bytes and adds nothing
        parts = out.view(torch.uint8).view(self.world_size, -1)
        return torch.cat([dequantize(p, s, bits, block) for p in parts])  # (N*s,)

    def _reduce_scatter_mean(self, flat_grad: torch.Tensor, name: str) -> torch.Tensor:
        """(N*s,) local gradients -> (s,) this rank's slice of their mean over all ranks."""
        if self.scheme == "zero3":
            return super()._reduce_scatter_mean(flat_grad, name)
        if self.scheme == "hsdp":  # inside the node, then the node's shard across nodes
            mine = super()._reduce_scatter_mean(flat_grad, name)  # mean over the node
            return ring_all_reduce(mine, self.nodes.inter).div_(self.nodes.nodes)
        return self._quantized_reduce_scatter(flat_grad)

    def _quantized_reduce_scatter(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """qgZ: chunk (b, j) of ``flat_grad`` belongs to rank b*g + j. Hop 1 sends local peer j
        its chunks (*, j) quantized and sums what arrives; hop 2 sends node b the node's sum of
        chunk (b, i), quantized, and sums again."""
        m, g = self.nodes.nodes, self.nodes.per_node
        a, i = self.nodes.node, self.nodes.local
        chunks = flat_grad.detach().view(m, g, -1)  # (m, g, s)
        partial = chunks[:, i].clone()  # (m, s): this node's sum of chunks (*, i), once hop 1 ends
        for d in range(1, g):
            dst, src = (i + d) % g, (i - d) % g
            got = self._swap(chunks[:, dst], dst, src, self.nodes.intra)
            partial += got.view_as(partial)
        mine = partial[a].clone()  # (s,)
        for d in range(1, m):
            dst, src = (a + d) % m, (a - d) % m
            mine += self._swap(partial[dst], dst, src, self.nodes.inter)
        return mine.div_(self.world_size)

    def _swap(self, x: torch.Tensor, dst: int, src: int, group: dist.ProcessGroup) -> torch.Tensor:
        """Send ``x`` quantized to group rank ``dst``; the same-sized values from ``src``."""
        q = quantize(x, self.grad_bits, self.block)
        got = torch.empty_like(q)
        exchange(q, dst, got, src, group)
        return dequantize(got, x.numel(), self.grad_bits, self.block)

    @torch.no_grad()
    def step(self) -> None:
        """Update the fp32 shards; the secondary copies are stale and dropped."""
        self.optimizer.step()
        self._secondary.clear()
