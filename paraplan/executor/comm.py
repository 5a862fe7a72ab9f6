"""The one door to torch.distributed: every collective and p2p transfer the trainer makes.

``Comm`` counts, per rank, the payload bytes and wall seconds of each call by kind, so the
simulator's communication volumes can be checked against a real run.

Byte-counting contract (``Comm.bytes_by_kind``; the simulator predicts these exactly):

- One count per call, on every rank that takes part: the payload ``numel * element_size``
  bytes of ONE tensor, named below. These are payload bytes, not wire bytes (a ring
  all-reduce of S bytes puts 2(n-1)/n * S on each rank's link; that factor is the
  simulator's business).
- ``"all_reduce"``: the tensor reduced (input = output size).
- ``"all_gather"``: the INPUT shard this rank contributes (the output is ``n`` times larger).
- ``"reduce_scatter"``: the full INPUT (unsharded) tensor (the output shard is ``1/n`` of it).
- ``"all_to_all"``: the INPUT tensor (equal splits; this rank keeps ``1/n`` of it).
- ``"p2p_send"``: each sent tensor, on the sender only (receives are not counted).
- ``"broadcast"``: the tensor, on every rank of the group (source and receivers alike).
- Calls on a group of one rank are no-ops and count 0 bytes and 0 seconds.
- Metrics and test-only gathers bypass ``Comm`` (they are not part of training traffic).

``seconds_by_kind`` holds wall seconds per kind (``time.perf_counter``; on CUDA the device is
synchronised before the clock stops). For p2p, ``"p2p_send"`` seconds cover issuing AND
waiting for a whole batch of sends and receives (the pipeline's blocking transfer).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                          "p2p_send", "broadcast")

# torch >= 2.11 renamed the tensor-in/tensor-out collectives; older versions have the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                          or dist.reduce_scatter_tensor)


def payload_bytes(tensor: torch.Tensor) -> int:
    """Payload size of ``tensor`` in bytes: ``numel * element_size``."""
    return tensor.numel() * tensor.element_size()


def uncounted_all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                         dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim``, OUTSIDE the byte contract (for
    metrics and test aids only; training traffic goes through ``Comm``)."""
    return _gather(tensor.contiguous(), group, dist.get_world_size(group), dim)


def _gather(shard: torch.Tensor, group: dist.ProcessGroup | None, n: int,
            dim: int) -> torch.Tensor:
    """All-gather of flat buffers (gloo wants output = n x input along dim 0), then concat."""
    out = torch.empty(n * shard.numel(), dtype=shard.dtype, device=shard.device)
    all_gather_single(out, shard.view(-1), group=group)
    if dim == 0:  # rank-major is already the gathered layout: no copy
        return out.view(n * shard.shape[0], *shard.shape[1:])
    return torch.cat(out.view(n, *shard.shape).unbind(0), dim=dim)


class Comm:
    """Counting, timing wrapper around the torch.distributed calls the trainer uses.

    Attributes:
        bytes_by_kind: payload bytes per kind (see the module docstring for the contract).
        seconds_by_kind: wall seconds per kind.
        calls_by_kind: number of calls per kind (groups of one rank excluded).
    """

    def __init__(self) -> None:
        self.bytes_by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.seconds_by_kind: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        self.calls_by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)

    @contextmanager
    def _record(self, kind: str, nbytes: int, tensor: torch.Tensor) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        self.seconds_by_kind[kind] += time.perf_counter() - start
        self.bytes_by_kind[kind] += nbytes
        self.calls_by_kind[kind] += 1

    def reset(self) -> None:
        """Zero every counter."""
        self.__init__()

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """Reduce ``tensor`` in place over ``group``; returns it. Counts ``tensor``'s bytes."""
        if dist.get_world_size(group) == 1:
            return tensor
        with self._record("all_reduce", payload_bytes(tensor), tensor):
            dist.all_reduce(tensor, op=op, group=group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: dist.ProcessGroup,
                   dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim`` in group-rank order.

        Counts the input shard's bytes."""
        n = dist.get_world_size(group)
        if n == 1:
            return tensor
        shard = tensor.contiguous()
        with self._record("all_gather", payload_bytes(shard), shard):
            return _gather(shard, group, n, dim)

    def reduce_scatter(self, tensor: torch.Tensor, group: dist.ProcessGroup,
                       dim: int = 0) -> torch.Tensor:
        """Sum ``tensor`` over ``group``; return this rank's ``1/n`` chunk along ``dim``.

        Counts the full input's bytes. Raises ValueError if ``n`` does not divide the size."""
        n = dist.get_world_size(group)
        if n == 1:
            return tensor
        if tensor.shape[dim] % n:
            raise ValueError(f"reduce_scatter: size {tensor.shape[dim]} along dim {dim} is not "
                             f"divisible by the group size {n}")
        chunks = tensor.chunk(n, dim=dim)
        if dim == 0 and tensor.is_contiguous():  # chunk-major already: reduce in place
            flat = tensor.view(-1)
        else:
            flat = torch.cat([c.reshape(-1) for c in chunks])
        out = torch.empty(chunks[0].numel(), dtype=tensor.dtype, device=tensor.device)
        with self._record("reduce_scatter", payload_bytes(tensor), tensor):
            reduce_scatter_single(out, flat, group=group)
        return out.view(chunks[0].shape)

    def all_to_all(self, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """Equal-split all-to-all: chunk ``i`` of dim 0 goes to group rank ``i``; the output's
        chunk ``j`` came from group rank ``j``. Counts the input's bytes."""
        n = dist.get_world_size(group)
        if n == 1:
            return tensor
        if tensor.shape[0] % n:
            raise ValueError(f"all_to_all: dim 0 size {tensor.shape[0]} is not divisible by "
                             f"the group size {n}")
        inp = tensor.contiguous()
        out = torch.empty_like(inp)
        with self._record("all_to_all", payload_bytes(inp), inp):
            dist.all_to_all_single(out, inp, group=group)
        return out

    def broadcast(self, tensor: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
        """Broadcast ``tensor`` in place from global rank ``src``. Counts its bytes on every
        rank of the group."""
        if dist.get_world_size(group) == 1:
            return tensor
        with self._record("broadcast", payload_bytes(tensor), tensor):
            dist.broadcast(tensor, src=src, group=group)
        return tensor

    def send_recv(self, sends: Sequence[tuple[torch.Tensor, int]] = (),
                  recvs: Sequence[tuple[torch.Tensor, int]] = ()) -> None:
        """Post ``(tensor, dst)`` sends and ``(tensor, src)`` receives (global ranks) as one
        batch and wait on EVERY returned handle (gloo returns several; pytorch #132644).

        Counts each sent tensor's bytes under ``"p2p_send"``."""
        if not sends and not recvs:
            return
        ops = [dist.P2POp(dist.isend, t.contiguous(), peer) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
        sent = sum(payload_bytes(t) for t, _ in sends)
        with self._record("p2p_send", sent, ops[0].tensor):
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if not sends:  # a receive-only batch is timed but is not a send call
            self.calls_by_kind["p2p_send"] -= 1

    def isend(self, tensor: torch.Tensor, dst: int) -> dist.Work:
        """Post one send to global rank ``dst``; the caller must ``wait()`` on the handle.

        Counts the tensor's bytes; the seconds cover posting only."""
        with self._record("p2p_send", payload_bytes(tensor), tensor):
            return dist.isend(tensor.contiguous(), dst)

    def irecv(self, tensor: torch.Tensor, src: int) -> dist.Work:
        """Post one receive from global rank ``src``; the caller must ``wait()`` on it.

        Not counted (receives are the senders' bytes)."""
        return dist.irecv(tensor, src)
