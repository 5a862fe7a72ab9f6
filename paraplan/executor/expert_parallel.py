"""Expert parallelism: a top-k MoE layer whose experts are split over the EP group, with
all-to-all dispatch and combine of the routed tokens (GShard, Lepikhin et al. 2020).

Dispatch uses FIXED-SIZE PADDED buffers, so the bytes moved do not depend on the routing:

1. Every rank routes its ``T`` local tokens (softmax router, top-k, weights not renormalised,
   exactly as ``model.MoE``) and sorts its ``T*k`` (token, expert) assignments by expert.
2. ``counts`` (``[ep, E/ep]`` int64: assignments per destination rank and local expert) go
   through one all-to-all, so each rank knows how many rows per expert it receives.
3. Tokens go through one all-to-all of a ``[ep * C, h]`` buffer with capacity
   ``C = T * k`` rows per destination (enough if every assignment picks the same rank; no
   token is ever dropped), padded with zeros. Rows for one destination are ordered by expert.
4. Each rank runs its ``E/ep`` experts on the rows it received and sends a buffer of the same
   shape back (the combine all-to-all); the source weights each row by its router probability
   and sums the ``k`` rows of every token.

Bytes counted per MoE layer and micro-batch on each rank when ``ep > 1`` (``Comm`` contract):
``all_to_all = 8 E + 2 * (4 ep T k h)`` in the forward pass (counts, dispatch, combine) and
``2 * (4 ep T k h)`` in the backward pass (the transposes of dispatch and combine), fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraplan.executor.comm import Comm
from paraplan.executor.model import MLP, TinyGPTConfig, route
from paraplan.executor.tensor_parallel import Shard


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all; its gradient is the same all-to-all of the output gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.comm, ctx.group = comm, group
        return comm.all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.comm.all_to_all(grad, ctx.group), None, None


class ExpertParallelMoE(nn.Module):
    """MoE layer holding experts ``[ep_rank * E/ep, (ep_rank + 1) * E/ep)``; the router is
    replicated. Input and output ``[b, s, h]`` (the local tokens of this rank)."""

    def __init__(self, cfg: TinyGPTConfig, ep: int, ep_rank: int, comm: Comm,
                 group: dist.ProcessGroup) -> None:
        super().__init__()
        if cfg.num_experts % ep:
            raise ValueError(f"ep={ep} does not divide num_experts={cfg.num_experts}")
        self.cfg, self.ep, self.ep_rank, self.comm, self.group = cfg, ep, ep_rank, comm, group
        self.local_experts = cfg.num_experts // ep
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.hidden, cfg.ffn_hidden)
                                     for _ in range(self.local_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        tokens, k, ep, epr = flat.shape[0], self.cfg.top_k, self.ep, self.local_experts
        weights, experts = route(self.router(flat), k)
        # Sort the T*k assignments by expert (hence by destination rank).
        expert_of = experts.reshape(-1)
        order = torch.argsort(expert_of, stable=True)
        token_sorted, weight_sorted = order // k, weights.reshape(-1)[order]
        dest = expert_of[order] // epr
        counts = torch.bincount(expert_of, minlength=self.cfg.num_experts).view(ep, epr)
        per_dest = counts.sum(dim=1)
        first_of_dest = (per_dest.cumsum(0) - per_dest)[dest]
        position = torch.arange(order.numel(), device=flat.device) - first_of_dest
        capacity = tokens * k
        slot = dest * capacity + position
        send = flat.new_zeros(ep * capacity, flat.shape[1]).index_copy(0, slot,
                                                                       flat[token_sorted])
        recv_counts = self.comm.all_to_all(counts, self.group).tolist()
        recv = _AllToAll.apply(send, self.comm, self.group)
        out = self._run_experts(recv, recv_counts, capacity)
        back = _AllToAll.apply(out, self.comm, self.group)
        rows = back[slot] * weight_sorted.unsqueeze(-1)
        return flat.new_zeros(flat.shape).index_add(0, token_sorted, rows).view_as(x)

    def _run_experts(self, recv: torch.Tensor, counts: list[list[int]],
                     capacity: int) -> torch.Tensor:
        """Apply local expert ``e`` to the rows source ``s`` sent it (``counts[s][e]`` rows
        after the rows of experts ``< e`` in the source's block of ``capacity`` rows)."""
        out = torch.zeros_like(recv)
        for e, expert in enumerate(self.experts):
            rows = [torch.arange(n, device=recv.device) + s * capacity + sum(counts[s][:e])
                    for s in range(self.ep) if (n := counts[s][e])]
            if rows:
                idx = torch.cat(rows)
                out = out.index_copy(0, idx, expert(recv[idx]))
        return out

    def shards(self, ref: str) -> dict[str, list[Shard]]:
        """Local parameter name -> reference tensors (``ref`` = e.g. ``blocks.0.moe``);
        local expert ``j`` is reference expert ``ep_rank * E/ep + j``."""
        out = {"router.weight": [Shard(f"{ref}.router.weight", None)]}
        for j in range(self.local_experts):
            g = self.ep_rank * self.local_experts + j
            for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
                out[f"experts.{j}.{p}"] = [Shard(f"{ref}.experts.{g}.{p}", None)]
        return out
