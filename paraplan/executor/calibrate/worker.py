"""What one calibration rank measures (started by ``launch`` on every rank at once)."""

from __future__ import annotations

import statistics
import time

from paraplan.executor.calibrate.fit import ATTENTION_SHAPES, COMM_BURST, ELEMENTWISE_SHAPES
from paraplan.executor.calibrate.kernels import (
    attention_seconds,
    comm_op,
    elementwise_seconds,
    gemm_seconds,
    median_time,
)


def calibration_worker(rank: int, world_size: int, config: dict) -> dict:
    """One rank of ``calibrate``: GEMM grid, memory copy and collectives (see module doc).
    Returns per-rank medians in seconds."""
    import torch
    import torch.distributed as dist

    out: dict = {"rank": rank, "threads": torch.get_num_threads(), "gemm": [], "comm": []}
    sizes = config["gemm_sizes"]
    for m in sizes:
        for n in sizes:
            for k in sizes:
                dist.barrier()  # every rank multiplies at the same time
                out["gemm"].append({"m": m, "n": n, "k": k, "seconds": gemm_seconds(
                    m, n, k, config["gemm_repeats"])})
    src = torch.ones(config["mem_bytes"] // 4)
    dst = torch.empty_like(src)
    dist.barrier()
    out["memory_seconds"] = median_time(lambda: dst.copy_(src), config["mem_repeats"])
    src = dst = None  # free them before the collectives
    out["attention"] = []
    for b, heads, s, d in ATTENTION_SHAPES:
        dist.barrier()
        fwd, bwd = attention_seconds(b, heads, s, d, config["gemm_repeats"])
        out["attention"].append({"b": b, "heads": heads, "s": s, "d": d,
                                 "forward_seconds": fwd, "backward_seconds": bwd})
    out["elementwise"] = []
    for tokens, hidden, ffn in ELEMENTWISE_SHAPES:
        dist.barrier()
        out["elementwise"].append({"tokens": tokens, "hidden": hidden, "ffn": ffn,
                                   "seconds": elementwise_seconds(tokens, hidden, ffn,
                                                                  config["gemm_repeats"])})
    # Collectives are timed one call at a time, each right after a burst of GEMMs that every
    # rank starts together (a barrier, then the burst): that is how training issues them,
    # between layers' compute with caches, sockets and gloo's threads cold. A call issued
    # straight after a barrier finds gloo's threads awake and takes ~0.3-0.5 ms less than in
    # training, and one in a back-to-back loop up to 2x less. The small compute jitter of the
    # burst (~0.1 ms between two ranks) is counted too, as it is in training. The MEAN over
    # the trials is kept, not the median: a step adds up its collectives, so their expected
    # time is what predicts it, and gloo on a busy core has a heavy tail (a 1 MiB
    # all-reduce: median ~1 ms, mean ~2 ms, worst ~8 ms when its thread waits for a core),
    # which the median would drop. Buffers are fresh on every call (``comm_op``): a reused
    # buffer stays in cache and runs ~0.4 ms faster per MiB than training's new tensors.
    a, b = torch.ones(COMM_BURST, COMM_BURST), torch.ones(COMM_BURST, COMM_BURST)
    for kind in config["kinds"] if world_size > 1 else ():
        for nbytes in config["comm_sizes"]:
            elems = max(world_size, nbytes // 4 // world_size * world_size)
            ready = comm_op(kind, elems, rank, world_size)
            if ready is not None:
                ready()()  # warm-up: connections and buffers
            trials = []
            for _ in range(config["comm_trials"]):
                op = ready() if ready is not None else None
                dist.barrier()
                torch.mm(a, b)
                start = time.perf_counter()
                if op is not None:
                    op()
                trials.append(time.perf_counter() - start)
            if ready is not None:
                per_op = statistics.fmean(trials) / (2 if kind == "p2p" else 1)
                out["comm"].append({"kind": kind, "bytes": 4 * elems, "seconds": per_op})
    return out
