"""Run executor configs in real torch.distributed (gloo, CPU) processes for the tests."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paraplan.executor.train import train_worker


def _worker(rank: int, world_size: int, workdir: str, configs: list[dict[str, Any]]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=90))
    try:
        results = [train_worker(rank, world_size, config) for config in configs]
        torch.save(results, f"{workdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_distributed(world_size: int, configs: list[dict[str, Any]],
                    workdir: Path) -> list[list[dict[str, Any]]]:
    """Run every config, one after another, in one group of ``world_size`` spawned processes
    (one spawn amortises the torch import). Returns ``results[config][rank]``."""
    workdir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(world_size, str(workdir), configs), nprocs=world_size, join=True)
    per_rank = [torch.load(workdir / f"rank{r}.pt", weights_only=True)
                for r in range(world_size)]
    return [[per_rank[r][i] for r in range(world_size)] for i in range(len(configs))]
