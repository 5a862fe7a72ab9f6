"""Megatron-style tensor parallelism (Shoeybi et al. 2019) with optional sequence parallelism
(Korthikanti et al. 2022, Fig. 5), as ``nn.Module``s over the counting ``Comm``.

Activations are ``[b, s, h]``. Without SP a TP region is entered with ``f`` (identity forward,
all-reduce backward) and left with ``g`` (all-reduce forward, identity backward). With SP the
activations outside TP regions are split along the sequence (``[b, s/tp, h]``): the region is
entered with an all-gather along ``s`` (reduce-scatter backward) and left with a
reduce-scatter along ``s`` (all-gather backward).

``Shard`` records how a local parameter maps back to reference (single-process) tensors, so
the same description loads weights from the reference and gathers gradients for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from paraplan.executor.comm import Comm
from paraplan.executor.model import TinyGPTConfig, causal_attention


@dataclass(frozen=True)
class Shard:
    """One reference tensor held (in part) by a local parameter.

    A local parameter is the concatenation along its dim 0 of its shards' pieces; a piece is
    ``reference[name].chunk(tp, split_dim)[tp_rank]``, or the whole tensor when ``split_dim``
    is None (replicated across TP ranks).
    """

    name: str
    split_dim: int | None


class _TPRegion(torch.autograd.Function):
    """Enter (``enter=True``) or leave a TP region; see the module docstring for the math."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, group: dist.ProcessGroup, enter: bool,
                sp: bool) -> torch.Tensor:
        ctx.comm, ctx.group, ctx.enter, ctx.sp = comm, group, enter, sp
        ctx.alone = dist.get_world_size(group) == 1
        if ctx.alone or (enter and not sp):  # identity (Megatron's copy_to_region)
            return x.view_as(x)
        if enter:
            return comm.all_gather(x, group, dim=1)
        return comm.reduce_scatter(x, group, dim=1) if sp else comm.all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        comm, group = ctx.comm, ctx.group
        if ctx.alone:
            return grad, None, None, None, None
        if ctx.enter:
            grad = (comm.reduce_scatter(grad, group, dim=1) if ctx.sp
                    else comm.all_reduce(grad.clone(), group))
        elif ctx.sp:
            grad = comm.all_gather(grad, group, dim=1)
        return grad, None, None, None, None


def enter_tp(x: torch.Tensor, comm: Comm, group: dist.ProcessGroup, sp: bool) -> torch.Tensor:
    """``f`` (identity / all-reduce grad) or, with SP, all-gather along the sequence."""
    return _TPRegion.apply(x, comm, group, True, sp)


def exit_tp(x: torch.Tensor, comm: Comm, group: dist.ProcessGroup, sp: bool) -> torch.Tensor:
    """``g`` (all-reduce / identity grad) or, with SP, reduce-scatter along the sequence."""
    return _TPRegion.apply(x, comm, group, False, sp)


class ColumnParallelLinear(nn.Module):
    """``Y = X W + b`` with ``W [in, out]`` split along its second dimension (columns).

    Each rank holds ``out / tp`` output features (torch layout ``weight [out/tp, in]``) and
    returns its slice of ``Y``; with ``gather_input`` the input is first brought into the TP
    region (``f``, or the SP all-gather)."""

    def __init__(self, in_features: int, out_features: int, tp: int, comm: Comm,
                 group: dist.ProcessGroup, sp: bool, bias: bool = True,
                 gather_input: bool = True) -> None:
        super().__init__()
        self.comm, self.group, self.sp, self.gather_input = comm, group, sp, gather_input
        self.weight = nn.Parameter(torch.empty(out_features // tp, in_features))
        self.bias = nn.Parameter(torch.empty(out_features // tp)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gather_input:
            x = enter_tp(x, self.comm, self.group, self.sp)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``Y = X W + b`` with ``W [in, out]`` split along its first dimension (rows).

    The input arrives split along its last dimension (the output of a column-parallel layer);
    partial products are summed over TP (``g``, or the SP reduce-scatter) and the replicated
    bias is added after the sum."""

    def __init__(self, in_features: int, out_features: int, tp: int, comm: Comm,
                 group: dist.ProcessGroup, sp: bool, bias: bool = True) -> None:
        super().__init__()
        self.comm, self.group, self.sp = comm, group, sp
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = exit_tp(F.linear(x, self.weight), self.comm, self.group, self.sp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """``E[token]`` with the table ``E [vocab, h]`` split along the vocabulary.

    Rank ``r`` holds rows ``[r V/tp, (r+1) V/tp)``, looks up the tokens it owns (zeros for the
    rest) and the partial embeddings are summed over TP (all-reduce, or the SP reduce-scatter,
    which leaves ``[b, s/tp, h]``)."""

    def __init__(self, vocab: int, hidden: int, tp: int, tp_rank: int, comm: Comm,
                 group: dist.ProcessGroup, sp: bool) -> None:
        super().__init__()
        self.comm, self.group, self.sp = comm, group, sp
        self.start, self.end = tp_rank * vocab // tp, (tp_rank + 1) * vocab // tp
        self.weight = nn.Parameter(torch.empty(vocab // tp, hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.start) | (tokens >= self.end)
        local = (tokens - self.start).masked_fill(outside, 0)
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return exit_tp(partial, self.comm, self.group, self.sp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token ``log(sum_v exp(z_v)) - z_target`` with ``z`` split along the vocabulary.

    Three all-reduces of ``N`` floats each over TP: max (stability), sum of exponentials and
    the target logit (Megatron ``vocab_parallel_cross_entropy``). Backward is local:
    ``dz = softmax(z) - onehot(target)``."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, start: int, comm: Comm,
                group: dist.ProcessGroup) -> torch.Tensor:
        z_max = comm.all_reduce(logits.max(dim=-1).values, group, op=dist.ReduceOp.MAX)
        z = logits - z_max.unsqueeze(-1)
        exp = z.exp()
        sum_exp = comm.all_reduce(exp.sum(dim=-1), group)
        inside = (targets >= start) & (targets < start + logits.shape[-1])
        idx = (targets - start).masked_fill(~inside, 0)
        z_target = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        z_target = comm.all_reduce(z_target, group)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), idx, inside)
        return sum_exp.log() - z_target

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, idx, inside = ctx.saved_tensors
        dz = softmax * grad.unsqueeze(-1)
        rows = inside.nonzero(as_tuple=True)[0]
        dz[rows, idx[rows]] -= grad[rows]
        return dz, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, start: int,
                                 comm: Comm, group: dist.ProcessGroup) -> torch.Tensor:
    """Mean token cross-entropy of ``logits [N, V/tp]`` (this rank's vocabulary slice starts
    at ``start``) against ``targets [N]``; the same value on every TP rank."""
    return _VocabParallelCrossEntropy.apply(logits, targets, start, comm, group).mean()


class ParallelAttention(nn.Module):
    """Causal GQA attention with heads split across TP: one fused column-parallel QKV
    (``heads/tp`` query and ``kv_heads/tp`` KV heads per rank) and a row-parallel output."""

    def __init__(self, cfg: TinyGPTConfig, tp: int, comm: Comm, group: dist.ProcessGroup,
                 sp: bool) -> None:
        super().__init__()
        d = cfg.head_dim
        self.heads, self.kv_heads = cfg.heads // tp, cfg.kv_heads // tp
        self.split = [self.heads * d, self.kv_heads * d, self.kv_heads * d]
        self.qkv = ColumnParallelLinear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * d, tp,
                                        comm, group, sp)
        self.o = RowParallelLinear(cfg.heads * d, cfg.hidden, tp, comm, group, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        return self.o(causal_attention(q, k, v, self.heads, self.kv_heads))

    @staticmethod
    def shards(ref: str) -> dict[str, list[Shard]]:
        """Local parameter name -> reference shards (``ref`` = e.g. ``blocks.0.attn``)."""
        return {f"qkv.{p}": [Shard(f"{ref}.{m}.{p}", 0) for m in "qkv"]
                for p in ("weight", "bias")} | {"o.weight": [Shard(f"{ref}.o.weight", 1)],
                                                "o.bias": [Shard(f"{ref}.o.bias", None)]}


class ParallelMLP(nn.Module):
    """``fc2(gelu(fc1(x)))`` with ``fc1`` column-parallel and ``fc2`` row-parallel."""

    def __init__(self, cfg: TinyGPTConfig, tp: int, comm: Comm, group: dist.ProcessGroup,
                 sp: bool) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(cfg.hidden, cfg.ffn_hidden, tp, comm, group, sp)
        self.fc2 = RowParallelLinear(cfg.ffn_hidden, cfg.hidden, tp, comm, group, sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))

    @staticmethod
    def shards(ref: str) -> dict[str, list[Shard]]:
        """Local parameter name -> reference shards (``ref`` = e.g. ``blocks.0.mlp``)."""
        return {"fc1.weight": [Shard(f"{ref}.fc1.weight", 0)],
                "fc1.bias": [Shard(f"{ref}.fc1.bias", 0)],
                "fc2.weight": [Shard(f"{ref}.fc2.weight", 1)],
                "fc2.bias": [Shard(f"{ref}.fc2.bias", None)]}
