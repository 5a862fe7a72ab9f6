"""Pipeline parallelism: one stage's slice of the model and the AFAB and 1F1B schedules.

Stage ``r`` holds a contiguous range of blocks; stage 0 also holds the embeddings, the last
stage the final LayerNorm, the LM head and the loss. Stages exchange activations (forward)
and their gradients (backward) of shape ``[micro_batch, s, h]`` (``s / tp`` with sequence
parallelism: each TP rank sends its own sequence shard to the same TP rank of the next stage)
through ``Comm.send_recv``, which waits on every handle.

Schedules (Narayanan et al. 2021, Fig. 3/4): AFAB (GPipe, Huang et al. 2019) runs all
forwards then all backwards; 1F1B runs ``pp - r - 1`` warm-up forwards, then alternates one
forward and one backward, then drains. Both are plain functions over micro-batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from paraplan.executor.comm import Comm
from paraplan.executor.expert_parallel import ExpertParallelMoE
from paraplan.executor.grid import ProcessGrid
from paraplan.executor.model import TinyGPTConfig
from paraplan.executor.tensor_parallel import (
    ColumnParallelLinear,
    ParallelAttention,
    ParallelMLP,
    Shard,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from paraplan.simulator.step import even_split


def stage_layers(num_layers: int, pp: int,
                 layers_per_stage: Sequence[int] | None = None) -> list[range]:
    """Block indices of each stage: ``layers_per_stage`` if given, else as even as possible
    with earlier stages taking the remainder (``paraplan.simulator.step.even_split``)."""
    if layers_per_stage is None:
        layers_per_stage = even_split(num_layers, pp)
    if len(layers_per_stage) != pp or sum(layers_per_stage) != num_layers or \
            min(layers_per_stage) < 1:
        raise ValueError(f"layers_per_stage={list(layers_per_stage)} must have pp={pp} entries "
                         f">= 1 summing to num_layers={num_layers}")
    starts = [sum(layers_per_stage[:i]) for i in range(pp)]
    return [range(s, s + n) for s, n in zip(starts, layers_per_stage, strict=True)]


class ParallelBlock(nn.Module):
    """Pre-LN block: TP attention, then a TP MLP or an EP MoE (experts not TP-split)."""

    def __init__(self, cfg: TinyGPTConfig, grid: ProcessGrid, comm: Comm, sp: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = ParallelAttention(cfg, grid.tp, comm, grid.tp_group, sp)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.ffn: nn.Module = (
            ExpertParallelMoE(cfg, grid.ep, grid.ep_rank, comm, grid.ep_group)
            if cfg.num_experts else ParallelMLP(cfg, grid.tp, comm, grid.tp_group, sp))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))

    def shards(self, ref: str) -> dict[str, list[Shard]]:
        """Local parameter name -> reference shards (``ref`` = e.g. ``blocks.3``)."""
        ffn = "moe" if isinstance(self.ffn, ExpertParallelMoE) else "mlp"
        out = {f"{ln}.{p}": [Shard(f"{ref}.{ln}.{p}", None)]
               for ln in ("ln1", "ln2") for p in ("weight", "bias")}
        out |= {f"attn.{k}": v for k, v in self.attn.shards(f"{ref}.attn").items()}
        return out | {f"ffn.{k}": v for k, v in self.ffn.shards(f"{ref}.{ffn}").items()}


class PipelineStage(nn.Module):
    """This rank's part of the model: embeddings (first stage), its blocks, and the final
    norm, vocab-parallel LM head and loss (last stage).

    ``forward(x, targets)`` takes tokens ``[b, s]`` on the first stage (else the previous
    stage's activations) and returns the mean token loss on the last stage (else activations).
    ``shards`` maps each local parameter name to the reference tensors it holds.
    """

    def __init__(self, cfg: TinyGPTConfig, grid: ProcessGrid, comm: Comm, layers: range,
                 sp: bool) -> None:
        super().__init__()
        self.cfg, self.grid, self.comm, self.sp = cfg, grid, comm, sp
        self.shards: dict[str, list[Shard]] = {}
        self.piece_rows: dict[str, list[int]] = {}  # rows of each shard's piece (dim 0)
        if grid.is_first_stage:
            self.wte = VocabParallelEmbedding(cfg.vocab, cfg.hidden, grid.tp, grid.tp_rank, comm,
                                              grid.tp_group, sp)
            self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
            self.shards |= {"wte.weight": [Shard("wte.weight", 0)],
                            "wpe.weight": [Shard("wpe.weight", None)]}
        self.blocks = nn.ModuleList(ParallelBlock(cfg, grid, comm, sp) for _ in layers)
        for j, i in enumerate(layers):
            self.shards |= {f"blocks.{j}.{k}": v
                            for k, v in self.blocks[j].shards(f"blocks.{i}").items()}
        if grid.is_last_stage:
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.lm_head = ColumnParallelLinear(cfg.hidden, cfg.vocab, grid.tp, comm,
                                                grid.tp_group, sp, bias=False)
            self.shards |= {"ln_f.weight": [Shard("ln_f.weight", None)],
                            "ln_f.bias": [Shard("ln_f.bias", None)],
                            "lm_head.weight": [Shard("lm_head.weight", 0)]}

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        grid = self.grid
        if grid.is_first_stage:
            s = x.shape[1] // grid.tp if self.sp else x.shape[1]
            start = grid.tp_rank * s if self.sp else 0
            x = self.wte(x) + self.wpe(torch.arange(start, start + s, device=x.device))
        for block in self.blocks:
            x = block(x)
        if not grid.is_last_stage:
            return x
        logits = self.lm_head(self.ln_f(x))
        return vocab_parallel_cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                            grid.tp_rank * self.cfg.vocab // grid.tp, self.comm,
                                            grid.tp_group)

    def load_reference(self, state: dict[str, torch.Tensor]) -> None:
        """Copy this rank's shards of the reference ``state_dict`` into the parameters."""
        tp, r = self.grid.tp, self.grid.tp_rank
        with torch.no_grad():
            for name, p in self.named_parameters():
                pieces = [state[s.name] if s.split_dim is None
                          else state[s.name].chunk(tp, s.split_dim)[r]
                          for s in self.shards[name]]
                self.piece_rows[name] = [piece.shape[0] for piece in pieces]
                p.copy_(torch.cat(pieces, dim=0))

    def tp_replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every TP rank holds whole (their gradients are partial under SP)."""
        return [p for n, p in self.named_parameters()
                if all(s.split_dim is None for s in self.shards[n])]


class _Pipe:
    """Blocking p2p of activations/gradients with the neighbouring stages."""

    def __init__(self, comm: Comm, shape: tuple[int, ...], device: torch.device) -> None:
        self.comm, self.shape, self.device = comm, shape, device

    def exchange(self, send: torch.Tensor | None, send_to: int | None,
                 recv_from: int | None) -> torch.Tensor | None:
        """Send ``send`` to ``send_to`` and/or receive one tensor from ``recv_from`` (None =
        no such neighbour: nothing is sent or received)."""
        sends = [(send.detach(), send_to)] if send is not None and send_to is not None else []
        buf = torch.empty(self.shape, device=self.device) if recv_from is not None else None
        self.comm.send_recv(sends, [(buf, recv_from)] if buf is not None else [])
        return buf


def _forward(stage: PipelineStage, x: torch.Tensor, targets: torch.Tensor, m: int,
             times: dict[str, float]) -> torch.Tensor:
    t0 = time.perf_counter()
    y = stage(x, targets)
    if stage.grid.is_last_stage:
        y = y / m  # gradient accumulation over m micro-batches: mean of micro-batch means
    times["forward"] = times.get("forward", 0.0) + time.perf_counter() - t0
    return y


def _backward(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor | None,
              times: dict[str, float]) -> torch.Tensor | None:
    t0 = time.perf_counter()
    torch.autograd.backward(y, grad_tensors=dy)
    times["backward"] = times.get("backward", 0.0) + time.perf_counter() - t0
    return x.grad if x.requires_grad else None


def run_schedule(schedule: str, stage: PipelineStage, micro_batches: Sequence[tuple[
        torch.Tensor, torch.Tensor]], comm: Comm, act_shape: tuple[int, ...],
        times: dict[str, float]) -> torch.Tensor:
    """Forward and backward every ``(tokens, targets)`` micro-batch with ``schedule``
    (``"afab"``/``"gpipe"`` or ``"1f1b"``), accumulating parameter gradients.

    Returns the mean micro-batch loss on the last stage (a 0-d tensor), 0 elsewhere; adds
    seconds to ``times["forward"]`` and ``times["backward"]`` (TP/EP communication inside).
    """
    grid, m = stage.grid, len(micro_batches)
    device = micro_batches[0][0].device
    pipe = _Pipe(comm, act_shape, device)
    prev, nxt = grid.prev_rank, grid.next_rank
    loss = torch.zeros((), device=device)
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def fwd(i: int, received: torch.Tensor | None) -> torch.Tensor:
        nonlocal loss
        # The stage input: tokens on the first stage, else the received activations.
        x = micro_batches[i][0] if received is None else received.requires_grad_()
        y = _forward(stage, x, micro_batches[i][1], m, times)
        inputs.append(x)
        outputs.append(y)
        if grid.is_last_stage:
            loss = loss + y.detach()
        return y

    def bwd(dy: torch.Tensor | None) -> torch.Tensor | None:
        return _backward(inputs.pop(0), outputs.pop(0), dy, times)

    if schedule in ("afab", "gpipe"):
        for i in range(m):
            pipe.exchange(fwd(i, pipe.exchange(None, None, prev)), nxt, None)
        for _ in range(m):
            pipe.exchange(bwd(pipe.exchange(None, None, nxt)), prev, None)
    elif schedule == "1f1b":
        warmup = min(grid.pp - grid.pp_rank - 1, m)
        for i in range(warmup):
            pipe.exchange(fwd(i, pipe.exchange(None, None, prev)), nxt, None)
        received = pipe.exchange(None, None, prev) if m > warmup else None
        for i in range(warmup, m):
            dy = pipe.exchange(fwd(i, received), nxt, nxt)  # send activation, receive grad
            dx = bwd(dy)
            last = i == m - 1
            received = pipe.exchange(dx, prev, None if last else prev)
        for _ in range(warmup):
            pipe.exchange(bwd(pipe.exchange(None, None, nxt)), prev, None)
    else:
        raise ValueError(f"schedule={schedule!r} is not one of 'afab', 'gpipe', '1f1b'")
    return loss

