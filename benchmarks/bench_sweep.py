"""Sweep throughput: jobs per second of one grid run serially and on Ray (local, in-process on
this machine's cores), from one run each; ratios are what to compare.

Run: python benchmarks/bench_sweep.py [--workers N] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

from paraplan.fleet import ResultStore, expand, parse_grid, ray_available, run_sweep

GRID = {
    "models": ["llama3-8b", "llama3-70b", "mixtral-8x7b"],
    "clusters": [{"cluster": "dgx-h100", "nodes": [4, 8, 16, 32]},
                 {"cluster": "dgx-a100-80gb", "nodes": [8, 16]}],
    "global_batches": [512, 1024],
    "seq_lens": [4096, 8192],
    "trainers": ["megatron-core"],
    "top": 3,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=None, help="Ray workers (default: cores)")
    ap.add_argument("--jobs", type=int, default=None, help="only the first N jobs")
    args = ap.parse_args()
    jobs = expand(parse_grid(GRID))[: args.jobs]
    cores = len(os.sched_getaffinity(0))
    print(f"{len(jobs)} jobs (llama3-8b / llama3-70b / mixtral-8x7b on 32-256 H100 and "
          f"64-128 A100, 2 batches x 2 sequences, megatron-core); {cores} cores, "
          f"{platform.processor() or platform.machine()}")
    results = {}
    for backend in ("serial", "ray"):
        if backend == "ray" and not ray_available():
            print("ray: not installed (pip install 'paraplan[fleet]')")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            store = ResultStore(os.path.join(tmp, "r.csv"), jobs, resume=False)
            start = time.perf_counter()
            summary = run_sweep(jobs, store, backend=backend,
                                workers=args.workers if backend == "ray" else None)
            wall = time.perf_counter() - start
        results[backend] = wall
        print(f"{backend:6s} workers={summary.workers}: {wall:7.1f} s, "
              f"{len(jobs) / wall:6.2f} jobs/s, {summary.failed} failed")
    if len(results) == 2:
        print(f"ray / serial speed-up: {results['serial'] / results['ray']:.2f}x")


if __name__ == "__main__":
    main()
