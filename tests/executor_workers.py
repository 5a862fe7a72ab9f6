"""Worker functions for tests/test_executor_launch.py (launched workers import them by name).

Run as ``torchrun --nproc-per-node 2 -m tests.executor_workers`` it exercises
``run_under_torchrun`` and prints rank 0's gathered results as JSON.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist


def all_reduce_worker(rank: int, world_size: int, config: dict) -> dict:
    """All-reduce ``rank + 1`` (sum) and report what this rank saw."""
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    return {"rank": rank, "world_size": world_size, "sum": x.tolist(), "pid": os.getpid(),
            "threads": torch.get_num_threads(), "tag": config.get("tag"),
            "malloc_env": {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_",
                                                          "MALLOC_TRIM_THRESHOLD_")}}


def _publish_pid(rank: int, config: dict) -> None:
    if config.get("pid_dir"):
        path = os.path.join(config["pid_dir"], f"{rank}.pid")
        with open(path + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(path + ".tmp", path)


def raise_on_rank_worker(rank: int, world_size: int, config: dict) -> dict:
    """The rank ``config["bad"]`` raises ValueError("boom"); the others wait in a barrier."""
    _publish_pid(rank, config)
    if rank == config["bad"]:
        time.sleep(0.3)
        raise ValueError("boom")
    dist.barrier()
    return {"rank": rank}


def hang_worker(rank: int, world_size: int, config: dict) -> dict:
    """Ranks 0 and 1 deadlock (each receives from the other); other ranks return."""
    _publish_pid(rank, config)
    if rank < 2:
        buf = torch.zeros(1)
        dist.recv(buf, src=1 - rank)
    return {"rank": rank}


def hard_exit_worker(rank: int, world_size: int, config: dict) -> dict:
    """The rank ``config["bad"]`` calls ``os._exit(3)``; the others wait in a barrier."""
    _publish_pid(rank, config)
    if rank == config["bad"]:
        print("about to exit hard", flush=True)
        os._exit(3)
    dist.barrier()
    return {"rank": rank}


if __name__ == "__main__":
    from paraplan.executor.launch import run_under_torchrun

    out = run_under_torchrun(all_reduce_worker, {"tag": "torchrun"}, gather=True)
    if out is not None:
        print("RESULT " + json.dumps(out))
