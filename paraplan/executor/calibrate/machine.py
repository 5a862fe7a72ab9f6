"""This machine's CPU, cores and memory, and ``calibrate()``: start the ranks, gather and fit their
measurements."""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from paraplan.executor.calibrate.fit import COLLECTIVE_KINDS, FULL, QUICK, fit_all
from paraplan.executor.calibrate.kernels import attention_flops, elementwise_bytes, gemm_seconds
from paraplan.executor.calibrate.worker import calibration_worker
from paraplan.executor.launch import launch


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    try:  # cgroup v2 CPU quota ("max 100000" or "200000 100000")
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def _memory_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
            if text.isdigit():
                total = min(total, int(text))
        except OSError:
            pass
    return int(total)


def calibrate(*, quick: bool = False, nproc: int = 2, threads: int = 1,
              timeout_s: float = 600, progress: Callable[[str], None] | None = None) -> dict:
    """Measure this machine for ``nproc`` executor ranks of ``threads`` torch threads each.

    Returns a JSON-ready measurement dict (seconds, bytes, bytes/s) for
    ``calibration_cluster_yaml``. ``quick`` uses fewer sizes and repeats (under a minute on
    2 cores). Raises ``ExecutorError`` if the measuring ranks fail.
    """
    import torch

    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    cfg = dict(QUICK if quick else FULL, kinds=list(COLLECTIVE_KINDS), num_threads=threads)
    cores = _cores()
    per_rank = max(1, cores // nproc)
    solo = []
    saved = torch.get_num_threads()
    try:
        for t in sorted({1, per_rank}):
            say(f"GEMM alone in this process, {t} thread(s)")
            torch.set_num_threads(t)
            for s in cfg["gemm_sizes"]:
                sec = gemm_seconds(s, s, s, cfg["gemm_repeats"])
                solo.append({"m": s, "n": s, "k": s, "threads": t, "seconds": sec,
                             "tflops": 2.0 * s**3 / sec / 1e12})
    finally:
        torch.set_num_threads(saved)
    say(f"{nproc} gloo ranks x {threads} thread(s): GEMM grid, memory copy, collectives")
    ranks = launch(calibration_worker, nproc, cfg, timeout_s=timeout_s, backend="gloo",
                   num_threads=threads)
    gemm = []
    for i, cell in enumerate(ranks[0]["gemm"]):
        sec = statistics.median(r["gemm"][i]["seconds"] for r in ranks)
        gemm.append({**{k: cell[k] for k in "mnk"}, "seconds": sec,
                     "tflops": 2.0 * cell["m"] * cell["n"] * cell["k"] / sec / 1e12})
    mem_s = statistics.median(r["memory_seconds"] for r in ranks)
    attention = []
    for i, shape in enumerate(ranks[0]["attention"]):
        fwd = statistics.median(r["attention"][i]["forward_seconds"] for r in ranks)
        bwd = statistics.median(r["attention"][i]["backward_seconds"] for r in ranks)
        f_flops, b_flops = attention_flops(shape["b"], shape["heads"], shape["s"], shape["d"])
        attention.append({**{k: shape[k] for k in ("b", "heads", "s", "d")},
                          "forward_seconds": fwd, "backward_seconds": bwd,
                          "forward_tflops": f_flops / fwd / 1e12,
                          "backward_tflops": b_flops / bwd / 1e12})
    elementwise = []
    for i, shape in enumerate(ranks[0]["elementwise"]):
        sec = statistics.median(r["elementwise"][i]["seconds"] for r in ranks)
        nbytes = elementwise_bytes(shape["tokens"], shape["hidden"], shape["ffn"])
        elementwise.append({**{k: shape[k] for k in ("tokens", "hidden", "ffn")},
                            "seconds": sec, "bytes_counted": nbytes,
                            "bandwidth_Bps": nbytes / sec})
    samples: dict[tuple[str, int], float] = {}
    for r in ranks:
        for c in r["comm"]:
            key = (c["kind"], c["bytes"])
            samples[key] = max(samples.get(key, 0.0), c["seconds"])  # the slowest rank
    comm = [{"kind": k, "bytes": b, "seconds": s} for (k, b), s in samples.items()]
    fits = fit_all(comm, nproc)
    return {
        "version": 1, "quick": quick, "nproc": nproc, "threads_per_rank": threads,
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu_name(), "cores": cores, "memory_bytes": _memory_bytes(),
                    "platform": platform.platform(), "torch": torch.__version__},
        "gemm": {"dtype": "fp32", "concurrent_ranks": nproc, "cells": gemm},
        "gemm_solo": solo,
        "memory": {"bytes_moved": 2 * cfg["mem_bytes"], "seconds": mem_s,
                   "bandwidth_Bps": 2 * cfg["mem_bytes"] / mem_s},
        "attention": attention, "elementwise": elementwise,
        "collectives": {"world_size": nproc, "samples": comm, "fits": fits},
        "elapsed_s": time.perf_counter() - started,
    }
