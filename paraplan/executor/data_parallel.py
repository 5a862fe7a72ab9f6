"""Data parallelism: bucketed gradient all-reduce, and ZeRO-1 (sharded optimizer states).

Gradients are synchronised after the whole backward pass (no overlap with it), bucket by
bucket. Buckets are filled in REVERSE parameter order (the order gradients become ready, as
PyTorch DDP) and a bucket is closed before a parameter that would push it past
``bucket_elements`` elements (a parameter larger than that gets a bucket of its own).

Plain DP (``zero_stage=0``): per bucket, one all-reduce (sum) of the flattened gradients, then
a division by ``divisor`` (the dp degree: the mean over data-parallel replicas). Bytes:
``all_reduce = 4 * (number of parameters)`` per step in fp32.

ZeRO-1 (``zero_stage=1``; Rajbhandari et al. 2020, Pos; the Megatron distributed-optimizer
layout): per bucket, the flattened gradients, zero-padded to a multiple ``P`` of the group
size ``n``, are reduce-scattered; each rank divides its ``P/n`` shard by ``divisor``, keeps
fp32 master weights and optimizer states for that shard only, steps, and the updated shards
are all-gathered back into the parameters. Bytes per step: ``reduce_scatter = 4 * sum P``,
``all_gather = 4 * sum P / n``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from paraplan.executor.comm import Comm, uncounted_all_gather

DEFAULT_BUCKET_ELEMENTS = 25_000_000


def make_buckets(params: Sequence[nn.Parameter],
                 bucket_elements: int = DEFAULT_BUCKET_ELEMENTS) -> list[list[nn.Parameter]]:
    """Split ``params`` into buckets of at most ``bucket_elements`` elements (see module
    docstring), in reverse order."""
    if bucket_elements < 1:
        raise ValueError(f"bucket_elements={bucket_elements} must be >= 1")
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in reversed(list(params)):
        if not buckets or size + p.numel() > bucket_elements:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    return buckets


def _flat_grad(bucket: Sequence[nn.Parameter], padded: int) -> torch.Tensor:
    grads = [torch.zeros_like(p).reshape(-1) if p.grad is None else p.grad.reshape(-1)
             for p in bucket]
    flat = torch.cat(grads)
    return nn.functional.pad(flat, (0, padded - flat.numel()))


def _scatter_back(flat: torch.Tensor, bucket: Sequence[nn.Parameter], attr: str) -> None:
    """Copy consecutive slices of ``flat`` into each parameter's ``.grad`` or ``.data``."""
    offset = 0
    for p in bucket:
        piece = flat[offset:offset + p.numel()].view_as(p)
        if attr == "grad":
            p.grad = piece.clone()
        else:
            p.data.copy_(piece)
        offset += p.numel()


def all_reduce_gradients(buckets: Sequence[Sequence[nn.Parameter]], comm: Comm,
                         group: dist.ProcessGroup, divisor: int) -> None:
    """Sum every bucket's gradients over ``group`` (one all-reduce per bucket; none for a group
    of one rank) and divide by ``divisor``."""
    for bucket in buckets:
        flat = _flat_grad(bucket, sum(p.numel() for p in bucket))
        comm.all_reduce(flat, group)
        _scatter_back(flat / divisor, bucket, "grad")


class ZeroOneOptimizer:
    """ZeRO-1 over ``group``: this rank owns shard ``rank`` of every (padded) bucket.

    Args:
        buckets: parameter buckets (from ``make_buckets``).
        comm: counting communicator.
        group: the data-parallel group the optimizer states are sharded over.
        divisor: what the summed gradients are divided by (the dp degree).
        make_optimizer: builds a torch optimizer over a list of shard tensors.
    """

    def __init__(self, buckets: Sequence[Sequence[nn.Parameter]], comm: Comm,
                 group: dist.ProcessGroup, divisor: int,
                 make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> None:
        self.buckets, self.comm, self.group, self.divisor = buckets, comm, group, divisor
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.padded = [-(-sum(p.numel() for p in b) // self.n) * self.n for b in buckets]
        self.shards: list[torch.Tensor] = []
        with torch.no_grad():
            for bucket, padded in zip(buckets, self.padded, strict=True):
                flat = torch.cat([p.detach().reshape(-1) for p in bucket])
                flat = nn.functional.pad(flat, (0, padded - flat.numel()))
                shard = flat.chunk(self.n)[self.rank].clone()
                self.shards.append(shard.requires_grad_())
        self.optimizer = make_optimizer(self.shards)

    def reduce_scatter_gradients(self) -> None:
        """Reduce-scatter every bucket's gradients into this rank's shard's ``.grad``."""
        for bucket, padded, shard in zip(self.buckets, self.padded, self.shards, strict=True):
            flat = _flat_grad(bucket, padded)
            shard.grad = self.comm.reduce_scatter(flat, self.group) / self.divisor

    def step(self) -> None:
        """Step the sharded optimizer, then all-gather the updated shards into the params."""
        self.optimizer.step()
        with torch.no_grad():
            for bucket, shard in zip(self.buckets, self.shards, strict=True):
                _scatter_back(self.comm.all_gather(shard.detach(), self.group), bucket, "data")

    def zero_grad(self) -> None:
        """Drop the shard gradients (the parameters' ``.grad`` are the caller's)."""
        for shard in self.shards:
            shard.grad = None

    def gather_gradients_for_test(self) -> None:
        """Write the full reduced gradients into every parameter's ``.grad`` with an
        UNCOUNTED all-gather (a test aid; not training traffic)."""
        for bucket, shard in zip(self.buckets, self.shards, strict=True):
            _scatter_back(uncounted_all_gather(shard.grad, self.group), bucket, "grad")
