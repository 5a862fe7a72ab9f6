"""Data parallelism: bucketed gradient all-reduce, and ZeRO-1 (sharded optimizer states).

Both work on ONE flat buffer per parameter group, as Megatron-Core's distributed data
parallel does (its contiguous ``grad_buffer`` split into buckets): the gradients of the
group's parameters are laid end to end in REVERSE parameter order (the order backward makes
them ready, as PyTorch DDP), zero-padded at the end to a multiple ``P`` of a ``multiple``
(1 for plain DP, the group size ``n`` for ZeRO-1), and cut into consecutive buckets of
``bucket_elements`` elements rounded down to that multiple (the last bucket takes the rest).
Buckets may split a parameter. Gradients are synchronised after the whole backward pass (no
overlap with it).

Plain DP (``zero_stage=0``): one all-reduce (sum) per bucket, then a division by ``divisor``
(the dp degree: the mean over replicas). Bytes per step (``Comm`` contract): ``all_reduce =
4 * (parameters in the group)`` in fp32, whatever the bucket size.

ZeRO-1 (``zero_stage=1``; Rajbhandari et al. 2020, P_os; Megatron's distributed-optimizer
layout): each bucket (a multiple of ``n`` long) is reduce-scattered; rank ``r`` keeps chunk
``r`` of every bucket, divides it by ``divisor``, holds fp32 optimizer states for it only,
steps, and the updated chunks are all-gathered back into the parameters. Bytes per step:
``reduce_scatter = 4 * P`` and ``all_gather = 4 * P / n`` with ``P = ceil(params / n) * n``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from paraplan.executor.comm import Comm, uncounted_all_gather

DEFAULT_BUCKET_ELEMENTS = 25_000_000


def padded_size(numel: int, multiple: int) -> int:
    """``numel`` rounded up to a multiple of ``multiple``."""
    return -(-numel // multiple) * multiple


def bucket_bounds(numel: int, bucket_elements: int, multiple: int = 1) -> list[tuple[int, int]]:
    """``(start, end)`` element ranges of the buckets of a flat buffer of ``numel`` elements
    padded to a multiple of ``multiple`` (see the module docstring); every range's length is
    a multiple of ``multiple``."""
    if bucket_elements < 1 or multiple < 1:
        raise ValueError(f"bucket_elements={bucket_elements} and multiple={multiple} must be "
                         ">= 1")
    total = padded_size(numel, multiple)
    size = max(multiple, bucket_elements // multiple * multiple)
    return [(start, min(start + size, total)) for start in range(0, total, size)]


class FlatGroup:
    """A group of parameters seen as one flat, padded buffer (reverse parameter order).

    With ``grad_views`` the group owns a gradient buffer and every parameter's ``.grad`` is a
    view into it (PyTorch DDP's ``gradient_as_bucket_view``, Megatron's ``main_grad``):
    backward accumulates straight into the buffer and the collectives run on its buckets in
    place, with no copies. Call ``zero_grad`` before each step's first backward.

    Args:
        params: the parameters (any order; the buffer holds them reversed).
        bucket_elements: elements per bucket (rounded down to ``multiple``).
        multiple: the buffer is zero-padded to a multiple of this.
        grad_views: keep a gradient buffer whose views are the parameters' ``.grad``.
    """

    def __init__(self, params: Sequence[nn.Parameter], bucket_elements: int,
                 multiple: int = 1, grad_views: bool = False) -> None:
        self.params = list(reversed(list(params)))
        self.numel = sum(p.numel() for p in self.params)
        self.padded = padded_size(self.numel, multiple)
        self.bounds = bucket_bounds(self.numel, bucket_elements, multiple)
        device = self.params[0].device if self.params else None
        self.grad_buffer = torch.zeros(self.padded, device=device) if grad_views else None

    def zero_grad(self) -> None:
        """Zero the gradient buffer and (re)make every ``.grad`` a view into it."""
        if self.grad_buffer is None:
            raise ValueError("zero_grad needs a FlatGroup made with grad_views=True")
        self.grad_buffer.zero_()
        offset = 0
        for p in self.params:
            p.grad = self.grad_buffer[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def flat(self, attr: str) -> torch.Tensor:
        """The parameters' ``.grad`` (zeros where None) or ``.data``, flattened and padded
        (the gradient buffer itself, not a copy, when the grads are views into it)."""
        if attr == "grad" and self.grad_buffer is not None:
            return self.grad_buffer
        pieces = [(p.grad if p.grad is not None else torch.zeros_like(p)) if attr == "grad"
                  else p.detach() for p in self.params]
        flat = torch.cat([x.reshape(-1) for x in pieces]) if pieces else torch.zeros(0)
        return nn.functional.pad(flat, (0, self.padded - flat.numel()))

    def scatter(self, flat: torch.Tensor, attr: str) -> None:
        """Copy consecutive slices of ``flat`` into each parameter's ``.grad`` (in place when
        it exists, so views stay views) or ``.data``."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                piece = flat[offset:offset + p.numel()].view_as(p)
                if attr != "grad":
                    p.data.copy_(piece)
                elif p.grad is None:
                    p.grad = piece.clone()
                else:
                    p.grad.copy_(piece)
                offset += p.numel()


def all_reduce_gradients(group_params: FlatGroup, comm: Comm, group: dist.ProcessGroup,
                         divisor: int) -> None:
    """Sum the group's gradients over ``group`` (one all-reduce per bucket) and divide by
    ``divisor``; nothing at all for a group of one rank with ``divisor`` 1."""
    if not group_params.params or (dist.get_world_size(group) == 1 and divisor == 1):
        return
    flat = group_params.flat("grad")
    for start, end in group_params.bounds:
        comm.all_reduce(flat[start:end], group)  # a view: reduced in place
    if group_params.grad_buffer is not None:
        flat.div_(divisor)  # the .grad views see it
    else:
        group_params.scatter(flat / divisor, "grad")


class ZeroOneOptimizer:
    """ZeRO-1 over ``group``: this rank owns chunk ``rank`` of every bucket of the flat
    buffer (padded to a multiple of the group size).

    Args:
        flat_group: the parameters whose optimizer states are sharded, as a flat buffer
            padded to a multiple of the group size.
        comm: counting communicator.
        group: the data-parallel group the optimizer states are sharded over.
        divisor: what the summed gradients are divided by (the dp degree).
        make_optimizer: builds a torch optimizer over a list of shard tensors.
    """

    def __init__(self, flat_group: FlatGroup, comm: Comm, group: dist.ProcessGroup,
                 divisor: int,
                 make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> None:
        self.comm, self.group, self.divisor = comm, group, divisor
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if flat_group.padded % self.n:
            raise ValueError(f"ZeRO-1 needs the flat buffer padded to a multiple of the group "
                             f"size {self.n}; it has {flat_group.padded} elements")
        self.flat_group = flat_group
        flat = self.flat_group.flat("data")
        self.shards = [flat[s:e].chunk(self.n)[self.rank].clone().requires_grad_()
                       for s, e in self.flat_group.bounds]
        self.optimizer = make_optimizer(self.shards)

    def reduce_scatter_gradients(self) -> None:
        """Reduce-scatter every bucket's gradients into this rank's chunk's ``.grad``."""
        flat = self.flat_group.flat("grad")
        for (start, end), shard in zip(self.flat_group.bounds, self.shards, strict=True):
            shard.grad = self.comm.reduce_scatter(flat[start:end], self.group) / self.divisor

    def step(self) -> None:
        """Step the sharded optimizer, then all-gather the updated chunks into the params."""
        self.optimizer.step()
        with torch.no_grad():
            gathered = [self.comm.all_gather(shard.detach(), self.group) for shard in self.shards]
            self.flat_group.scatter(torch.cat(gathered), "data")

    def zero_grad(self) -> None:
        """Drop the shard gradients (the parameters' ``.grad`` are the caller's)."""
        for shard in self.shards:
            shard.grad = None

    def gather_gradients_for_test(self) -> None:
        """Write the full reduced gradients into every parameter's ``.grad`` with an
        UNCOUNTED all-gather (a test aid; not training traffic)."""
        full = [uncounted_all_gather(shard.grad, self.group) for shard in self.shards]
        self.flat_group.scatter(torch.cat(full), "grad")
